//! `KILN_CHECK_ARGS=1 kiln <subcommand> …`: parse the flags and env vars exactly as the real
//! run would (clap's errors and exit code 2 on a bad value), then print what the subcommand
//! reads instead of running it. Tests use it to hold rendered DaemonSets to the agents' CLI.

use clap::CommandFactory as _;

/// The env var that turns a run into an argument check.
pub const CHECK_ARGS_ENV: &str = "KILN_CHECK_ARGS";

/// What `kiln` would run: the subcommand path and every env var it reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgsReport {
    /// Subcommand names from the top, e.g. `["device-plugin", "config-manager"]`.
    pub command: Vec<String>,
    /// Env var names read by the arguments of the commands on that path, sorted. A parent's
    /// arguments count unless it conflicts with its subcommands (then they are not parsed).
    pub env: Vec<String>,
}

/// The report for `args` (without the program name): subcommands are the words that name one
/// of the current command's subcommands, in order.
#[must_use]
pub fn report(args: &[String]) -> ArgsReport {
    let root = super::Cli::command();
    let mut path = vec![&root];
    let mut command = Vec::new();
    for a in args.iter().filter(|a| !a.starts_with('-')) {
        let cur = path[path.len() - 1];
        if let Some(sub) = cur.find_subcommand(a) {
            command.push(sub.get_name().to_owned());
            path.push(sub);
        }
    }
    let mut env: Vec<String> = Vec::new();
    for (i, cmd) in path.iter().enumerate() {
        let leaf = i + 1 == path.len();
        if !leaf && cmd.is_args_conflicts_with_subcommands_set() {
            continue;
        }
        env.extend(
            cmd.get_arguments()
                .filter_map(|a| a.get_env())
                .map(|e| e.to_string_lossy().into_owned()),
        );
    }
    env.sort();
    env.dedup();
    ArgsReport { command, env }
}

impl ArgsReport {
    /// `{"command": [...], "env": [...]}`.
    #[must_use]
    pub fn to_json(&self) -> String {
        serde_json::json!({"command": self.command, "env": self.env}).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn subcommand_path_and_env_of_nested_commands() {
        let r = report(&words("device-plugin config-manager --oneshot"));
        assert_eq!(r.command, ["device-plugin", "config-manager"]);
        assert!(r.env.iter().any(|e| e == "CONFIG_FILE_DST"));
        // The plugin's own flags are not parsed with a subcommand.
        assert!(!r.env.iter().any(|e| e == "CONFIG_FILE"));
        let r = report(&words("device-plugin"));
        assert!(r.env.iter().any(|e| e == "CONFIG_FILE"));
        assert!(r.env.iter().any(|e| e == "MIG_STRATEGY"));
        // Global flags of the parent count for the step.
        let r = report(&words("validator --retries 3 wait --for toolkit-ready"));
        assert_eq!(r.command, ["validator", "wait"]);
        assert!(r.env.iter().any(|e| e == "SLEEP_INTERVAL_SECONDS"));
        let r = report(&words("gfd"));
        assert!(r.env.iter().any(|e| e == "MIG_STRATEGY"));
        assert!(r.env.iter().any(|e| e == "GFD_MIG_STRATEGY"));
    }
}

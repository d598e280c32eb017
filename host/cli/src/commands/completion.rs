//! `kiln completion <shell>`: a shell completion script for every subcommand and flag.

use std::process::ExitCode;

use clap::{Args, CommandFactory as _};
use clap_complete::Shell;

/// Print a completion script for SHELL on stdout, e.g. `source <(kiln completion bash)`, or
/// `kiln completion zsh > "${fpath[1]}/_kiln"`.
#[derive(Debug, Args)]
pub struct CompletionArgs {
    /// The shell: bash, elvish, fish, powershell or zsh.
    shell: Shell,
}

impl CompletionArgs {
    /// Print the script.
    pub fn run(self) -> anyhow::Result<ExitCode> {
        let mut script = Vec::new();
        clap_complete::generate(self.shell, &mut super::Cli::command(), "kiln", &mut script);
        super::write_stdout(&String::from_utf8(script)?)?;
        Ok(ExitCode::SUCCESS)
    }
}

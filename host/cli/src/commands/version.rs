//! `kiln version`: the version, git commit and image this binary was built as.

use std::process::ExitCode;

use clap::{Args, ValueEnum};

/// The crate version (the workspace version, which is also the image tag and the chart's
/// `appVersion`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git commit the binary was built from (full hash), or `unknown` (see `build.rs`).
pub const COMMIT: &str = env!("KILN_GIT_COMMIT");

/// What `kiln --version` prints after the name: `0.1.0 (commit <full hash>)`.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("KILN_GIT_COMMIT"),
    ")"
);

/// One field of the report.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum Field {
    /// The version (`0.1.0`).
    Version,
    /// The git commit.
    Commit,
    /// kiln's image reference (`ghcr.io/kiln-dev/kiln:0.1.0`).
    Image,
    /// The source repository URL (the OCI `source` label).
    Source,
}

/// Print the version, git commit, image reference and source repository, one `key: value`
/// line each (the first line is `kiln <version>`).
#[derive(Debug, Args)]
pub struct VersionArgs {
    /// Print only this field's value (for scripts: `scripts/build-image.sh` tags and labels
    /// the image with them).
    #[arg(long, value_enum, value_name = "FIELD")]
    only: Option<Field>,
}

impl VersionArgs {
    /// Print the report (or one field).
    pub fn run(self) -> anyhow::Result<ExitCode> {
        let text = match self.only {
            Some(f) => format!("{}\n", value(f)),
            None => format!(
                "kiln {VERSION}\ncommit: {COMMIT}\nimage: {}\nsource: {}\n",
                value(Field::Image),
                value(Field::Source)
            ),
        };
        super::write_stdout(&text)?;
        Ok(ExitCode::SUCCESS)
    }
}

fn value(f: Field) -> &'static str {
    match f {
        Field::Version => VERSION,
        Field::Commit => COMMIT,
        Field::Image => kiln_render::defaults::KILN_IMAGE,
        Field::Source => env!("CARGO_PKG_REPOSITORY"),
    }
}

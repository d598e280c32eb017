//! `kiln`: one binary, one subcommand per job.

mod commands;

use std::io::IsTerminal as _;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = commands::Cli::parse();
    // `KILN_LOG` overrides the subcommand's default level; colours only on a terminal (pod
    // logs and files get plain text).
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("KILN_LOG")
                .unwrap_or_else(|_| cli.default_log_filter().into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    cli.run()
}

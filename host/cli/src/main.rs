//! `kiln`: one binary, one subcommand per job.

mod alloc;
mod commands;

kiln_operator::global_allocator!();

use std::io::IsTerminal as _;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = commands::Cli::parse();
    // `KILN_LOG` overrides the subcommand's default level; `--log-format` (`KILN_LOG_FORMAT`)
    // picks text or JSON lines. Colours only on a terminal (pod logs and files get plain text).
    let filter = tracing_subscriber::EnvFilter::try_from_env("KILN_LOG")
        .unwrap_or_else(|_| cli.default_log_filter().into());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match cli.log_format {
        commands::LogFormat::Text => logs.with_ansi(std::io::stderr().is_terminal()).init(),
        commands::LogFormat::Json => logs
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .init(),
    }
    let profile = cli.allocator_profile();
    match alloc::settle(profile) {
        Ok(()) => tracing::debug!(
            ?profile,
            background_thread = ?alloc::background_thread(),
            "allocator settled"
        ),
        Err(errno) => {
            tracing::warn!(errno, ?profile, "jemalloc refused the allocator settings");
        }
    }
    cli.run()
}

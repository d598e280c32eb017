//! `kiln plugin …`: tools for plugin authors.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;

/// Plugin tools.
#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Report a plugin's name, sha256, exports and imports, and whether the host accepts it.
    /// Exits 1 when it would be refused.
    Check {
        /// The component (`.wasm`).
        file: PathBuf,
    },
    /// List the bundled plugins with their sha256 (what a pin must say).
    List,
}

impl PluginCommand {
    /// Run it.
    pub fn run(self) -> anyhow::Result<ExitCode> {
        match self {
            PluginCommand::Check { file } => check(&file),
            PluginCommand::List => {
                for (name, bytes) in kiln_bundled_plugins::BUNDLED {
                    println!(
                        "{name}\t{}\t{} bytes",
                        kiln_plugin_host::sha256_hex(bytes),
                        bytes.len()
                    );
                }
                Ok(ExitCode::SUCCESS)
            }
        }
    }
}

fn check(file: &PathBuf) -> anyhow::Result<ExitCode> {
    let bytes = std::fs::read(file).with_context(|| format!("{}: cannot read", file.display()))?;
    if !bytes.starts_with(b"\0asm") {
        anyhow::bail!(
            "{}: not a WebAssembly file (no \\0asm header)",
            file.display()
        );
    }
    let report = kiln_plugin_host::inspect(&bytes).with_context(|| file.display().to_string())?;
    println!("file:    {}", file.display());
    println!("name:    {}", report.name.as_deref().unwrap_or("(unknown)"));
    println!("sha256:  {}", report.sha256);
    println!("exports:");
    for e in &report.exports {
        println!("  {e}");
    }
    println!("imports:");
    for i in &report.imports {
        let mark = if kiln_plugin_host::is_allowed_import(i) {
            "allowed"
        } else {
            "FORBIDDEN"
        };
        println!("  {i} ({mark})");
    }
    let stem = file
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or_default();
    if let Some(name) = report.name.as_deref().filter(|n| *n != stem) {
        println!(
            "warning: the file is {stem:?} but the component calls itself {name:?}; install it as {name}.wasm"
        );
    }
    match &report.refusal {
        None => {
            println!("verdict: accepted");
            Ok(ExitCode::SUCCESS)
        }
        Some(why) => {
            println!("verdict: refused: {why}");
            Ok(ExitCode::FAILURE)
        }
    }
}

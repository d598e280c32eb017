#!/usr/bin/env bash
# Runs kiln's whole test suite on a fresh machine: installs the wasm target, builds the
# testcluster control plane (cached), then runs every Rust test (the Wasm plugins are built by
# kiln-bundled-plugins' build script).
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*"; }

say "rust: $(rustc --version)"
if ! rustup target list --installed | grep -qx wasm32-wasip2; then
  say "installing the wasm32-wasip2 target"
  rustup target add wasm32-wasip2
fi
rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy

if [ -x testcluster/build.sh ]; then
  say "building testcluster (cached)"
  testcluster/build.sh
fi

say "checking formatting"
cargo fmt --all -- --check

say "linting (clippy, warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

say "running the tests"
cargo test --workspace --locked "$@"

# The plugin SDK is published on its own: its package must build from crates.io alone (the
# verify step compiles the packaged crate; its dependencies are already built).
say "packaging the plugin SDK (cargo package -p kiln-plugin-sdk)"
cargo package -p kiln-plugin-sdk --locked --allow-dirty --quiet

# Benchmarks do not run in CI (they measure), but they must keep compiling.
say "compiling the benchmarks (dev profile, not run)"
cargo build --workspace --locked --bench '*'
say "done"

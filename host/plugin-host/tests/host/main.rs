//! Integration tests of the plugin host (one test binary for the crate).

mod budgets;
mod common;
mod good;
mod hostile;
mod integrity;
mod loading;
mod policy;
mod settings;

//! Integration tests of the plugin host (one test binary for the crate).

mod common;
mod good;
mod hostile;
mod loading;

//! Device-plugin benchmark (filled in below).
fn main() {}

//! A well-behaved plugin for the host's tests. It uses `std` (env, stdout, stderr, exit, panic)
//! and serde_json, so its imports are what an ordinary std guest imports.
//!
//! Behaviour, chosen by `spec.mode`:
//! - absent: every object gets label `kiln.test/seen=<ctx.state>`, except a ConfigMap named
//!   `drop-me`, which is omitted; logs one line per level, prints to stdout and stderr, and logs
//!   what it can see of the environment.
//! - `refuse`: returns `invalid-field` for `spec.mode`.
//! - `exit`: calls `std::process::exit(3)`.
//! - `panic`: panics.
//! - `chatty`: prints `spec.lines` lines of 100 bytes to stdout.
//! - `count-mismatch`: returns no outcome at all.

wit_bindgen::generate!({
    world: "operand-transform",
    path: "../../../../../wit",
});

use kiln::operand::types::FieldError;
use serde_json::{Value, json};

/// The plugin's name.
const NAME: &str = "good";

struct Good;

impl Guest for Good {
    fn name() -> String {
        NAME.to_string()
    }

    fn transform(objects: Vec<String>, spec: String, ctx: Context) -> Result<Vec<Outcome>, TransformError> {
        let spec: Value = serde_json::from_str(&spec).map_err(|e| TransformError::Failed(e.to_string()))?;
        match spec.get("mode").and_then(Value::as_str) {
            Some("refuse") => {
                return Err(TransformError::InvalidField(FieldError {
                    path: "spec.mode".into(),
                    message: "refused on request".into(),
                }));
            }
            Some("exit") => std::process::exit(3),
            Some("panic") => panic!("guest panicked on request"),
            Some("chatty") => {
                let lines = spec.get("lines").and_then(Value::as_u64).unwrap_or(0);
                for i in 0..lines {
                    println!("{i:099}");
                }
            }
            Some("count-mismatch") => return Ok(Vec::new()),
            _ => {}
        }
        log(LogLevel::Debug, "debug line");
        log(LogLevel::Info, &format!("state {} with {} objects", ctx.state, objects.len()));
        log(LogLevel::Warn, "warn line");
        println!("hello from stdout");
        eprintln!("hello from stderr");
        let env = std::env::vars().count();
        let args = std::env::args().count();
        log(LogLevel::Info, &format!("env vars: {env}, args: {args}"));
        objects
            .iter()
            .map(|text| {
                let object: Value = serde_json::from_str(text).map_err(|e| TransformError::InvalidObject(e.to_string()))?;
                let omit = object["kind"] == "ConfigMap" && object["metadata"]["name"] == "drop-me";
                if omit {
                    return Ok(Outcome::Omit);
                }
                let has_labels = object["metadata"].get("labels").is_some();
                let patch = if has_labels {
                    json!([{"op": "add", "path": "/metadata/labels/kiln.test~1seen", "value": ctx.state}])
                } else {
                    json!([{"op": "add", "path": "/metadata/labels", "value": {"kiln.test/seen": ctx.state}}])
                };
                Ok(Outcome::Patch(patch.to_string()))
            })
            .collect()
    }
}

export!(Good);

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
//! - `virtual-wasi`: reads the wall clock, sleeps an hour on the monotonic clock, draws a
//!   random hash key, lists `/` and connects to 127.0.0.1:80, and labels every object with what
//!   it saw (`kiln.test/wall`, `/slept`, `/random`, `/files`, `/net`).
//!
//! It implements `kiln:operand@0.2.0` with `validate-settings`: settings with a `reject` key are
//! refused (field `reject`), and a string `settings.label` is added as label
//! `kiln.test/setting`. It logs the policy's name and annotation keys.
//! (`tests/fixtures/good-0.1.0.wasm` is this guest as it was built against `kiln:operand@0.1.0`,
//! before settings: it labels and omits the same way.)

wit_bindgen::generate!({
    world: "operand-transform-validated",
    path: "../../../../../wit",
});


use serde_json::{Value, json};

/// The plugin's name.
const NAME: &str = "good";

struct Good;

impl Guest for Good {
    fn name() -> String {
        NAME.to_string()
    }

    fn validate_settings(plugin: String, settings: String) -> Result<(), Vec<FieldError>> {
        let settings: Value = serde_json::from_str(&settings).map_err(|e| {
            vec![FieldError {
                path: String::new(),
                message: e.to_string(),
            }]
        })?;
        if plugin != NAME {
            return Err(vec![FieldError {
                path: String::new(),
                message: format!("asked for plugin {plugin:?}"),
            }]);
        }
        if settings.get("reject").is_some() {
            return Err(vec![FieldError {
                path: "reject".into(),
                message: "refused on request".into(),
            }]);
        }
        Ok(())
    }

    fn transform(objects: Vec<String>, spec: String, settings: String, ctx: Context) -> Result<Vec<Outcome>, TransformError> {
        let settings: Value = serde_json::from_str(&settings).map_err(|e| TransformError::Failed(e.to_string()))?;
        let label = settings.get("label").and_then(Value::as_str).map(str::to_string);
        let keys: Vec<&str> = ctx.policy_annotations.iter().map(|a| a.key.as_str()).collect();
        log(LogLevel::Info, &format!("policy {:?} annotations {keys:?}", ctx.policy_name));
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
            Some("virtual-wasi") => return Ok(virtual_wasi(objects.len())),
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
                let mut patch = if has_labels {
                    json!([{"op": "add", "path": "/metadata/labels/kiln.test~1seen", "value": ctx.state}])
                } else {
                    json!([{"op": "add", "path": "/metadata/labels", "value": {"kiln.test/seen": ctx.state}}])
                };
                if let (Some(label), Some(ops)) = (&label, patch.as_array_mut()) {
                    ops.push(json!({"op": "add", "path": "/metadata/labels/kiln.test~1setting", "value": label}));
                }
                Ok(Outcome::Patch(patch.to_string()))
            })
            .collect()
    }
}

/// What the guest sees of clocks, randomness, files and the network, as one patch per object.
fn virtual_wasi(objects: usize) -> Vec<Outcome> {
    use std::hash::BuildHasher as _;
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or_else(|e| format!("before the epoch: {e}"), |d| d.as_nanos().to_string());
    let start = std::time::Instant::now();
    std::thread::sleep(std::time::Duration::from_secs(3600));
    let slept = start.elapsed().as_secs().to_string();
    let random = std::collections::hash_map::RandomState::new().hash_one(0u8).to_string();
    let files = match std::fs::read_dir("/") {
        Ok(entries) => format!("{} entries", entries.count()),
        Err(e) => format!("{:?}", e.kind()),
    };
    let net = match std::net::TcpStream::connect("127.0.0.1:80") {
        Ok(_) => "connected".to_string(),
        Err(e) => format!("{:?}", e.kind()),
    };
    let labels = json!({
        "kiln.test/wall": wall,
        "kiln.test/slept": slept,
        "kiln.test/random": random,
        "kiln.test/files": files,
        "kiln.test/net": net,
    });
    let patch = json!([{"op": "add", "path": "/metadata/labels", "value": labels}]).to_string();
    (0..objects).map(|_| Outcome::Patch(patch.clone())).collect()
}

export!(Good);

//! @NAME@: a kiln operand plugin (`kiln:operand@0.2.0`, `wit/operand.wit`).
//!
//! It adds the labels its settings name to every object of the state:
//!
//! ```yaml
//! kiln.dev/plugins: |
//!   device-plugin:
//!     then:
//!       - name: @NAME@
//!         settings: {labels: {team: gpu}}
//! ```
//!
//! Edit `transform` (and `validate_settings`) to do what your site needs; `cases/` holds the
//! case files `kiln plugin test @NAME@.wasm cases` runs.

wit_bindgen::generate!({
    world: "operand-transform-validated",
    path: "wit",
});

use serde_json::{Map, Value, json};

/// The name the plugin is installed and named by (`@NAME@.wasm`).
const NAME: &str = "@NAME@";

struct Plugin;

/// The settings' `labels`: a map of strings (none when the settings are `null`).
fn labels(settings: &str) -> Result<Map<String, Value>, Vec<FieldError>> {
    let field = |path: &str, message: String| {
        vec![FieldError {
            path: path.into(),
            message,
        }]
    };
    let settings: Value = serde_json::from_str(settings).map_err(|e| field("", e.to_string()))?;
    let labels = match settings.get("labels") {
        None | Some(Value::Null) => return Ok(Map::new()),
        Some(Value::Object(map)) => map.clone(),
        Some(other) => return Err(field("labels", format!("expected a map, got {other}"))),
    };
    for (key, value) in &labels {
        if !value.is_string() {
            return Err(field(&format!("labels.{key}"), format!("expected a string, got {value}")));
        }
    }
    Ok(labels)
}

impl Guest for Plugin {
    fn name() -> String {
        NAME.to_string()
    }

    fn validate_settings(_plugin: String, settings: String) -> Result<(), Vec<FieldError>> {
        labels(&settings).map(|_| ())
    }

    fn transform(
        objects: Vec<String>,
        _spec: String,
        settings: String,
        ctx: Context,
    ) -> Result<Vec<Outcome>, TransformError> {
        let labels = labels(&settings).map_err(|mut e| {
            let e = e.remove(0);
            TransformError::InvalidField(FieldError {
                path: format!("settings.{}", e.path),
                message: e.message,
            })
        })?;
        log(LogLevel::Info, &format!("{} objects of state {}", objects.len(), ctx.state));
        objects
            .iter()
            .map(|text| {
                let object: Value =
                    serde_json::from_str(text).map_err(|e| TransformError::InvalidObject(e.to_string()))?;
                let mut ops = Vec::new();
                if object["metadata"].get("labels").is_none() && !labels.is_empty() {
                    ops.push(json!({"op": "add", "path": "/metadata/labels", "value": {}}));
                }
                for (key, value) in &labels {
                    let key = key.replace('~', "~0").replace('/', "~1");
                    ops.push(json!({"op": "add", "path": format!("/metadata/labels/{key}"), "value": value}));
                }
                Ok(Outcome::Patch(Value::Array(ops).to_string()))
            })
            .collect()
    }
}

export!(Plugin);

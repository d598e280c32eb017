//! Site plugins with settings (`kiln:operand@0.2.0`): [`Plugin`], run by
//! [`export_plugin_with_settings!`](crate::export_plugin_with_settings) or carried by a
//! standard bundle.
//!
//! A chain entry of the `kiln.dev/plugins` annotation may give its plugin `settings` (any YAML);
//! the host hands them over as JSON text. The SDK parses them into [`Plugin::Settings`] (a
//! field that does not parse is named by its path, e.g. `tolerations[0].effect`), asks
//! [`Plugin::validate`], and runs [`Plugin::edit`] on every object with a [`Call`].

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::{Context, Decision, Outcome, TransformError};

/// A settings field a plugin refuses: its path below the settings (`nodeSelector.pool`,
/// `tolerations[0].effect`; empty for the whole value) and why. The host reports it as
/// `settings.<path>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Path below the settings.
    pub path: String,
    /// Why.
    pub message: String,
}

impl FieldError {
    /// A field error.
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError {
            path: path.into(),
            message: message.into(),
        }
    }
}

/// What one call of a [`Plugin`] sees besides the object it edits.
#[derive(Debug)]
pub struct Call<'a, S> {
    /// The chain entry's settings (`S::default()` when it gives none).
    pub settings: &'a S,
    /// The ClusterPolicy spec, as JSON.
    pub spec: &'a Value,
    /// The cluster facts (`ctx.state` is the state being rendered; the policy's name and
    /// annotations are there too).
    pub ctx: &'a Context,
}

/// A site plugin configured by settings.
pub trait Plugin {
    /// The plugin's name (its file name without `.wasm`, or its bundled name).
    const NAME: &'static str;
    /// Its settings; `null` (no settings) parses as `Default::default()`.
    type Settings: DeserializeOwned + Default;

    /// Checks parsed settings; every refused field (default: none).
    fn validate(settings: &Self::Settings) -> Vec<FieldError> {
        let _ = settings;
        Vec::new()
    }

    /// Edits (or omits) one object of the state.
    ///
    /// # Errors
    /// A [`TransformError`] fails the whole call.
    fn edit(obj: &mut Value, call: &Call<'_, Self::Settings>) -> Result<Decision, TransformError>;
}

/// Parses settings JSON text (`null`: the default) into `S`.
///
/// # Errors
/// The field that does not parse, by path (`tolerations[0].effect`), and why.
pub fn parse_settings<S: DeserializeOwned + Default>(text: &str) -> Result<S, FieldError> {
    if text.trim() == "null" {
        return Ok(S::default());
    }
    let mut de = serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let path = if path == "." { String::new() } else { path };
        FieldError::new(path, e.into_inner().to_string())
    })
}

/// What `validate-settings` answers for plugin `P` and settings text `text`: every refused
/// field, empty when they are accepted.
pub fn validate_plugin<P: Plugin>(text: &str) -> Vec<FieldError> {
    match parse_settings::<P::Settings>(text) {
        Ok(settings) => P::validate(&settings),
        Err(e) => vec![e],
    }
}

/// Runs plugin `P` over a state's objects: parses the spec and settings, then calls
/// [`Plugin::edit`] on each object and answers with a `json_patch::diff` per object.
///
/// # Errors
/// Settings that do not parse or validate (`InvalidField` at `settings.<path>`), a spec or
/// object that does not parse, or whatever `edit` returns.
pub fn run_plugin<P: Plugin>(
    objects: &[String],
    spec_json: &str,
    settings_json: &str,
    ctx: &Context,
) -> Result<Vec<Outcome>, TransformError> {
    let settings = parse_settings::<P::Settings>(settings_json).map_err(settings_error)?;
    if let Some(e) = P::validate(&settings).into_iter().next() {
        return Err(settings_error(e));
    }
    crate::transform_each(objects, spec_json, ctx, |obj, spec, ctx| {
        P::edit(
            obj,
            &Call {
                settings: &settings,
                spec,
                ctx,
            },
        )
    })
}

/// A settings field error as a transform error (`settings.<path>`).
fn settings_error(e: FieldError) -> TransformError {
    let path = match e.path.as_str() {
        "" => "settings".to_string(),
        p if p.starts_with('[') => format!("settings{p}"),
        p => format!("settings.{p}"),
    };
    TransformError::field(path, e.message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct S {
        #[serde(default)]
        pool: Option<String>,
        #[serde(default)]
        list: Vec<u32>,
    }

    #[test]
    fn settings_errors_name_the_field() {
        assert!(parse_settings::<S>("null").unwrap().pool.is_none());
        assert_eq!(
            parse_settings::<S>(r#"{"list":[1,2]}"#).unwrap().list,
            [1, 2]
        );
        assert_eq!(
            parse_settings::<S>(r#"{"pool":"a"}"#)
                .unwrap()
                .pool
                .as_deref(),
            Some("a")
        );
        let e = parse_settings::<S>(r#"{"list":[1,"x"]}"#).unwrap_err();
        assert_eq!(e.path, "list[1]");
        let e = parse_settings::<S>(r#"{"pol":1}"#).unwrap_err();
        assert!(e.message.contains("unknown field `pol`"), "{e:?}");
        assert_eq!(
            settings_error(FieldError::new("list[1]", "m")).to_string(),
            "settings.list[1]: m"
        );
    }
}

//! The one YAML/JSON loader of every document kiln takes from a file or flag: ClusterPolicy
//! files (`kiln render`), agent configs, GPU fixtures.
//!
//! ```text
//! text ──► ≤ MAX_TEXT_BYTES ──► serde-saphyr (one pass: depth budget, duplicate keys refused,
//!          merge keys, YAML 1.1 scalars) ──► serde_json::Value (field paths) ──► T (field paths)
//! ```
//!
//! serde-saphyr (already in the build through kube) parses in one streaming pass with budgets:
//! the depth is counted as the events come, so a document nested 100,000 deep stops at
//! [`MAX_DEPTH`] at once (libyaml, under the serde_yaml_ng this replaced, was quadratic in flow
//! nesting and needed a second parser to pre-check the depth).
//!
//! Rules, each refused with the field path (`spec.driver`, `gpus[0].name`, `.` for the
//! document) and a message:
//! - at most [`MAX_TEXT_BYTES`] of text and [`MAX_DEPTH`] nested collections;
//! - a key repeated in one mapping (kubectl refuses such files; a later `driver: {}` would
//!   silently replace the whole driver block);
//! - values JSON cannot hold: NaN/infinite floats, integers outside i64/u64, non-scalar keys.
//!   Scalar keys (`1: x`, `true: y`) become strings, as kubectl's YAML-to-JSON conversion does;
//! - more than one document;
//! - a list where the target type wants a mapping (a struct): serde would read it positionally
//!   (`startupProbe: [5, 7, 9]` setting three fields); see [`crate::strict`].
//!
//! **As the API server reads YAML** (sigs.k8s.io/yaml over go-yaml, YAML 1.1 scalars), so a
//! file `kubectl apply` takes means the same to kiln:
//! - merge keys (`<<: *defaults`) are merged, the mapping's own keys winning;
//! - YAML 1.1 octals (`0755` = 493) and `0o755`, hex `0x1F`, as go-yaml resolves them;
//! - YAML 1.1 booleans: `yes`/`no`/`on`/`off`/`y`/`n` (any case) are booleans, values and keys
//!   alike (`n: 1` is `{"false": 1}`), as go-yaml reads them: quote such a string (`mode:
//!   'off'`), as for the API server;
//! - **deviation**: a tag other than YAML's own (`!!str`, `!!int`, …), say `!secret x`, is
//!   refused; go-yaml drops an unknown tag and keeps the value.
//!
//! A leading UTF-8 byte order mark is skipped, as kubectl and the API server skip it.

use std::{cell::RefCell, fmt};

use serde::de::{self, DeserializeOwned, DeserializeSeed, Visitor};
use serde_json::{Map, Number, Value};

/// The most collections (mappings and sequences) nested in one document: 64. A ClusterPolicy
/// nests about 8 deep (`spec.driver.manager.env[0].valueFrom.…`).
pub const MAX_DEPTH: usize = 64;

/// The most bytes of YAML text one document may have: 1 MiB (as
/// [`MAX_FILE_BYTES`](crate::MAX_FILE_BYTES)).
pub const MAX_TEXT_BYTES: usize = 1 << 20;

/// Why a document was refused: the field path (`.` for the whole document) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct YamlError {
    /// Field path, `spec.driver.env[0].name` style; `.` for the document.
    pub path: String,
    /// The decoder's or the rule's message.
    pub message: String,
}

impl YamlError {
    fn document(message: impl Into<String>) -> Self {
        Self {
            path: ".".into(),
            message: message.into(),
        }
    }
}

/// serde-saphyr's settings for the rules of the module docs.
fn options() -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_depth = MAX_DEPTH;
    let mut o = serde_saphyr::Options::default();
    o.budget = Some(budget);
    o.duplicate_keys = serde_saphyr::DuplicateKeyPolicy::Error;
    o.merge_keys = serde_saphyr::MergeKeyPolicy::Merge;
    o.legacy_octal_numbers = true;
    o.reject_unsupported_tags = true;
    o.non_finite_float_policy = serde_saphyr::NonFiniteFloatPolicy::Reject;
    o.with_snippet = false;
    o.crop_radius = 0;
    o
}

/// Parses `text` (YAML, or JSON which is YAML) into a JSON value under the rules of the module
/// docs. Empty text is `null`; a leading byte order mark (U+FEFF) is skipped.
///
/// # Errors
/// [`YamlError`] with the field path.
pub fn to_value(text: &str) -> Result<Value, YamlError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    if text.len() > MAX_TEXT_BYTES {
        return Err(YamlError::document(format!(
            "document larger than {MAX_TEXT_BYTES} bytes"
        )));
    }
    if text.trim().is_empty() {
        return Ok(Value::Null);
    }
    let errors = RefCell::new(None);
    let failed_at = RefCell::new(None);
    let res = serde_saphyr::with_deserializer_from_str_with_options(text, options(), |de| {
        Strict {
            at: &Loc::Root,
            errors: &errors,
            failed_at: &failed_at,
        }
        .deserialize(de)
    });
    res.map_err(|e| {
        errors
            .take()
            .unwrap_or_else(|| from_parser(e.without_snippet(), failed_at.take()))
    })
}

/// A serde-saphyr error as a [`YamlError`]: `at` is where the value being read was (for a
/// duplicate key, the mapping).
fn from_parser(e: &serde_saphyr::Error, at: Option<String>) -> YamlError {
    use serde_saphyr::Error as E;
    let line = e
        .location()
        .map(|l| format!(" (line {})", l.line()))
        .unwrap_or_default();
    match e {
        E::DuplicateMappingKey { key, .. } => {
            let key = key.as_deref().unwrap_or("?");
            let path = match at.as_deref() {
                None | Some(".") => key.to_string(),
                Some(p) => format!("{p}.{key}"),
            };
            YamlError {
                path,
                message: format!("duplicate key `{key}` (each key may appear once per mapping)"),
            }
        }
        E::Budget {
            breach: serde_saphyr::budget::BudgetBreach::Depth { .. },
            ..
        } => YamlError::document(format!("nested deeper than {MAX_DEPTH} levels{line}")),
        E::MultipleDocuments { .. } => YamlError::document(format!("more than one document{line}")),
        E::UnsupportedTag { tag, .. } => YamlError {
            path: at.unwrap_or_else(|| ".".into()),
            message: format!("YAML tags (`!name value`) are not supported: {tag}{line}"),
        },
        other => YamlError {
            path: at.unwrap_or_else(|| ".".into()),
            message: format!("invalid YAML: {other}"),
        },
    }
}

/// Parses `text` with [`to_value`], then decodes it as `T`; decode errors carry the field path
/// (`sharing.timeSlicing.resources[0].replicas`).
///
/// # Errors
/// [`YamlError`].
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, YamlError> {
    from_value(to_value(text)?)
}

/// Decodes an already-parsed value as `T`, with the field path in the error. A struct is never
/// decoded from a sequence (`invalid type: sequence, expected a map`; see [`crate::strict`]).
///
/// # Errors
/// [`YamlError`].
pub fn from_value<T: DeserializeOwned>(value: Value) -> Result<T, YamlError> {
    serde_path_to_error::deserialize(crate::strict::Strict(value)).map_err(|e| YamlError {
        path: e.path().to_string(),
        message: e.into_inner().to_string(),
    })
}

/// Where a node is, for error paths: a chain of parents, formatted only on error.
enum Loc<'a> {
    Root,
    Key(&'a Loc<'a>, &'a str),
    Index(&'a Loc<'a>, usize),
}

impl fmt::Display for Loc<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Loc::Root => f.write_str("."),
            // An empty key (`"": 1`, or `? |` with no text) is named `""`, so that no path is
            // empty.
            Loc::Key(Loc::Root, "") => f.write_str("\"\""),
            Loc::Key(p, "") => write!(f, "{p}.\"\""),
            Loc::Key(Loc::Root, k) => f.write_str(k),
            Loc::Key(p, k) => write!(f, "{p}.{k}"),
            Loc::Index(Loc::Root, i) => write!(f, "[{i}]"),
            Loc::Index(p, i) => write!(f, "{p}[{i}]"),
        }
    }
}

/// Builds a [`Value`], records the first rule violation (with its path) in `errors`, and the
/// innermost path where the parser failed in `failed_at`.
#[derive(Clone, Copy)]
struct Strict<'a> {
    at: &'a Loc<'a>,
    errors: &'a RefCell<Option<YamlError>>,
    failed_at: &'a RefCell<Option<String>>,
}

impl Strict<'_> {
    fn fail<E: de::Error>(&self, at: &Loc<'_>, message: String) -> E {
        let mut slot = self.errors.borrow_mut();
        if slot.is_none() {
            *slot = Some(YamlError {
                path: at.to_string(),
                message: message.clone(),
            });
        }
        E::custom(message)
    }

    /// Remembers `at` as where the parser failed, unless a deeper place was recorded.
    fn failed<E>(&self, at: &Loc<'_>, e: E) -> E {
        let mut slot = self.failed_at.borrow_mut();
        if slot.is_none() {
            *slot = Some(at.to_string());
        }
        e
    }
}

impl<'de> DeserializeSeed<'de> for Strict<'_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a YAML value JSON can hold")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Value, E> {
        match (i64::try_from(v), u64::try_from(v)) {
            (Ok(i), _) => Ok(Value::Number(i.into())),
            (_, Ok(u)) => Ok(Value::Number(u.into())),
            _ => Err(self.fail(self.at, format!("integer {v} is out of range"))),
        }
    }

    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Value, E> {
        match u64::try_from(v) {
            Ok(u) => Ok(Value::Number(u.into())),
            Err(_) => Err(self.fail(self.at, format!("integer {v} is out of range"))),
        }
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| self.fail(self.at, format!("{v} is not a number JSON can hold")))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        self.deserialize(d)
    }

    fn visit_newtype_struct<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        self.deserialize(d)
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        loop {
            let at = Loc::Index(self.at, out.len());
            let child = Strict { at: &at, ..self };
            match seq
                .next_element_seed(child)
                .map_err(|e| self.failed(&at, e))?
            {
                Some(v) => out.push(v),
                None => return Ok(Value::Array(out)),
            }
        }
    }

    fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map
            .next_key_seed(Key(self))
            .map_err(|e| self.failed(self.at, e))?
        {
            let at = Loc::Key(self.at, &key);
            let child = Strict { at: &at, ..self };
            let value = map
                .next_value_seed(child)
                .map_err(|e| self.failed(&at, e))?;
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

/// A mapping key: a string, or a scalar written as its string.
struct Key<'a>(Strict<'a>);

impl<'de> DeserializeSeed<'de> for Key<'_> {
    type Value = String;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        match d.deserialize_any(self.0)? {
            Value::String(s) => Ok(s),
            Value::Number(n) => Ok(n.to_string()),
            Value::Bool(b) => Ok(b.to_string()),
            Value::Null => Ok("null".into()),
            _ => Err(self
                .0
                .fail(self.0.at, "a mapping key must be a scalar".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn err(text: &str) -> String {
        to_value(text).unwrap_err().to_string()
    }

    #[test]
    fn documents_parse_to_json() {
        assert_eq!(
            to_value("a: 1\nb: [x, 2.5, true, null]\n3: c\n").unwrap(),
            json!({"a": 1, "b": ["x", 2.5, true, null], "3": "c"})
        );
        assert_eq!(to_value("").unwrap(), Value::Null);
        assert_eq!(
            to_value("{\"a\": {\"b\": 1}}").unwrap(),
            json!({"a": {"b": 1}})
        );
    }

    #[test]
    fn duplicate_keys_are_refused_with_their_path() {
        assert_eq!(
            err("spec:\n  driver:\n    version: '1'\n  driver: {}\n"),
            "spec.driver: duplicate key `driver` (each key may appear once per mapping)"
        );
        assert_eq!(
            err("a: [{x: 1, x: 2}]"),
            "a[0].x: duplicate key `x` (each key may appear once per mapping)"
        );
        // The same key in different mappings is fine.
        assert!(to_value("a: {x: 1}\nb: {x: 1}\n").is_ok());
    }

    #[test]
    fn deep_nesting_is_refused_fast_in_every_style() {
        let n = 100_000;
        for (style, text) in [
            ("flow map", "{a: ".repeat(n) + "1" + &"}".repeat(n)),
            ("flow seq", "[".repeat(n) + &"]".repeat(n)),
            ("block seq", "- ".repeat(n) + "x\n"),
        ] {
            let e = to_value(&text).unwrap_err();
            assert_eq!(e.path, ".", "{style}");
            assert!(
                e.message.contains("nested deeper than 64 levels")
                    || e.message.contains("recursion limit"),
                "{style}: {e}"
            );
        }
        let ok = "[".repeat(MAX_DEPTH) + &"]".repeat(MAX_DEPTH);
        assert!(to_value(&ok).is_ok());
        let deep = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
        assert!(err(&deep).contains("nested deeper than 64 levels"));
    }

    #[test]
    fn sizes_tags_and_odd_numbers_are_refused() {
        let big = format!("a: \"{}\"\n", "x".repeat(MAX_TEXT_BYTES));
        assert_eq!(err(&big), ".: document larger than 1048576 bytes");
        let e = to_value("a: !secret x\n").unwrap_err();
        assert!(
            e.message
                .starts_with("YAML tags (`!name value`) are not supported: !secret"),
            "{e}"
        );
        let e = err("a: .nan\n");
        assert!(e.contains("nan") || e.contains("NaN"), "{e}");
        assert!(err("a: 1\n---\nb: 2\n").contains("more than one document"));
        // A byte order mark is not a second document (kubectl skips it too).
        assert_eq!(to_value("\u{feff}a: 1\n").unwrap(), json!({"a": 1}));
        assert_eq!(to_value("\u{feff}{\"a\": 1}").unwrap(), json!({"a": 1}));
        assert!(err("a: [1\n").contains("invalid YAML"));
        assert!(err("[a, b]: 1\n").contains("a mapping key must be a scalar"));
    }

    /// What sigs.k8s.io/yaml (go-yaml, YAML 1.1 scalars) makes of the same text, or the
    /// deviation the module docs list.
    #[test]
    fn scalars_and_merge_keys_read_as_the_api_server_reads_them() {
        // Merge keys are merged; the mapping's own key wins, and is no duplicate.
        assert_eq!(
            to_value("base: &b {a: 1, b: 2}\nm:\n  <<: *b\n  b: 3\n").unwrap(),
            json!({"base": {"a": 1, "b": 2}, "m": {"a": 1, "b": 3}})
        );
        // YAML 1.1 octal, YAML 1.2 octal and hex integers, as go-yaml resolves them.
        assert_eq!(
            to_value("a: 0755\nb: 0o755\nc: 0x1F\nd: 10\n").unwrap(),
            json!({"a": 493, "b": 493, "c": 31, "d": 10})
        );
        // YAML 1.1 booleans, values and keys (the "Norway problem", as go-yaml has it).
        assert_eq!(
            to_value("a: true\nb: False\nc: TRUE\nd: yes\ne: on\nf: n\ny: 1\ng: 'no'\n").unwrap(),
            json!({"a": true, "b": false, "c": true, "d": true, "e": true, "f": false,
                   "true": 1, "g": "no"})
        );
        // YAML's own tags work; quoted scalars stay strings.
        assert_eq!(
            to_value("a: !!str 123\nb: '0755'\nc: ~\nd: null\n").unwrap(),
            json!({"a": "123", "b": "0755", "c": null, "d": null})
        );
    }

    /// Found by `tests/props.rs`: a parse error under an empty key still names a path.
    #[test]
    fn an_empty_key_is_named_in_the_path() {
        let e = to_value("? |\n[").unwrap_err();
        assert_eq!(e.path, "\"\"", "{e}");
        assert!(e.message.contains("unclosed bracket"), "{e}");
        let e = to_value("a:\n  ? |\n  [").unwrap_err();
        assert!(e.path == "a.\"\"" || e.path == "a", "{e}");
    }

    #[test]
    fn typed_errors_name_the_field() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Doc {
            items: Vec<Item>,
        }
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Item {
            count: u32,
        }
        let e = from_str::<Doc>("items: [{count: 1}, {count: 4294967296}]").unwrap_err();
        assert_eq!(e.path, "items[1].count");
        assert!(e.message.contains("4294967296"), "{e}");
        let e = from_str::<Doc>("items: [{count: 99999999999999999999999}]").unwrap_err();
        assert_eq!(e.path, "items[0].count");
    }
}

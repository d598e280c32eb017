//! The one YAML/JSON loader of every document kiln takes from a file or flag: ClusterPolicy
//! files (`kiln render`), agent configs, GPU fixtures.
//!
//! ```text
//! text ──► ≤ MAX_TEXT_BYTES ──► depth pre-check (yaml-rust2 events, stops at MAX_DEPTH)
//!      ──► serde_yaml_ng ──► strict serde_json::Value (duplicate keys refused) ──► T (field paths)
//! ```
//!
//! Rules, each refused with the field path (`spec.driver`, `gpus[0].name`, `.` for the
//! document) and a message:
//! - at most [`MAX_TEXT_BYTES`] of text and [`MAX_DEPTH`] nested collections. libyaml (under
//!   serde_yaml_ng) is quadratic in flow nesting (`{a: {a: …` 100,000 deep took 39 s), so the
//!   depth is checked first by a streaming pass of yaml-rust2's parser that stops at the limit;
//! - a key repeated in one mapping (kubectl refuses such files; a later `driver: {}` would
//!   silently replace the whole driver block);
//! - values JSON cannot hold: tagged values (`!foo x`), NaN/infinite floats, integers outside
//!   i64/u64, non-scalar keys. Scalar keys (`1: x`, `true: y`) become strings, as kubectl's
//!   YAML-to-JSON conversion does;
//! - more than one document;
//! - a list where the target type wants a mapping (a struct): serde would read it positionally
//!   (`startupProbe: [5, 7, 9]` setting three fields); see [`crate::strict`].
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
    check_depth(text)?;
    let errors = RefCell::new(None);
    let de = serde_yaml_ng::Deserializer::from_str(text);
    let seed = Strict {
        depth: 0,
        at: &Loc::Root,
        errors: &errors,
    };
    seed.deserialize(de).map_err(|e| {
        errors
            .take()
            .unwrap_or_else(|| YamlError::document(e.to_string()))
    })
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

/// Streams the events of `text` and refuses it once more than [`MAX_DEPTH`] collections are
/// open; linear in the text, and stops at the limit.
fn check_depth(text: &str) -> Result<(), YamlError> {
    use yaml_rust2::parser::{Event, Parser};
    let mut parser = Parser::new_from_str(text);
    let mut depth = 0usize;
    loop {
        let (event, mark) = parser
            .next_token()
            .map_err(|e| YamlError::document(format!("invalid YAML: {e}")))?;
        match event {
            Event::StreamEnd => return Ok(()),
            Event::SequenceStart(..) | Event::MappingStart(..) => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Err(YamlError::document(format!(
                        "nested deeper than {MAX_DEPTH} levels (line {})",
                        mark.line()
                    )));
                }
            }
            Event::SequenceEnd | Event::MappingEnd => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
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
            Loc::Key(Loc::Root, k) => f.write_str(k),
            Loc::Key(p, k) => write!(f, "{p}.{k}"),
            Loc::Index(Loc::Root, i) => write!(f, "[{i}]"),
            Loc::Index(p, i) => write!(f, "{p}[{i}]"),
        }
    }
}

/// Builds a [`Value`] and records the first rule violation (with its path) in `errors`.
#[derive(Clone, Copy)]
struct Strict<'a> {
    depth: usize,
    at: &'a Loc<'a>,
    errors: &'a RefCell<Option<YamlError>>,
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

    fn enter<E: de::Error>(&self) -> Result<usize, E> {
        let depth = self.depth + 1;
        if depth > MAX_DEPTH {
            return Err(self.fail(self.at, format!("nested deeper than {MAX_DEPTH} levels")));
        }
        Ok(depth)
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
        let depth = self.enter()?;
        let mut out = Vec::new();
        loop {
            let at = Loc::Index(self.at, out.len());
            let child = Strict {
                depth,
                at: &at,
                errors: self.errors,
            };
            match seq.next_element_seed(child)? {
                Some(v) => out.push(v),
                None => return Ok(Value::Array(out)),
            }
        }
    }

    fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let depth = self.enter()?;
        let mut out = Map::new();
        while let Some(key) = map.next_key_seed(Key(self))? {
            let at = Loc::Key(self.at, &key);
            if out.contains_key(&key) {
                return Err(self.fail(
                    &at,
                    format!("duplicate key `{key}` (each key may appear once per mapping)"),
                ));
            }
            let child = Strict {
                depth,
                at: &at,
                errors: self.errors,
            };
            let value = map.next_value_seed(child)?;
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }

    fn visit_enum<A: de::EnumAccess<'de>>(self, _data: A) -> Result<Value, A::Error> {
        Err(self.fail(
            self.at,
            "YAML tags (`!name value`) are not supported".into(),
        ))
    }
}

/// A mapping key: a string, or a scalar written as its string.
struct Key<'a>(Strict<'a>);

impl<'de> DeserializeSeed<'de> for Key<'_> {
    type Value = String;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        let v = d.deserialize_any(Strict {
            depth: MAX_DEPTH, // a collection as a key is refused below anyway
            ..self.0
        });
        match v {
            Ok(Value::String(s)) => Ok(s),
            Ok(Value::Number(n)) => Ok(n.to_string()),
            Ok(Value::Bool(b)) => Ok(b.to_string()),
            Ok(Value::Null) => Ok("null".into()),
            Ok(_) => Err(self
                .0
                .fail(self.0.at, "a mapping key must be a scalar".into())),
            Err(e) => {
                // A collection key hits the depth guard; report it as what it is.
                let mut slot = self.0.errors.borrow_mut();
                if let Some(err) = slot.as_mut().filter(|e| e.message.starts_with("nested")) {
                    err.message = "a mapping key must be a scalar".into();
                }
                Err(e)
            }
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
        assert_eq!(
            err("a: !secret x\n"),
            "a: YAML tags (`!name value`) are not supported"
        );
        assert_eq!(err("a: .nan\n"), "a: NaN is not a number JSON can hold");
        assert!(err("a: 1\n---\nb: 2\n").contains("more than one document"));
        // A byte order mark is not a second document (kubectl skips it too).
        assert_eq!(to_value("\u{feff}a: 1\n").unwrap(), json!({"a": 1}));
        assert_eq!(to_value("\u{feff}{\"a\": 1}").unwrap(), json!({"a": 1}));
        assert!(err("a: [1\n").contains("invalid YAML"));
        assert_eq!(err("[a, b]: 1\n"), ".: a mapping key must be a scalar");
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
            n: u32,
        }
        let e = from_str::<Doc>("items: [{n: 1}, {n: 4294967296}]").unwrap_err();
        assert_eq!(e.path, "items[1].n");
        assert!(e.message.contains("4294967296"), "{e}");
        let e = from_str::<Doc>("items: [{n: 99999999999999999999999}]").unwrap_err();
        assert_eq!(e.path, "items[0].n");
    }
}

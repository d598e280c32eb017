//! A deserializer over a parsed [`Value`] that never decodes a struct from a sequence.
//!
//! serde's derived `Deserialize` for a struct accepts a sequence as well as a mapping and reads
//! it positionally: with a plain `serde_json::Value` deserializer, `gfd: [false]` sets the first
//! field (`enabled`) to `false`, `startupProbe: [5, 7, 9]` sets three fields, and
//! `timeSlicing: [true, true, [...]]` configured GPU sharing. Neither kubectl nor the API server
//! accept a list where an object is due, so kiln refuses it: [`Strict`] answers a struct request
//! on a sequence with `invalid type: sequence, expected a map`, at every depth.
//!
//! Limit: serde buffers the input of `#[serde(flatten)]` fields and untagged enums in its own
//! `Content` deserializer, which does not know this rule; the types decoded through
//! [`crate::yaml::from_value`] use neither below a struct (the ClusterPolicy, which flattens,
//! is checked against its CRD schema's types first).

use serde::de::value::{MapDeserializer, SeqDeserializer};
use serde::de::{
    self, DeserializeSeed, Deserializer, EnumAccess, IntoDeserializer, Unexpected, VariantAccess,
    Visitor,
};
use serde_json::{Error, Value};

/// A [`Value`] to decode, refusing sequences where a struct is due (see the module docs).
pub(crate) struct Strict(pub(crate) Value);

impl<'de> IntoDeserializer<'de, Error> for Strict {
    type Deserializer = Self;

    fn into_deserializer(self) -> Self {
        self
    }
}

fn unexpected(v: &Value) -> Unexpected<'_> {
    match v {
        Value::Null => Unexpected::Unit,
        Value::Bool(b) => Unexpected::Bool(*b),
        Value::Number(_) => Unexpected::Other("number"),
        Value::String(s) => Unexpected::Str(s),
        Value::Array(_) => Unexpected::Seq,
        Value::Object(_) => Unexpected::Map,
    }
}

impl<'de> Deserializer<'de> for Strict {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Null => visitor.visit_unit(),
            Value::Bool(b) => visitor.visit_bool(b),
            Value::Number(n) => n.deserialize_any(visitor),
            Value::String(s) => visitor.visit_string(s),
            Value::Array(items) => {
                let mut seq = SeqDeserializer::<_, Error>::new(items.into_iter().map(Strict));
                let out = visitor.visit_seq(&mut seq)?;
                seq.end()?;
                Ok(out)
            }
            Value::Object(map) => {
                let mut map =
                    MapDeserializer::<_, Error>::new(map.into_iter().map(|(k, v)| (k, Strict(v))));
                let out = visitor.visit_map(&mut map)?;
                map.end()?;
                Ok(out)
            }
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match self.0 {
            Value::Array(_) => Err(de::Error::invalid_type(Unexpected::Seq, &"a map")),
            _ => self.deserialize_any(visitor),
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match self.0 {
            Value::String(s) => visitor.visit_enum(s.into_deserializer()),
            Value::Object(map) if map.len() == 1 => {
                let Some((variant, value)) = map.into_iter().next() else {
                    unreachable!("one entry")
                };
                visitor.visit_enum(Enum(variant, value))
            }
            other => Err(de::Error::invalid_type(
                unexpected(&other),
                &"a string or a map with one key",
            )),
        }
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct seq tuple tuple_struct map identifier
    }
}

/// An externally tagged enum value `{variant: value}`, its value decoded strictly too.
struct Enum(String, Value);

impl<'de> EnumAccess<'de> for Enum {
    type Error = Error;
    type Variant = Strict;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Strict), Error> {
        let variant = seed.deserialize(self.0.into_deserializer())?;
        Ok((variant, Strict(self.1)))
    }
}

impl<'de> VariantAccess<'de> for Strict {
    type Error = Error;

    fn unit_variant(self) -> Result<(), Error> {
        match self.0 {
            Value::Null => Ok(()),
            other => Err(de::Error::invalid_type(unexpected(&other), &"unit variant")),
        }
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, Error> {
        seed.deserialize(self)
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_seq(visitor)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_struct("", fields, visitor)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::Deserialize;
    use serde_json::json;

    use crate::yaml::{from_str, from_value};

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(rename_all = "camelCase")]
    struct Probe {
        initial_delay_seconds: Option<u32>,
        period_seconds: Option<u32>,
        failure_threshold: Option<u32>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(rename_all = "camelCase")]
    struct Doc {
        #[serde(default)]
        startup_probe: Option<Probe>,
        #[serde(default)]
        probes: Vec<Probe>,
        #[serde(default)]
        by_name: BTreeMap<String, Probe>,
        #[serde(default)]
        mode: Option<Mode>,
        #[serde(default)]
        pair: Option<(u8, String)>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(rename_all = "camelCase")]
    enum Mode {
        Off,
        Shared { replicas: u32 },
        Named(String),
    }

    #[test]
    fn structs_never_decode_from_sequences() {
        for (text, path) in [
            ("startupProbe: [5, 7, 9]", "startupProbe"),
            ("probes: [{periodSeconds: 1}, [1]]", "probes[1]"),
            ("byName: {a: [1, 2]}", "byName.a"),
            ("[{}, [], []]", "."),
            ("mode: {shared: [3]}", "mode.shared"),
        ] {
            let e = from_str::<Doc>(text).unwrap_err();
            assert_eq!(e.path, path, "{text}: {e}");
            assert!(
                e.message.contains("invalid type: sequence, expected a map"),
                "{text}: {e}"
            );
        }
    }

    #[test]
    fn everything_else_decodes_as_before() {
        let doc: Doc = from_value(json!({
            "startupProbe": {"periodSeconds": 5},
            "probes": [{"failureThreshold": 2}],
            "byName": {"x": {}},
            "mode": {"shared": {"replicas": 4}},
            "pair": [1, "a"],
        }))
        .unwrap();
        assert_eq!(doc.startup_probe.unwrap().period_seconds, Some(5));
        assert_eq!(doc.probes[0].failure_threshold, Some(2));
        assert_eq!(doc.by_name["x"].initial_delay_seconds, None);
        assert_eq!(doc.mode, Some(Mode::Shared { replicas: 4 }));
        assert_eq!(doc.pair, Some((1, "a".into())));
        let doc: Doc = from_str("mode: 'off'\nstartupProbe: null\n").unwrap();
        assert_eq!((doc.mode, doc.startup_probe), (Some(Mode::Off), None));
        // Unquoted, `off` is YAML 1.1's boolean false, as the API server reads it.
        let e = from_str::<Doc>("mode: off\n").unwrap_err();
        assert!(
            e.path == "mode" && e.message.contains("boolean `false`"),
            "{e}"
        );
        let doc: Doc = from_str("mode: {named: x}").unwrap();
        assert_eq!(doc.mode, Some(Mode::Named("x".into())));
        let e = from_str::<Doc>("mode: {'off': 1, named: x}").unwrap_err();
        assert_eq!(e.path, "mode");
        let e = from_str::<Doc>("pair: [1, a, 3]").unwrap_err();
        assert_eq!(e.path, "pair");
        let e = from_str::<Doc>("probes: [{periodSeconds: -1}]").unwrap_err();
        assert_eq!(e.path, "probes[0].periodSeconds");
    }
}

//! The two exposition formats, written by maintained libraries: Prometheus text 0.0.4 (the
//! default, what dcgm-exporter serves) by the `prometheus` crate's `TextEncoder`, and OpenMetrics
//! 1.0 (by content negotiation) by `prometheus-client`'s encoder through a [`Collector`].
//!
//! A scrape's families are built as `prometheus::proto::MetricFamily` values ([`family`],
//! [`sample`]) from the latest snapshot; both encoders read the same values.
//!
//! # Counters (why two libraries)
//! dcgm-exporter declares counters whose names do not end in `_total`
//! (`DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`, `DCGM_FI_DEV_PCIE_REPLAY_COUNTER`, …). The text format
//! allows that and `TextEncoder` keeps name and `# TYPE … counter` as given. OpenMetrics requires
//! a counter's samples to end in `_total`, and `prometheus-client` appends it (as its 0.0.4
//! encoder does too), which would rename DCGM series. So in OpenMetrics such a family is declared
//! `unknown` and keeps its name; families already ending in `_total` (kiln's own) are declared
//! `counter` under the name without the suffix, and their samples keep `…_total`.
//!
//! # Values
//! Samples are `f64`. Text 0.0.4 prints Rust's shortest form (`72.345`, `41`); OpenMetrics
//! prints integral values below 2^53 as integers (`41`) and others with `dtoa` (`72.345`).
//! dcgm-exporter prints doubles with `%f` (`72.345000`): the same number to a parser.

use prometheus::{
    TextEncoder,
    proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType as ProtoType},
};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, NoLabelSet},
    metrics::MetricType,
    registry::Registry,
};

use crate::fields::Value;

/// Which format a scrape asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// `text/plain; version=0.0.4`.
    Text,
    /// `application/openmetrics-text; version=1.0.0`.
    OpenMetrics,
}

impl Format {
    /// The `Content-Type` to answer with.
    #[must_use]
    pub fn content_type(self) -> &'static str {
        match self {
            Self::Text => "text/plain; version=0.0.4; charset=utf-8",
            Self::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }

    /// Picks the format from an `Accept` header: OpenMetrics when it is offered with a non-zero
    /// q-value, the text format otherwise (including no header).
    #[must_use]
    pub fn negotiate(accept: Option<&str>) -> Self {
        let offered = accept.unwrap_or("").split(',').any(|part| {
            let mut params = part.split(';').map(str::trim);
            params.next() == Some("application/openmetrics-text")
                && !params
                    .any(|p| p.strip_prefix("q=").and_then(|q| q.parse::<f32>().ok()) == Some(0.0))
        });
        if offered {
            Self::OpenMetrics
        } else {
            Self::Text
        }
    }
}

/// Family type as declared in `# TYPE` of the text format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `gauge`.
    Gauge,
    /// `counter` (see the module docs for OpenMetrics).
    Counter,
}

/// Labels of one sample, in output order: `(name, value)`; values are escaped by the encoders.
pub type Labels = Vec<(&'static str, String)>;

/// One sample of a family of `kind` (the value goes into the matching proto field).
#[must_use]
pub fn sample(kind: Kind, labels: Labels, value: Value) -> Metric {
    let v = match value {
        // Exact up to 2^53 (9e15 mJ is ~400 years of a 700 W GPU).
        #[allow(clippy::cast_precision_loss)]
        Value::Int(v) => v as f64,
        Value::Float(v) => v,
    };
    let mut m = Metric::default();
    m.set_label(
        labels
            .into_iter()
            .map(|(name, value)| {
                let mut l = LabelPair::default();
                l.set_name(name.to_owned());
                l.set_value(value);
                l
            })
            .collect(),
    );
    match kind {
        Kind::Gauge => {
            let mut g = Gauge::default();
            g.set_value(v);
            m.set_gauge(g);
        }
        Kind::Counter => {
            let mut c = Counter::default();
            c.set_value(v);
            m.set_counter(c);
        }
    }
    m
}

/// A family; `None` when it has no samples (dcgm-exporter emits no `# HELP`/`# TYPE` for those,
/// and the text encoder refuses empty families).
#[must_use]
pub fn family(name: &str, help: &str, kind: Kind, samples: Vec<Metric>) -> Option<MetricFamily> {
    if samples.is_empty() {
        return None;
    }
    let mut f = MetricFamily::default();
    f.set_name(name.to_owned());
    f.set_help(help.to_owned());
    f.set_field_type(match kind {
        Kind::Gauge => ProtoType::GAUGE,
        Kind::Counter => ProtoType::COUNTER,
    });
    f.set_metric(samples);
    Some(f)
}

/// Appends `families` to `out` in `format`, without OpenMetrics' `# EOF` (see [`finish`]).
///
/// # Errors
/// The encoder's message for a family it refuses (an empty one; [`family`] never builds those).
pub fn encode(out: &mut String, format: Format, families: Vec<MetricFamily>) -> Result<(), String> {
    match format {
        Format::Text => TextEncoder::new()
            .encode_utf8(&families, out)
            .map_err(|e| e.to_string()),
        Format::OpenMetrics => {
            let mut registry = Registry::default();
            registry.register_collector(Box::new(OpenMetricsFamilies(families)));
            prometheus_client::encoding::text::encode_registry(out, &registry)
                .map_err(|e| e.to_string())
        }
    }
}

/// Ends a body: `# EOF` for OpenMetrics (written by `prometheus-client`), nothing for text.
pub fn finish(out: &mut String, format: Format) {
    if format == Format::OpenMetrics {
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode_eof(out);
    }
}

/// Families handed to `prometheus-client`'s OpenMetrics encoder (see the module docs).
#[derive(Debug)]
struct OpenMetricsFamilies(Vec<MetricFamily>);

impl Collector for OpenMetricsFamilies {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in &self.0 {
            let counter = f.get_field_type() == ProtoType::COUNTER;
            let (name, ty) = match f.name().strip_suffix("_total") {
                Some(base) if counter => (base, MetricType::Counter),
                _ if counter => (f.name(), MetricType::Unknown),
                _ => (f.name(), MetricType::Gauge),
            };
            let mut metric = encoder.encode_descriptor(name, f.help(), None, ty)?;
            for m in f.get_metric() {
                let labels: Vec<(&str, &str)> = m
                    .get_label()
                    .iter()
                    .map(|l| (l.name(), l.value()))
                    .collect();
                let mut s = metric.encode_family(&labels)?;
                if matches!(ty, MetricType::Counter) {
                    let v = m.get_counter().get_value();
                    match as_integer(v) {
                        Some(i) => s.encode_counter::<NoLabelSet, _, f64>(&i, None)?,
                        None => s.encode_counter::<NoLabelSet, _, f64>(&v, None)?,
                    }
                } else {
                    let v = if counter {
                        m.get_counter().get_value()
                    } else {
                        m.get_gauge().get_value()
                    };
                    match as_integer(v) {
                        Some(i) => s.encode_gauge(&i)?,
                        None => s.encode_gauge(&v)?,
                    }
                }
            }
        }
        Ok(())
    }
}

/// `v` as an integer when it is one and exactly representable.
fn as_integer(v: f64) -> Option<u64> {
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    (v.fract() == 0.0 && (0.0..EXACT).contains(&v)).then_some(v as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(format: Format, families: Vec<MetricFamily>) -> String {
        let mut out = String::new();
        encode(&mut out, format, families).unwrap();
        finish(&mut out, format);
        out
    }

    fn fams() -> Vec<MetricFamily> {
        let labels: Labels = vec![("a", "q\"\\\n".into()), ("b", "x".into())];
        vec![
            family(
                "DCGM_FI_X",
                "a \\ b\nc",
                Kind::Counter,
                vec![sample(Kind::Counter, labels, Value::Int(7))],
            )
            .unwrap(),
            family(
                "x_total",
                "h",
                Kind::Counter,
                vec![sample(Kind::Counter, vec![], Value::Int(2))],
            )
            .unwrap(),
            family(
                "g",
                "h",
                Kind::Gauge,
                vec![sample(Kind::Gauge, vec![], Value::Float(72.345))],
            )
            .unwrap(),
        ]
    }

    #[test]
    fn negotiation_prefers_openmetrics_only_when_offered() {
        assert_eq!(Format::negotiate(None), Format::Text);
        assert_eq!(Format::negotiate(Some("text/plain")), Format::Text);
        let prom = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3,*/*;q=0.1";
        assert_eq!(Format::negotiate(Some(prom)), Format::OpenMetrics);
        assert_eq!(
            Format::negotiate(Some("application/openmetrics-text; q=0")),
            Format::Text
        );
    }

    #[test]
    fn text_keeps_dcgm_counter_names_and_escapes() {
        assert_eq!(
            encoded(Format::Text, fams()),
            "# HELP DCGM_FI_X a \\\\ b\\nc\n# TYPE DCGM_FI_X counter\n\
             DCGM_FI_X{a=\"q\\\"\\\\\\n\",b=\"x\"} 7\n\
             # HELP x_total h\n# TYPE x_total counter\nx_total 2\n\
             # HELP g h\n# TYPE g gauge\ng 72.345\n"
        );
    }

    #[test]
    fn openmetrics_types_counters_without_total_as_unknown() {
        let om = encoded(Format::OpenMetrics, fams());
        assert!(
            om.contains("# TYPE DCGM_FI_X unknown\nDCGM_FI_X{a=\"q\\\"\\\\\\n\",b=\"x\"} 7\n"),
            "{om}"
        );
        assert!(
            om.contains("# HELP x h\n# TYPE x counter\nx_total 2\n"),
            "{om}"
        );
        assert!(om.contains("# TYPE g gauge\ng 72.345\n"), "{om}");
        assert!(om.ends_with("# EOF\n"));
    }

    #[test]
    fn empty_families_are_not_built() {
        assert!(family("x", "h", Kind::Gauge, Vec::new()).is_none());
    }
}

//! Low-level writers for the two exposition formats: Prometheus text 0.0.4 (the default, what
//! dcgm-exporter serves) and OpenMetrics 1.0 (by content negotiation).
//!
//! Differences between the two handled here: metadata escaping, the `# EOF` trailer, and
//! counters. OpenMetrics requires a counter's samples to end in `_total`; DCGM counter names do
//! not (`DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`), so in OpenMetrics such a family is declared
//! `unknown`, which keeps the series name identical in both formats.

use std::fmt::Write as _;

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

/// Family type as declared in `# TYPE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `gauge`.
    Gauge,
    /// `counter` (see the module docs for OpenMetrics).
    Counter,
}

/// Writes `# HELP` and `# TYPE` for a family.
pub fn write_header(out: &mut String, format: Format, name: &str, help: &str, kind: Kind) {
    let ty = match (kind, format) {
        (Kind::Gauge, _) => "gauge",
        (Kind::Counter, Format::Text) => "counter",
        (Kind::Counter, Format::OpenMetrics) if name.ends_with("_total") => "counter",
        (Kind::Counter, Format::OpenMetrics) => "unknown",
    };
    let family = match (kind, format) {
        (Kind::Counter, Format::OpenMetrics) => name.strip_suffix("_total").unwrap_or(name),
        _ => name,
    };
    out.push_str("# HELP ");
    out.push_str(family);
    out.push(' ');
    escape_into(out, help, format == Format::OpenMetrics);
    out.push_str("\n# TYPE ");
    out.push_str(family);
    out.push(' ');
    out.push_str(ty);
    out.push('\n');
}

/// Appends `,name="value"` (or `name="value"` when `first`), escaping the value.
pub fn push_label(out: &mut String, first: bool, name: &str, value: &str) {
    if !first {
        out.push(',');
    }
    out.push_str(name);
    out.push_str("=\"");
    escape_into(out, value, true);
    out.push('"');
}

/// Writes one sample line: `name{labels} value`; `labels` is pre-rendered (may be empty).
pub fn write_sample(out: &mut String, name: &str, labels: &str, value: Value) {
    out.push_str(name);
    if !labels.is_empty() {
        out.push('{');
        out.push_str(labels);
        out.push('}');
    }
    out.push(' ');
    match value {
        Value::Int(v) => {
            let _ = write!(out, "{v}");
        }
        Value::Float(v) => {
            let _ = write!(out, "{v:.6}");
        }
    }
    out.push('\n');
}

/// Ends a body: `# EOF` for OpenMetrics, nothing for text.
pub fn finish(out: &mut String, format: Format) {
    if format == Format::OpenMetrics {
        out.push_str("# EOF\n");
    }
}

/// Escapes `\`, newline and (for label values and OpenMetrics help) `"`.
fn escape_into(out: &mut String, s: &str, quotes: bool) {
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if quotes => out.push_str("\\\""),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn counters_without_total_are_unknown_in_openmetrics() {
        let mut t = String::new();
        write_header(
            &mut t,
            Format::Text,
            "DCGM_FI_X",
            "a \"b\"\nc",
            Kind::Counter,
        );
        assert_eq!(
            t,
            "# HELP DCGM_FI_X a \"b\"\\nc\n# TYPE DCGM_FI_X counter\n"
        );
        let mut o = String::new();
        write_header(&mut o, Format::OpenMetrics, "DCGM_FI_X", "h", Kind::Counter);
        write_header(&mut o, Format::OpenMetrics, "x_total", "h", Kind::Counter);
        assert_eq!(
            o,
            "# HELP DCGM_FI_X h\n# TYPE DCGM_FI_X unknown\n# HELP x h\n# TYPE x counter\n"
        );
    }

    #[test]
    fn samples_escape_labels_and_format_values_like_dcgm() {
        let mut labels = String::new();
        push_label(&mut labels, true, "a", "q\"\\\n");
        push_label(&mut labels, false, "b", "x");
        let mut out = String::new();
        write_sample(&mut out, "m", &labels, Value::Float(72.345));
        write_sample(&mut out, "m", "", Value::Int(7));
        assert_eq!(out, "m{a=\"q\\\"\\\\\\n\",b=\"x\"} 72.345000\nm 7\n");
    }
}

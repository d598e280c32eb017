//! The metric catalogue: which fields to export, with type and help, read from a CSV in
//! dcgm-exporter's format (reference §1.5) or from the embedded `default-counters.csv`.
//!
//! Format: one record per line, `field, type, help`, read by the `csv` crate; `#` starts a
//! comment line; spaces around fields are trimmed; a help text containing a comma must be
//! double-quoted. Types are `gauge`, `counter` and `label`. Differences from dcgm-exporter, all
//! on purpose:
//! - `histogram` and `summary` are rejected (dcgm-exporter accepts them and emits invalid text);
//! - a name that is no DCGM field kiln knows, or one NVML cannot provide, is never fatal: it is
//!   kept in [`Catalogue::unknown`] / [`Catalogue::unavailable`], warned about once at start-up
//!   by [`Catalogue::warn_skipped`], and the rest of the file is used (dcgm-exporter refuses
//!   to start on a name its DCGM does not know, and a DaemonSet with such a CSV crash-loops).

use crate::fields::{Field, Source, field_by_name};

/// The embedded default list.
pub const DEFAULT_CSV: &str = include_str!("../default-counters.csv");

/// Prometheus type of an exported family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricType {
    /// `gauge`.
    Gauge,
    /// `counter`.
    Counter,
}

/// One exported family.
#[derive(Debug, Clone)]
pub struct Metric {
    /// The field (its name is the family name).
    pub field: &'static Field,
    /// Declared type.
    pub kind: MetricType,
    /// Help text, verbatim from the CSV.
    pub help: String,
}

/// The parsed CSV: families to emit (ascending field id), label fields, skipped names.
#[derive(Debug, Clone, Default)]
pub struct Catalogue {
    /// Families with an NVML source, in field-id order.
    pub metrics: Vec<Metric>,
    /// `label` rows with an NVML source; their value labels every sample (sorted by name).
    pub labels: Vec<&'static Field>,
    /// Known DCGM field names NVML cannot provide, in file order.
    pub unavailable: Vec<String>,
    /// Names that are no DCGM field kiln knows, in file order.
    pub unknown: Vec<String>,
}

/// Why a metrics CSV was rejected; every variant names the 1-based line.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CatalogueError {
    /// A record without exactly three fields.
    #[error("line {line}: expected 3 fields (field, type, help), found {found}")]
    FieldCount {
        /// Line number.
        line: usize,
        /// Fields found.
        found: usize,
    },
    /// A type other than gauge, counter or label.
    #[error("line {line}: unsupported metric type {kind:?} (gauge, counter or label)")]
    BadType {
        /// Line number.
        line: usize,
        /// The type given.
        kind: String,
    },
    /// A double quote left open to the end of the file (a field spanning lines).
    #[error("line {line}: unterminated quoted field")]
    Unterminated {
        /// Line number.
        line: usize,
    },
    /// Bytes the CSV reader could not read (not UTF-8).
    #[error("line {line}: {message}")]
    Malformed {
        /// Line number.
        line: usize,
        /// The reader's message.
        message: String,
    },
}

impl Catalogue {
    /// Parses a metrics CSV.
    ///
    /// # Errors
    /// See [`CatalogueError`]; the first bad line stops parsing. Unknown and unavailable
    /// field names are not errors.
    pub fn parse(csv: &str) -> Result<Self, CatalogueError> {
        // dcgm-exporter's reader (Go's, with TrimLeadingSpace) lets a quoted field start after
        // blanks (`a, "b, c"`); the csv crate only sees a quote that opens the field, so the
        // blanks between a delimiter (or the line start) and a quote are dropped first.
        let csv = quotes_after_blanks_closed_up(csv);
        let csv = csv.as_str();
        let lines: Vec<&str> = csv.lines().collect();
        let mut reader = ::csv::ReaderBuilder::new()
            .has_headers(false)
            .flexible(true)
            .trim(::csv::Trim::All)
            .comment(Some(b'#'))
            .from_reader(csv.as_bytes());
        let mut cat = Catalogue::default();
        for rec in reader.records() {
            let rec = rec.map_err(|e| CatalogueError::Malformed {
                line: e.position().map_or(0, |p| p.line() as usize),
                message: e.to_string(),
            })?;
            let line = rec.position().map_or(0, |p| p.line() as usize);
            // Indented comments and blank lines (the reader only skips `#` in column one).
            if rec.get(0).is_none_or(|f| f.starts_with('#')) || rec.iter().all(str::is_empty) {
                continue;
            }
            // A record is one line: a field spanning lines, or a line with an odd number of
            // quotes (the reader closes a quote left open at the end of the input), has a
            // dangling quote.
            let source = lines
                .get(line.saturating_sub(1))
                .copied()
                .unwrap_or_default();
            if rec.iter().any(|f| f.contains('\n')) || source.matches('"').count() % 2 == 1 {
                return Err(CatalogueError::Unterminated { line });
            }
            let [name, kind, help] = [rec.get(0), rec.get(1), rec.get(2)];
            let (Some(name), Some(kind), Some(help), 3) = (name, kind, help, rec.len()) else {
                return Err(CatalogueError::FieldCount {
                    line,
                    found: rec.len(),
                });
            };
            let kind = match kind {
                "gauge" => Some(MetricType::Gauge),
                "counter" => Some(MetricType::Counter),
                "label" => None,
                _ => {
                    return Err(CatalogueError::BadType {
                        line,
                        kind: kind.to_owned(),
                    });
                }
            };
            let Some(field) = field_by_name(name) else {
                cat.unknown.push(name.to_owned());
                continue;
            };
            if matches!(field.source, Source::Unavailable) {
                cat.unavailable.push(field.name.to_owned());
                continue;
            }
            match kind {
                Some(kind) => cat.metrics.push(Metric {
                    field,
                    kind,
                    help: help.to_owned(),
                }),
                None => cat.labels.push(field),
            }
        }
        cat.metrics.sort_by_key(|m| m.field.id);
        cat.metrics.dedup_by_key(|m| m.field.id);
        cat.labels.sort_by_key(|f| f.name);
        cat.labels.dedup_by_key(|f| f.name);
        Ok(cat)
    }

    /// The embedded default catalogue.
    #[must_use]
    pub fn default_list() -> Self {
        Self::parse(DEFAULT_CSV).expect("the embedded default CSV parses")
    }

    /// Logs one warning per kind of skipped name (unknown, unavailable), naming them all;
    /// nothing when none was skipped. Called once, at start-up.
    pub fn warn_skipped(&self) {
        if !self.unknown.is_empty() {
            tracing::warn!(fields = ?self.unknown, "unknown DCGM fields in the metrics CSV; they are skipped");
        }
        if !self.unavailable.is_empty() {
            tracing::warn!(fields = ?self.unavailable, "NVML cannot provide these DCGM fields; they are skipped");
        }
    }
}

/// `csv` with the spaces and tabs between a line start or a delimiter and a quote that opens a
/// field removed (text inside quotes is kept as it is).
fn quotes_after_blanks_closed_up(csv: &str) -> String {
    let mut out = String::with_capacity(csv.len());
    for line in csv.split_inclusive('\n') {
        let mut pending = String::new();
        let mut at_field_start = true;
        let mut quoted = false;
        for c in line.chars() {
            if quoted {
                quoted = c != '"';
                out.push(c);
                continue;
            }
            match c {
                ' ' | '\t' if at_field_start => pending.push(c),
                '"' => {
                    if !at_field_start {
                        out.push_str(&std::mem::take(&mut pending));
                    }
                    pending.clear();
                    out.push(c);
                    quoted = true;
                    at_field_start = false;
                }
                ',' => {
                    out.push_str(&std::mem::take(&mut pending));
                    out.push(c);
                    at_field_start = true;
                }
                _ => {
                    out.push_str(&std::mem::take(&mut pending));
                    out.push(c);
                    at_field_start = false;
                }
            }
        }
        out.push_str(&pending);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_list_has_the_nvml_backed_dcgm_defaults_in_id_order() {
        let c = Catalogue::default_list();
        let names: Vec<_> = c.metrics.iter().map(|m| m.field.name).collect();
        assert_eq!(names.first(), Some(&"DCGM_FI_DEV_SM_CLOCK"));
        assert_eq!(names.len(), 24);
        assert!(c.metrics.windows(2).all(|w| w[0].field.id < w[1].field.id));
        assert_eq!(
            c.labels.iter().map(|f| f.name).collect::<Vec<_>>(),
            ["DCGM_FI_DRIVER_VERSION"]
        );
        assert!(c.unavailable.is_empty() && c.unknown.is_empty());
        let energy = c.metrics.iter().find(|m| m.field.id == 156).unwrap();
        assert_eq!(energy.kind, MetricType::Counter);
        assert_eq!(energy.help, "Total energy consumption since boot (in mJ).");
    }

    #[test]
    fn quoting_comments_and_unavailable_fields() {
        let csv = "# comment\n\n  # indented comment\n DCGM_FI_DEV_GPU_TEMP , gauge, \"Temp, in C\"\n\
                   DCGM_FI_DEV_VGPU_LICENSE_STATUS, gauge, lic\nDCGM_FI_DEV_POWER_USAGE,gauge,\n\
                   DCGM_FI_NOPE, gauge, h\nDCGM_FI_DEV_BRAND, label, Brand\n";
        let c = Catalogue::parse(csv).unwrap();
        assert_eq!(c.metrics.len(), 2);
        assert_eq!(c.metrics[0].field.name, "DCGM_FI_DEV_GPU_TEMP");
        assert_eq!(c.metrics[0].help, "Temp, in C");
        assert_eq!(c.metrics[1].help, "");
        assert_eq!(c.unavailable, ["DCGM_FI_DEV_VGPU_LICENSE_STATUS"]);
        assert_eq!(c.unknown, ["DCGM_FI_NOPE"]);
        let inner =
            Catalogue::parse("DCGM_FI_DEV_GPU_TEMP,\tgauge,  \"say, \"\"hi\"\" \"\n").unwrap();
        // Doubled quotes inside a quoted field; the reader trims quoted fields too.
        assert_eq!(inner.metrics[0].help, "say, \"hi\"");
        assert_eq!(
            c.labels.iter().map(|f| f.name).collect::<Vec<_>>(),
            ["DCGM_FI_DEV_BRAND"]
        );
    }

    #[test]
    fn errors_name_the_line() {
        assert_eq!(
            Catalogue::parse("DCGM_FI_DEV_GPU_TEMP, gauge\n").unwrap_err(),
            CatalogueError::FieldCount { line: 1, found: 2 }
        );
        assert_eq!(
            Catalogue::parse("DCGM_FI_DEV_GPU_TEMP, histogram, h\n").unwrap_err(),
            CatalogueError::BadType {
                line: 1,
                kind: "histogram".into()
            }
        );
        assert_eq!(
            Catalogue::parse("DCGM_FI_DEV_GPU_TEMP, gauge, \"open\n").unwrap_err(),
            CatalogueError::Unterminated { line: 1 }
        );
    }
}

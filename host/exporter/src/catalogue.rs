//! The metric catalogue: which fields to export, with type and help, read from a CSV in
//! dcgm-exporter's format (reference §1.5) or from the embedded `default-counters.csv`.
//!
//! Format: one record per line, `field, type, help`; `#` starts a comment line; spaces around
//! fields are trimmed; a help text containing a comma must be double-quoted. Types are `gauge`,
//! `counter` and `label`. Differences from dcgm-exporter, all on purpose:
//! - `histogram` and `summary` are rejected (dcgm-exporter accepts them and emits invalid text);
//! - a field NVML cannot provide is not an error: it is kept in [`Catalogue::unavailable`] and
//!   reported by name at start-up, and the rest of the file is used.

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

/// The parsed CSV: families to emit (ascending field id), label fields, unavailable names.
#[derive(Debug, Clone, Default)]
pub struct Catalogue {
    /// Families with an NVML source, in field-id order.
    pub metrics: Vec<Metric>,
    /// `label` rows with an NVML source; their value labels every sample (sorted by name).
    pub labels: Vec<&'static Field>,
    /// Field names listed in the CSV that NVML cannot provide, in file order.
    pub unavailable: Vec<String>,
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
    /// A field name that is no DCGM field kiln knows.
    #[error("line {line}: unknown DCGM field {name:?}")]
    UnknownField {
        /// Line number.
        line: usize,
        /// The name.
        name: String,
    },
    /// A type other than gauge, counter or label.
    #[error("line {line}: unsupported metric type {kind:?} (gauge, counter or label)")]
    BadType {
        /// Line number.
        line: usize,
        /// The type given.
        kind: String,
    },
    /// An unterminated double quote.
    #[error("line {line}: unterminated quoted field")]
    Unterminated {
        /// Line number.
        line: usize,
    },
}

impl Catalogue {
    /// Parses a metrics CSV.
    ///
    /// # Errors
    /// See [`CatalogueError`]; the first bad line stops parsing.
    pub fn parse(csv: &str) -> Result<Self, CatalogueError> {
        let mut cat = Catalogue::default();
        for (n, raw) in csv.lines().enumerate() {
            let line = n + 1;
            if raw.trim().is_empty() || raw.trim_start().starts_with('#') {
                continue;
            }
            let rec = split_record(raw).ok_or(CatalogueError::Unterminated { line })?;
            let [name, kind, help] = rec.as_slice() else {
                return Err(CatalogueError::FieldCount {
                    line,
                    found: rec.len(),
                });
            };
            let field = field_by_name(name).ok_or_else(|| CatalogueError::UnknownField {
                line,
                name: name.clone(),
            })?;
            let kind = match kind.as_str() {
                "gauge" => Some(MetricType::Gauge),
                "counter" => Some(MetricType::Counter),
                "label" => None,
                _ => {
                    return Err(CatalogueError::BadType {
                        line,
                        kind: kind.clone(),
                    });
                }
            };
            if matches!(field.source, Source::Unavailable) {
                cat.unavailable.push(field.name.to_owned());
                continue;
            }
            match kind {
                Some(kind) => cat.metrics.push(Metric {
                    field,
                    kind,
                    help: help.clone(),
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
}

/// Splits one CSV record, trimming spaces around unquoted fields; `None` on a dangling quote.
fn split_record(line: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut field = String::new();
    let mut chars = line.chars().peekable();
    let mut quoted = false;
    let mut was_quoted = false;
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => field.push(c),
            (false, '"') if field.trim().is_empty() => {
                field.clear();
                quoted = true;
                was_quoted = true;
            }
            (false, ',') => {
                out.push(finish(&mut field, was_quoted));
                was_quoted = false;
            }
            (false, c) => field.push(c),
        }
    }
    if quoted {
        return None;
    }
    out.push(finish(&mut field, was_quoted));
    Some(out)
}

fn finish(field: &mut String, quoted: bool) -> String {
    let f = std::mem::take(field);
    if quoted {
        f
    } else {
        f.trim_matches(' ').to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_list_has_the_nvml_backed_dcgm_defaults_in_id_order() {
        let c = Catalogue::default_list();
        let names: Vec<_> = c.metrics.iter().map(|m| m.field.name).collect();
        assert_eq!(names.first(), Some(&"DCGM_FI_DEV_SM_CLOCK"));
        assert_eq!(names.len(), 16);
        assert!(c.metrics.windows(2).all(|w| w[0].field.id < w[1].field.id));
        assert_eq!(
            c.labels.iter().map(|f| f.name).collect::<Vec<_>>(),
            ["DCGM_FI_DRIVER_VERSION"]
        );
        assert!(c.unavailable.is_empty());
        let energy = c.metrics.iter().find(|m| m.field.id == 156).unwrap();
        assert_eq!(energy.kind, MetricType::Counter);
        assert_eq!(energy.help, "Total energy consumption since boot (in mJ).");
    }

    #[test]
    fn quoting_comments_and_unavailable_fields() {
        let csv = "# comment\n\n DCGM_FI_DEV_GPU_TEMP , gauge, \"Temp, in C\"\n\
                   DCGM_FI_PROF_SM_ACTIVE, gauge, ratio\nDCGM_FI_DEV_POWER_USAGE,gauge,\n";
        let c = Catalogue::parse(csv).unwrap();
        assert_eq!(c.metrics.len(), 2);
        assert_eq!(c.metrics[0].field.name, "DCGM_FI_DEV_GPU_TEMP");
        assert_eq!(c.metrics[0].help, "Temp, in C");
        assert_eq!(c.metrics[1].help, "");
        assert_eq!(c.unavailable, ["DCGM_FI_PROF_SM_ACTIVE"]);
    }

    #[test]
    fn errors_name_the_line() {
        assert_eq!(
            Catalogue::parse("DCGM_FI_DEV_GPU_TEMP, gauge\n").unwrap_err(),
            CatalogueError::FieldCount { line: 1, found: 2 }
        );
        assert_eq!(
            Catalogue::parse("#x\nDCGM_FI_NOPE, gauge, h\n").unwrap_err(),
            CatalogueError::UnknownField {
                line: 2,
                name: "DCGM_FI_NOPE".into()
            }
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

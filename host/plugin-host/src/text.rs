//! Bounding text that comes from a plugin (or quotes one) before it is printed, logged or
//! written into a ClusterPolicy status: [`bounded`] is the one rule, used by the host for guest
//! error messages, log lines and captured stdout/stderr, and by the operator for status
//! condition messages and Event notes.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Most bytes of a guest's `transform-error` message (and of the `path` of an invalid field)
/// kept: 1 KiB.
pub const MAX_GUEST_TEXT_BYTES: usize = 1 << 10;
/// Most bytes of one captured log line (a `log` call, or a line of stdout/stderr) kept: 1 KiB.
pub const MAX_LOG_LINE_BYTES: usize = 1 << 10;
/// Most bytes of a message Wasmtime produced about a guest (a trap with its backtrace, which
/// quotes the guest's function names, or a load failure) kept: 4 KiB.
pub const MAX_ENGINE_TEXT_BYTES: usize = 4 << 10;
/// Most bytes of a short name a guest chose (what its `name()` export returned) kept.
pub const MAX_NAME_BYTES: usize = 256;

/// The text of the truncation marker, before the byte count.
const MARKER: &str = "… [truncated, ";

/// `text` made safe to print on one line and bounded to `max_bytes` bytes.
///
/// * Control characters (C0 and C1, DEL: ANSI escapes, CR, newlines that would forge an
///   `error:` line), the Unicode line and paragraph separators and the bidirectional
///   overrides/isolates (U+202A–U+202E, U+2066–U+2069) are written as Rust escapes (`\n`,
///   `\r`, `\t`, `\u{1b}`), so the result is one line that shows what the guest wrote.
/// * When the escaped text is longer than `max_bytes`, it is cut at a character boundary and
///   ends with the marker `… [truncated, N bytes]` (N: the byte length of the original text);
///   marker included, the result has at most `max_bytes` bytes (for `max_bytes` ≥ 64).
///
/// Text needing neither is returned borrowed, so the common case costs one scan.
pub fn bounded(text: &str, max_bytes: usize) -> Cow<'_, str> {
    if text.len() <= max_bytes && !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let total: usize = text.chars().map(escaped_len).sum();
    let (budget, marker) = if total <= max_bytes {
        (max_bytes, None)
    } else {
        let marker = format!("{MARKER}{} bytes]", text.len());
        (max_bytes.saturating_sub(marker.len()), Some(marker))
    };
    let mut out = String::with_capacity(total.min(max_bytes));
    for c in text.chars() {
        if out.len() + escaped_len(c) > budget {
            break;
        }
        if needs_escape(c) {
            let _ = write!(out, "{}", c.escape_default());
        } else {
            out.push(c);
        }
    }
    if let Some(marker) = marker {
        out.push_str(&marker);
    }
    Cow::Owned(out)
}

/// Bytes `c` takes in [`bounded`]'s output.
fn escaped_len(c: char) -> usize {
    if needs_escape(c) {
        c.escape_default().count()
    } else {
        c.len_utf8()
    }
}

/// Characters [`bounded`] escapes.
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// [`bounded`], owned.
pub(crate) fn bounded_owned(text: String, max_bytes: usize) -> String {
    match bounded(&text, max_bytes) {
        Cow::Borrowed(_) => text,
        Cow::Owned(o) => o,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_short_text_is_borrowed() {
        assert!(matches!(
            bounded("plain text ü", 64),
            Cow::Borrowed("plain text ü")
        ));
    }

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(
            bounded("red \u{1b}[31mX\r\nerror: forged\t\u{202e}", 200),
            r"red \u{1b}[31mX\r\nerror: forged\t\u{202e}"
        );
        assert_eq!(bounded("a\u{7f}\u{85}b", 200), r"a\u{7f}\u{85}b");
    }

    #[test]
    fn long_text_is_cut_with_a_marker_within_the_bound() {
        let text = "é".repeat(10_000);
        let out = bounded(&text, 100);
        assert!(out.len() <= 100, "{}", out.len());
        assert!(out.ends_with("… [truncated, 20000 bytes]"), "{out}");
        assert!(out.starts_with("éé"));
        let escaped = "\u{1b}".repeat(100);
        let out = bounded(&escaped, 80);
        assert!(out.len() <= 80 && out.starts_with(r"\u{1b}\u{1b}"), "{out}");
        assert!(out.ends_with("[truncated, 100 bytes]"), "{out}");
    }

    #[test]
    fn text_exactly_at_the_bound_is_kept_whole() {
        let text = "x".repeat(100);
        assert_eq!(bounded(&text, 100), text);
        // Escaping pushes it over: cut.
        let text = format!("{}\n", "x".repeat(99));
        assert!(bounded(&text, 100).contains("[truncated, 100 bytes]"));
        // Escaped, but fits.
        assert_eq!(bounded("a\nb", 100), r"a\nb");
    }
}

//! The text dcgm-exporter puts in the `err_msg` label of `DCGM_FI_DEV_XID_ERRORS` series: NVIDIA's
//! short description of each XID (`xid-messages.tsv`, embedded), or [`UNKNOWN`] for a number
//! the catalogue does not list.

use std::sync::OnceLock;

/// The message for an XID the catalogue does not list (dcgm-exporter's).
pub const UNKNOWN: &str = "Unknown Error";

const TABLE: &str = include_str!("../xid-messages.tsv");

/// The catalogue's message for `xid`, or [`UNKNOWN`].
#[must_use]
pub fn message(xid: u64) -> &'static str {
    static MESSAGES: OnceLock<Vec<&'static str>> = OnceLock::new();
    let messages = MESSAGES.get_or_init(|| {
        let mut v = Vec::new();
        for line in TABLE.lines().filter(|l| !l.starts_with('#')) {
            let (n, text) = line.split_once('\t').expect("xid-messages.tsv: N<tab>text");
            let n: usize = n.parse().expect("xid-messages.tsv: a number");
            assert_eq!(n, v.len(), "xid-messages.tsv lists every number in order");
            v.push(text);
        }
        v
    });
    usize::try_from(xid)
        .ok()
        .and_then(|i| messages.get(i).copied())
        .unwrap_or(UNKNOWN)
}

#[cfg(test)]
mod tests {
    #[test]
    fn known_numbers_have_their_message_and_others_the_unknown_text() {
        assert_eq!(super::message(0), "No Error");
        assert_eq!(super::message(31), "GPU memory page fault");
        assert_eq!(super::message(79), "GPU has fallen off the bus");
        assert_eq!(super::message(172), "Uncorrectable SRAM Error");
        assert_eq!(super::message(173), super::UNKNOWN);
        assert_eq!(super::message(u64::MAX), super::UNKNOWN);
    }
}

//! The output pipeline: what a cell printed, made bounded and safe to show
//! to a model.
//!
//! Every backend feeds the raw bytes of a cell's stdout and stderr through
//! the same steps:
//!
//! 1. **Cap** ([`Capture`]): each stream keeps everything up to
//!    [`OutputLimits::cap_bytes`]. Past that it keeps a head (the first
//!    [`OutputLimits::head_percent`] of the cap) and a ring of the most
//!    recent bytes as its tail, so host memory per stream stays at about
//!    `cap_bytes` plus one chunk whatever the cell prints. Between head and
//!    tail the result carries a marker saying how many bytes were cut.
//! 2. **Spill**: once a stream is cut, its raw bytes also go to a private
//!    file (mode 0600, at most [`OutputLimits::spill_cap_bytes`]), so the
//!    full text can be handed back ([`Captured::full`]) for the caller to
//!    keep with the session. The raw file itself is temporary.
//! 3. **Clean** ([`Cleaner`]): lossy UTF-8 decode, ANSI escape strip (7-bit
//!    `ESC` sequences and the C1 controls U+0080–U+009F), then secret
//!    redaction (known token formats wherever they start, private-key
//!    blocks, `Bearer …` and the exact values of the host's secrets: those
//!    it scrubbed from the child's environment, the daemon's token, tool
//!    credentials). docs/security-redaction.md has the whole picture. Head and tail are cleaned separately so the marker
//!    between them is never touched, and the words that straddle a cut are
//!    checked for partial secrets.
//!
//! Cleaning happens once, when a cell finishes ([`Capture::finish`]); while
//! the cell runs only raw bytes are kept, unless a caller streams the
//! output: then a [`stream::LineTap`] on the capture cleans and sends it
//! line by line, never cutting where a secret could straddle the cut
//! (`hold.rs`).

mod capture;
mod clean;
pub(crate) mod finish;
mod hold;
mod redact;
pub mod stream;

pub use capture::{Capture, Captured};
pub use clean::Cleaner;
pub use stream::{LineTap, OnStop};

/// How much of a cell's output is kept.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputLimits {
    /// Max bytes of one stream kept in a cell result (default 50_000).
    pub cap_bytes: usize,
    /// Percent of cap_bytes kept from the head (default 40; rest is the tail).
    /// Values above 100 count as 100.
    pub head_percent: u8,
    /// Max bytes of the full text spilled to a file when cut (default 5 * 1024 * 1024).
    /// 0 turns spilling off: a cut stream then has no full text and its
    /// marker only says how much was cut (useful to cap a single field).
    pub spill_cap_bytes: u64,
}

impl Default for OutputLimits {
    fn default() -> Self {
        OutputLimits {
            cap_bytes: 50_000,
            head_percent: 40,
            spill_cap_bytes: 5 * 1024 * 1024,
        }
    }
}

impl OutputLimits {
    /// Bytes kept from the start of a stream once it is cut.
    pub(crate) fn head_bytes(&self) -> usize {
        let percent = u128::from(self.head_percent.min(100));
        (self.cap_bytes as u128 * percent / 100) as usize
    }

    /// Bytes kept from the end of a stream once it is cut.
    pub(crate) fn tail_bytes(&self) -> usize {
        self.cap_bytes - self.head_bytes()
    }
}

/// `1234567` -> `"1,234,567"`: byte counts a person (or model) reads at a
/// glance.
pub(crate) fn group_digits(n: u64) -> String {
    let digits = n.to_string();
    digits
        .as_bytes()
        .rchunks(3)
        .rev()
        .map(|group| std::str::from_utf8(group).expect("digits are ASCII"))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_limits_match_the_design() {
        let limits = OutputLimits::default();
        assert_eq!(limits.cap_bytes, 50_000);
        assert_eq!(limits.head_bytes(), 20_000);
        assert_eq!(limits.tail_bytes(), 30_000);
        assert_eq!(limits.spill_cap_bytes, 5_242_880);
    }

    #[test]
    fn head_percent_above_100_keeps_only_a_head() {
        let limits = OutputLimits {
            cap_bytes: 1000,
            head_percent: 250,
            ..OutputLimits::default()
        };
        assert_eq!(limits.head_bytes(), 1000);
        assert_eq!(limits.tail_bytes(), 0);
    }

    #[test]
    fn byte_counts_are_grouped_by_thousands() {
        assert_eq!(group_digits(0), "0");
        assert_eq!(group_digits(999), "999");
        assert_eq!(group_digits(1000), "1,000");
        assert_eq!(group_digits(99_950_000), "99,950,000");
        assert_eq!(group_digits(u64::MAX), "18,446,744,073,709,551,615");
    }
}

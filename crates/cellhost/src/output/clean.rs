//! Raw output bytes to text a model can read.
//!
//! [`Cleaner::clean`] runs three steps in order: lossy UTF-8 decode (invalid
//! bytes become U+FFFD; NUL and other control bytes are kept), ANSI escape
//! strip ([`strip_ansi`]), then secret redaction (`redact.rs`). Each step
//! borrows when it has nothing to do, so clean ASCII output costs a few
//! scans and one copy.

use std::borrow::Cow;
use std::sync::Arc;

use super::redact::{self, Secrets};

/// Turns raw bytes into text a model can read: lossy UTF-8 decode, ANSI escape
/// strip (CSI, OSC incl. BEL- and ST-terminated, other 2-byte ESC sequences, lone ESC),
/// then secret redaction. Cheap to clone (Arc inside); built once per kernel.
#[derive(Clone, Debug)]
pub struct Cleaner {
    secrets: Arc<Secrets>,
}

/// Which side of a cut a piece of text sits on (see [`Cleaner::clean_part`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Edges {
    /// The text starts right after a cut (it is a capture's tail).
    pub(crate) cut_before: bool,
    /// The text ends right before a cut (it is a capture's head).
    pub(crate) cut_after: bool,
}

impl Default for Cleaner {
    /// A cleaner that redacts known token formats only.
    fn default() -> Self {
        Cleaner::new(Vec::new())
    }
}

impl Cleaner {
    /// `secrets`: exact values to redact (values of env vars the host scrubbed
    /// from the child), each replaced by `[REDACTED:secret]`.
    ///
    /// Values shorter than 8 bytes are ignored: short values (`"1"`,
    /// `"true"`, a port) occur in ordinary output too often to redact. Values
    /// are matched exactly (no trimming, case-sensitive).
    pub fn new(secrets: impl IntoIterator<Item = String>) -> Self {
        Cleaner {
            secrets: Arc::new(Secrets::new(secrets)),
        }
    }

    /// Decodes (lossy), strips ANSI escapes and redacts secrets.
    pub fn clean(&self, raw: &[u8]) -> String {
        self.clean_part(raw, Edges::default())
    }

    /// Redaction only (for text that is already valid UTF-8, e.g. a traceback).
    pub fn redact(&self, text: &str) -> String {
        redact::redact(text, &self.secrets).into_owned()
    }

    /// [`Cleaner::clean`] for a piece of a longer stream: a secret split by a
    /// cut leaves fragments that the whole-token patterns miss, so the text
    /// next to a cut gets the fragment checks too.
    pub(crate) fn clean_part(&self, raw: &[u8], edges: Edges) -> String {
        let decoded = String::from_utf8_lossy(raw);
        let stripped = strip_ansi(&decoded);
        let mut text = match redact::redact(&stripped, &self.secrets) {
            Cow::Borrowed(_) => stripped.into_owned(),
            Cow::Owned(text) => text,
        };
        if edges.cut_after {
            text = redact::redact_cut_end(text, &self.secrets);
        }
        if edges.cut_before {
            text = redact::redact_cut_start(text, &self.secrets);
        }
        text
    }
}

const ESC: u8 = 0x1b;
const BEL: u8 = 0x07;

/// Removes ANSI escape sequences (ECMA-48): CSI (`ESC [` … final byte),
/// string sequences (`ESC ]` OSC, `ESC P` DCS, `ESC X`, `ESC ^`, `ESC _`)
/// terminated by BEL or ST (`ESC \`), other ESC sequences (`ESC` optional
/// intermediates, one final byte: `ESC 7`, `ESC ( B`, `ESC c`, ...) and a
/// lone ESC.
///
/// A sequence cut off by the end of the text is removed. A malformed CSI
/// (a byte that is neither parameter, intermediate nor final) is dropped up
/// to that byte, which is kept. A string sequence with no terminator ends
/// at the next newline (kept), so one stray `ESC ]` cannot swallow the rest
/// of the output.
pub(crate) fn strip_ansi(text: &str) -> Cow<'_, str> {
    let bytes = text.as_bytes();
    let Some(first) = bytes.iter().position(|&b| b == ESC) else {
        return Cow::Borrowed(text);
    };
    let mut out = String::with_capacity(text.len());
    let mut kept_from = 0;
    let mut i = first;
    while i < bytes.len() {
        if bytes[i] != ESC {
            i += 1;
            continue;
        }
        out.push_str(&text[kept_from..i]);
        i = skip_escape(bytes, i);
        kept_from = i;
    }
    out.push_str(&text[kept_from..]);
    Cow::Owned(out)
}

/// Given `bytes[start] == ESC`, returns the index just past the escape
/// sequence. Every index returned is at an ASCII byte or the end, so it is
/// a char boundary of valid UTF-8.
fn skip_escape(bytes: &[u8], start: usize) -> usize {
    let len = bytes.len();
    let mut i = start + 1;
    let Some(&kind) = bytes.get(i) else {
        return len;
    };
    match kind {
        b'[' => {
            i += 1;
            // Parameter bytes, then intermediate bytes, then one final byte.
            while i < len && (0x30..=0x3f).contains(&bytes[i]) {
                i += 1;
            }
            while i < len && (0x20..=0x2f).contains(&bytes[i]) {
                i += 1;
            }
            match bytes.get(i) {
                Some(0x40..=0x7e) => i + 1,
                Some(_) => i,
                None => len,
            }
        }
        b']' | b'P' | b'X' | b'^' | b'_' => {
            i += 1;
            while i < len {
                match bytes[i] {
                    BEL => return i + 1,
                    ESC if bytes.get(i + 1) == Some(&b'\\') => return i + 2,
                    // Another escape aborts the string; it is handled next.
                    ESC | b'\n' => return i,
                    _ => i += 1,
                }
            }
            len
        }
        0x20..=0x2f => {
            while i < len && (0x20..=0x2f).contains(&bytes[i]) {
                i += 1;
            }
            match bytes.get(i) {
                Some(0x30..=0x7e) => i + 1,
                Some(_) => i,
                None => len,
            }
        }
        0x30..=0x7e => i + 1,
        // A lone ESC: drop it, keep whatever follows.
        _ => i,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn clean(raw: &[u8]) -> String {
        Cleaner::default().clean(raw)
    }

    #[test]
    fn plain_text_passes_through() {
        assert_eq!(clean(b"1\n"), "1\n");
        assert_eq!(clean(b""), "");
        assert_eq!(clean("héllo wörld\n".as_bytes()), "héllo wörld\n");
    }

    #[test]
    fn ansi_colour_codes_are_stripped() {
        assert_eq!(clean(b"\x1b[31mred\x1b[0m plain"), "red plain");
        assert_eq!(clean(b"\x1b[1;38;5;208mbold\x1b[m"), "bold");
        assert_eq!(clean(b"\x1b[38;2;255;0;0mrgb\x1b[39m"), "rgb");
    }

    #[test]
    fn cursor_movement_and_erase_sequences_are_stripped() {
        assert_eq!(clean(b"a\x1b[2K\x1b[1Gb\x1b[?25l\x1b[?25h"), "ab");
    }

    #[test]
    fn osc_titles_terminated_by_bel_are_stripped() {
        assert_eq!(clean(b"\x1b]0;my title\x07text"), "text");
    }

    #[test]
    fn osc_sequences_terminated_by_st_are_stripped() {
        assert_eq!(
            clean(b"\x1b]8;;https://example.com\x1b\\link\x1b]8;;\x1b\\ done"),
            "link done"
        );
    }

    #[test]
    fn an_unterminated_osc_ends_at_the_newline() {
        assert_eq!(clean(b"a\x1b]0;title\nnext line\n"), "a\nnext line\n");
    }

    #[test]
    fn other_escape_sequences_are_stripped() {
        assert_eq!(clean(b"\x1b7saved\x1b8"), "saved");
        assert_eq!(clean(b"\x1b(Bcharset\x1b=\x1b>"), "charset");
        assert_eq!(clean(b"\x1bcreset"), "reset");
        assert_eq!(clean(b"\x1bPq#0;2;0;0;0\x1b\\after"), "after");
    }

    #[test]
    fn a_lone_esc_is_dropped() {
        assert_eq!(clean(b"a\x1b"), "a");
        assert_eq!(clean(b"a\x1b\nb"), "a\nb");
        assert_eq!(clean("a\x1bébc".as_bytes()), "aébc");
    }

    #[test]
    fn an_escape_cut_off_by_the_end_is_removed() {
        assert_eq!(clean(b"text\x1b[38;5"), "text");
        assert_eq!(clean(b"text\x1b]0;tit"), "text");
    }

    #[test]
    fn a_malformed_csi_keeps_the_byte_that_broke_it() {
        assert_eq!(clean(b"\x1b[12\nnext"), "\nnext");
        assert_eq!(clean("\x1b[1é".as_bytes()), "é");
    }

    #[test]
    fn invalid_utf8_becomes_replacement_characters() {
        assert_eq!(clean(b"ok \xff\xfe end"), "ok \u{fffd}\u{fffd} end");
        assert_eq!(clean(b"cut \xe2\x82"), "cut \u{fffd}");
    }

    #[test]
    fn nul_bytes_survive() {
        assert_eq!(clean(b"a\0b\0"), "a\0b\0");
    }

    #[test]
    fn escape_codes_inside_a_token_do_not_hide_it() {
        let raw = b"\x1b[32mAKIAIOSF\x1b[0mODNN7EXAMPLE\x1b[0m";
        assert_eq!(clean(raw), "[REDACTED:aws_access_key]");
    }

    #[test]
    fn secrets_passed_in_are_redacted() {
        let cleaner = Cleaner::new(vec!["correct-horse-battery".to_string()]);
        assert_eq!(
            cleaner.clean(b"pw=correct-horse-battery\n"),
            "pw=[REDACTED:secret]\n"
        );
        assert_eq!(
            cleaner.redact("Traceback: correct-horse-battery"),
            "Traceback: [REDACTED:secret]"
        );
    }

    #[test]
    fn clones_share_their_secrets() {
        let cleaner = Cleaner::new(vec!["correct-horse-battery".to_string()]);
        let clone = cleaner.clone();
        assert!(Arc::ptr_eq(&cleaner.secrets, &clone.secrets));
    }

    #[test]
    fn an_escape_inside_an_unterminated_osc_starts_a_new_sequence() {
        assert_eq!(clean(b"\x1b]0;title\x1b[31mred\x1b[0m"), "red");
    }

    /// Bytes that build (and break) escape sequences and UTF-8 characters;
    /// picked through a table because `prop_oneof!` is slow in debug builds.
    const ESCAPE_HEAVY: &[u8] = b"\x1b\x1b\x1b[[]\\\x07\n\nPm;01\xe2\x82\xac\xc3\xa9\xffaZ -_";

    fn escape_heavy() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(any::<u8>(), 0..512).prop_map(|picks| {
            picks
                .iter()
                .map(|&p| ESCAPE_HEAVY[usize::from(p) % ESCAPE_HEAVY.len()])
                .collect()
        })
    }

    /// Secrets that contain an escape and multi-byte characters.
    static WITH_SECRETS: std::sync::LazyLock<Cleaner> = std::sync::LazyLock::new(|| {
        Cleaner::new(vec![
            "\u{1b}[31msecret\u{1b}".to_string(),
            "ééééé".to_string(),
        ])
    });

    proptest! {
        #[test]
        fn the_cleaner_never_panics_on_arbitrary_bytes(
            raw in proptest::collection::vec(any::<u8>(), 0..2048),
            cut_before in any::<bool>(),
            cut_after in any::<bool>(),
        ) {
            let _ = WITH_SECRETS.clean_part(&raw, Edges { cut_before, cut_after });
        }

        #[test]
        fn the_cleaner_never_panics_on_escape_heavy_bytes(
            raw in escape_heavy(),
        ) {
            let cleaned = clean(&raw);
            prop_assert!(!cleaned.contains('\x1b'), "{cleaned:?}");
        }

        #[test]
        fn stripping_removes_every_esc(text in any::<String>()) {
            prop_assert!(!strip_ansi(&text).contains('\x1b'));
        }
    }
}

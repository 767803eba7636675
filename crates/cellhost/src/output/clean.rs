//! Raw output bytes to text a model can read.
//!
//! [`Cleaner::clean`] runs three steps in order: lossy UTF-8 decode (invalid
//! bytes become U+FFFD; NUL and other C0 control bytes are kept), ANSI
//! escape strip ([`strip_ansi`]: 7-bit `ESC` sequences and the 8-bit C1
//! controls U+0080–U+009F, which a terminal may obey just the same), then
//! secret redaction (`redact.rs`). Each step
//! borrows when it has nothing to do, so clean ASCII output costs a few
//! scans and one copy.

use std::borrow::Cow;
use std::sync::Arc;

use super::redact::{self, Secrets};

/// Turns raw bytes into text a model can read: lossy UTF-8 decode, ANSI escape
/// strip (CSI, OSC incl. BEL- and ST-terminated, other 2-byte ESC sequences, lone ESC,
/// and their C1 forms), then secret redaction. Cheap to clone (Arc inside); built once per kernel.
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

    /// The exact values this cleaner redacts (for the live tap's hold).
    pub(crate) fn secrets(&self) -> &Secrets {
        &self.secrets
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
/// The first UTF-8 byte of U+0080–U+00BF; `C1_LEAD` then 0x80–0x9F is a
/// C1 control.
const C1_LEAD: u8 = 0xc2;
/// Second bytes of the C1 controls that start a sequence.
const C1_CSI: u8 = 0x9b;
const C1_ST: u8 = 0x9c;
/// DCS, SOS, OSC, PM, APC: string sequences like `ESC P`, `ESC X`, ...
const C1_STRINGS: [u8; 5] = [0x90, 0x98, 0x9d, 0x9e, 0x9f];

/// `true` when `bytes[i..]` starts with a C1 control (U+0080–U+009F).
fn c1_at(bytes: &[u8], i: usize) -> bool {
    bytes[i] == C1_LEAD && bytes.get(i + 1).is_some_and(|b| (0x80..=0x9f).contains(b))
}

/// Removes ANSI escape sequences (ECMA-48): CSI (`ESC [` … final byte),
/// string sequences (`ESC ]` OSC, `ESC P` DCS, `ESC X`, `ESC ^`, `ESC _`)
/// terminated by BEL or ST (`ESC \`), other ESC sequences (`ESC` optional
/// intermediates, one final byte: `ESC 7`, `ESC ( B`, `ESC c`, ...) and a
/// lone ESC. The C1 controls are their 8-bit forms and go the same way:
/// U+009B (CSI) like `ESC [`, U+0090/98/9D/9E/9F like `ESC P X ] ^ _`
/// (also ended by U+009C, ST), any other C1 control on its own.
///
/// A sequence cut off by the end of the text is removed. A malformed CSI
/// (a byte that is neither parameter, intermediate nor final) is dropped up
/// to that byte, which is kept. A string sequence with no terminator ends
/// at the next newline (kept), so one stray `ESC ]` cannot swallow the rest
/// of the output.
pub(crate) fn strip_ansi(text: &str) -> Cow<'_, str> {
    let bytes = text.as_bytes();
    let Some(first) = (0..bytes.len()).find(|&i| bytes[i] == ESC || c1_at(bytes, i)) else {
        return Cow::Borrowed(text);
    };
    let mut out = String::with_capacity(text.len());
    let mut kept_from = 0;
    let mut i = first;
    while i < bytes.len() {
        let c1 = c1_at(bytes, i);
        if bytes[i] != ESC && !c1 {
            i += 1;
            continue;
        }
        out.push_str(&text[kept_from..i]);
        i = if c1 {
            skip_c1(bytes, i)
        } else {
            skip_escape(bytes, i)
        };
        kept_from = i;
    }
    out.push_str(&text[kept_from..]);
    Cow::Owned(out)
}

/// The index just past the escape sequence or C1 control that starts at
/// `bytes[i]`, or `None` when none starts there.
pub(super) fn escape_end(bytes: &[u8], i: usize) -> Option<usize> {
    if bytes[i] == ESC {
        Some(skip_escape(bytes, i))
    } else if c1_at(bytes, i) {
        Some(skip_c1(bytes, i))
    } else {
        None
    }
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
        b'[' => skip_csi_body(bytes, i + 1),
        b']' | b'P' | b'X' | b'^' | b'_' => skip_string_body(bytes, i + 1),
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

/// Given a C1 control at `bytes[start..start + 2]`, returns the index just
/// past it and the sequence it starts.
fn skip_c1(bytes: &[u8], start: usize) -> usize {
    match bytes[start + 1] {
        C1_CSI => skip_csi_body(bytes, start + 2),
        b if C1_STRINGS.contains(&b) => skip_string_body(bytes, start + 2),
        // ST on its own, NEL, IND, ...: drop the control alone.
        _ => start + 2,
    }
}

/// A CSI after its introducer: parameter bytes, then intermediate bytes,
/// then one final byte.
fn skip_csi_body(bytes: &[u8], mut i: usize) -> usize {
    let len = bytes.len();
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

/// A string sequence (OSC, DCS, ...) after its introducer, through its
/// terminator: BEL, `ESC \\` or ST (U+009C). Another escape or C1
/// control aborts it (handled next); so does a newline (kept).
fn skip_string_body(bytes: &[u8], mut i: usize) -> usize {
    let len = bytes.len();
    while i < len {
        match bytes[i] {
            BEL => return i + 1,
            ESC if bytes.get(i + 1) == Some(&b'\\') => return i + 2,
            C1_LEAD if bytes.get(i + 1) == Some(&C1_ST) => return i + 2,
            ESC | b'\n' => return i,
            _ if c1_at(bytes, i) => return i,
            _ => i += 1,
        }
    }
    len
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

    #[test]
    fn c1_csi_and_osc_are_stripped_with_their_sequences() {
        assert_eq!(clean("A\u{9b}2JB\u{9d}0;pwned\u{7}C".as_bytes()), "ABC");
        assert_eq!(clean("x\u{9b}1;31my".as_bytes()), "xy");
        assert_eq!(clean("\u{9d}8;;https://e.com\u{9c}link".as_bytes()), "link");
        assert_eq!(clean("\u{90}q#0\u{1b}\\after".as_bytes()), "after");
    }

    #[test]
    fn other_c1_controls_are_dropped_and_latin1_text_is_kept() {
        assert_eq!(clean("a\u{85}b\u{9c}c\u{80}d\u{9f}".as_bytes()), "abcd");
        assert_eq!(clean("café ©°µ ½ ÿ\n".as_bytes()), "café ©°µ ½ ÿ\n");
    }

    #[test]
    fn an_unterminated_c1_string_ends_at_the_newline_or_the_next_escape() {
        assert_eq!(clean("a\u{9d}0;title\nnext".as_bytes()), "a\nnext");
        assert_eq!(clean("\u{9d}0;t\u{9b}31mred".as_bytes()), "red");
        assert_eq!(clean("\u{1b}]0;t\u{9b}31mred".as_bytes()), "red");
    }

    #[test]
    fn raw_c1_bytes_that_are_not_utf8_become_replacement_characters() {
        assert_eq!(clean(b"a\x9b2Jb"), "a\u{fffd}2Jb");
    }

    /// Bytes that build (and break) escape sequences and UTF-8 characters;
    /// picked through a table because `prop_oneof!` is slow in debug builds.
    const ESCAPE_HEAVY: &[u8] =
        b"\x1b\x1b\x1b[[]\\\x07\n\nPm;01\xe2\x82\xac\xc3\xa9\xffaZ -_\xc2\xc2\x9b\x9d\x9c\x85";

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
            prop_assert!(!cleaned.chars().any(|c| ('\u{80}'..='\u{9f}').contains(&c)), "{cleaned:?}");
        }

        #[test]
        fn stripping_removes_every_esc(text in any::<String>()) {
            let stripped = strip_ansi(&text);
            prop_assert!(!stripped.contains('\x1b'));
            prop_assert!(!stripped.chars().any(|c| ('\u{80}'..='\u{9f}').contains(&c)), "{stripped:?}");
        }
    }
}

//! Where the live tap (`stream.rs`) may cut held output so that no secret
//! straddles the cut.
//!
//! The tap cleans every piece it releases on its own: a secret split
//! between two pieces would reach the stream as two halves that no pattern
//! matches. So a cut is moved back (more is held) until nothing can cross
//! it, judging by the text already held after the cut too:
//!
//! - **At a line end** only an exact secret value with a line break can
//!   straddle (no token format spans a line; private-key blocks are held
//!   whole by the tap): [`settle`] moves the cut to where such a value
//!   would start, until the next lines show it is not one.
//! - **In a line longer than the hold** ([`long_line_cut`]) the cut goes
//!   after the last separator (a space, a tab, punctuation that no token
//!   contains) that is not inside an escape sequence, not after an open
//!   `Bearer` or a private key's BEGIN marker, and not inside a prefix of
//!   a secret value. A line with no such separator (a 16 KiB run of token
//!   characters) is cut [`HOLD_BACK`](super::stream::HOLD_BACK) bytes
//!   from its end, moved back before a token that starts near the cut;
//!   that piece gets the fragment checks of a cut capture.

use std::sync::LazyLock;

use regex::bytes::Regex;

use super::clean::{escape_end, strip_ansi};
use super::redact::Secrets;

/// How far before a forced cut a token's start is looked for: longer than
/// every token format but JWTs and private keys.
const TOKEN_REACH: usize = 512;

/// How much text before a separator is checked for an open `Bearer`.
const OPEN_WINDOW: usize = 160;

/// Where a known token format can start.
static TOKEN_START: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(concat!(
        r"gh[pousr]_|github_pat_|AKIA|ASIA|sk-|[rs]k_(?:live|test)_|xox[abposr]-",
        r"|AIza|eyJ|(?i:bearer)|-----BEGIN ",
    ))
    .expect("the token-start regex is valid")
});

/// The literal starts of the token formats: a proper prefix of one right
/// before a forced cut may be the start of a token.
const STARTS: &[&str] = &[
    "ghp_",
    "gho_",
    "ghu_",
    "ghs_",
    "ghr_",
    "github_pat_",
    "AKIA",
    "ASIA",
    "sk-",
    "sk_live_",
    "sk_test_",
    "rk_live_",
    "rk_test_",
    "xoxa-",
    "xoxb-",
    "xoxp-",
    "xoxo-",
    "xoxs-",
    "xoxr-",
    "AIza",
    "eyJ",
    "bearer",
    "-----BEGIN ",
];

/// Moves a cut at `at` back before any secret value that could straddle
/// it.
pub(super) fn settle(pending: &[u8], mut at: usize, secrets: &Secrets) -> usize {
    while at > 0 {
        match secrets.straddle(&pending[..at], &pending[at..]) {
            Some(k) => at -= k,
            None => break,
        }
    }
    at
}

/// `true` when the line holds a private key's BEGIN marker with no END
/// after it: the tap then holds it like a key block.
pub(super) fn key_opens(line: &[u8]) -> bool {
    let Some(begin) = find(line, b"-----BEGIN ") else {
        return false;
    };
    let rest = &line[begin..];
    find(rest, b"PRIVATE KEY").is_some() && find(rest, b"-----END ").is_none()
}

/// Where to cut a held line longer than the hold, and whether the cut is
/// forced (no safe separator: the piece needs the fragment checks).
pub(super) fn long_line_cut(pending: &[u8], hold_back: usize, secrets: &Secrets) -> (usize, bool) {
    let spans = escape_spans(pending);
    let inside = |at: usize| spans.iter().any(|&(s, e)| s < at && at < e);
    for i in (0..pending.len()).rev() {
        if !is_separator(pending[i]) {
            continue;
        }
        let at = i + 1;
        if inside(at)
            || opens_a_secret(&pending[..at])
            || secrets.straddle(&pending[..at], &pending[at..]).is_some()
        {
            continue;
        }
        return (at, false);
    }
    let mut at = pending.len().saturating_sub(hold_back);
    while at > 0 && pending[at] & 0xC0 == 0x80 {
        at -= 1;
    }
    if let Some(&(s, _)) = spans.iter().find(|&&(s, e)| s < at && at < e) {
        at = s;
    }
    let from = at.saturating_sub(TOKEN_REACH);
    if let Some(m) = TOKEN_START.find(&pending[from..at]) {
        at = from + m.start();
    }
    at -= partial_start(&pending[..at]);
    (settle(pending, at, secrets), true)
}

/// A byte no token format contains: a cut right after it cannot split a
/// token (`\` is left out: it starts the escape a token may follow).
fn is_separator(b: u8) -> bool {
    b == b' ' || b == b'\t' || (b.is_ascii_punctuation() && !b"-_.~+/=\\".contains(&b))
}

/// `true` when `before` ends in a `Bearer` still waiting for its token, or
/// its last line holds a private key's BEGIN marker (whole or cut).
fn opens_a_secret(before: &[u8]) -> bool {
    let window = &before[before.len().saturating_sub(OPEN_WINDOW)..];
    let decoded = String::from_utf8_lossy(window);
    let text = strip_ansi(&decoded);
    let last_line = text.rsplit('\n').next().unwrap_or("");
    if last_line.contains("-----BEGIN") {
        return true;
    }
    let trimmed = last_line.trim_end_matches([' ', '\t']);
    trimmed.len() >= 6
        && trimmed.is_char_boundary(trimmed.len() - 6)
        && trimmed[trimmed.len() - 6..].eq_ignore_ascii_case("bearer")
}

/// The length of the longest proper prefix of a token's literal start that
/// `before` ends with (`gh`, `AKI`, `Bear`).
fn partial_start(before: &[u8]) -> usize {
    STARTS
        .iter()
        .filter_map(|start| {
            let start = start.as_bytes();
            (1..start.len()).rev().find(|&k| {
                before.len() >= k && before[before.len() - k..].eq_ignore_ascii_case(&start[..k])
            })
        })
        .max()
        .unwrap_or(0)
}

/// Byte ranges of the escape sequences (7-bit and C1) in `bytes`.
fn escape_spans(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut spans = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match escape_end(bytes, i) {
            Some(end) => {
                spans.push((i, end));
                i = end.max(i + 1);
            }
            None => i += 1,
        }
    }
    spans
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

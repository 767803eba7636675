//! Bounding the text of one history row.
//!
//! A cell's code can be as large as a request body (megabytes); its
//! output is already capped by the output pipeline, but an operator may
//! raise that cap. The history keeps at most `[history] max_field_bytes`
//! of each text field: the head and the tail, around a marker saying how
//! much was cut. A cut code's marker also carries the sha256 of the full
//! code as recorded (after redaction), so a client can tell which code
//! ran. The same cut is applied when rows are read, so a row written by
//! an older version is bounded too.

use sha2::{Digest, Sha256};

/// The marker's opening, as it appears in a cut field.
pub const CUT_MARKER: &str = "[cellhost: ";

/// `text` cut to about `max` bytes: head and tail around a marker.
/// `code` adds the full text's sha256 to the marker (as a Python comment
/// line, so the cut code still reads as code).
pub fn cap_text(text: &str, max: usize, code: bool) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let marker = if code {
        format!(
            "\n# {CUT_MARKER}{} bytes of code cut here; the full code was {} bytes, sha256 {}]\n",
            text.len().saturating_sub(max),
            text.len(),
            sha256_hex(text.as_bytes())
        )
    } else {
        format!(
            "\n{CUT_MARKER}{} bytes cut here; the full text was {} bytes]\n",
            text.len().saturating_sub(max),
            text.len()
        )
    };
    let keep = max.saturating_sub(marker.len());
    let head = floor_char(text, keep / 2);
    let tail = ceil_char(text, text.len() - (keep - keep / 2));
    let mut out = String::with_capacity(max + marker.len());
    out.push_str(&text[..head]);
    out.push_str(&marker);
    out.push_str(&text[tail.max(head)..]);
    out
}

/// Lowercase hex of the SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    Sha256::digest(bytes)
        .iter()
        .fold(String::with_capacity(64), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

fn floor_char(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn ceil_char(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_kept_and_long_text_keeps_head_tail_and_hash() {
        assert_eq!(cap_text("abc", 10, true), "abc");
        let code = format!("HEAD{}TAIL", "é".repeat(5000));
        let cut = cap_text(&code, 1024, true);
        assert!(cut.len() <= 1024, "{}", cut.len());
        assert!(cut.starts_with("HEAD") && cut.ends_with("TAIL"), "{cut}");
        assert!(cut.contains(&sha256_hex(code.as_bytes())), "{cut}");
        assert!(cut.contains(&format!("the full code was {} bytes", code.len())));
        let out = cap_text(&"x".repeat(5000), 1024, false);
        assert!(out.len() <= 1024 && out.contains("the full text was 5000 bytes"));
    }

    #[test]
    fn sha256_matches_a_known_digest() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}

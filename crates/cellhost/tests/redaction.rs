//! Redaction and control-character stripping through a real kernel: the
//! result, the value and the live stream (`CellEvent`) of cells that print
//! tokens where the old patterns missed them, credentials cut by the live
//! tap's 16 KiB hold, multi-line secret values and C1 controls.
mod common;

use cellhost::{Cell, CellEvent};
use common::*;

/// A GitHub-style token built in the cell, so the code itself holds none.
const TOKEN_HEAD: &str = "ghp_";
const TOKEN_BODY: &str = "Zyxwvutsrqponmlkjihgfedcba9876543210";

async fn streamed(k: &TestKernel, code: &str) -> (String, cellhost::CellResult) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let r = k.run_cell(Cell::new(code).events(tx)).await;
    let mut out = String::new();
    while let Some(e) = rx.recv().await {
        if let CellEvent::Stdout(t) = e {
            out.push_str(&t);
        }
    }
    (out, r)
}

#[tokio::test]
async fn a_token_after_an_escaped_newline_in_a_repr_is_redacted_everywhere() {
    let k = kernel().await;
    let code = format!(
        "s = 'user\\n{TOKEN_HEAD}' + '{TOKEN_BODY}'\n\
         print(repr(s))\nprint('x_' + s[5:])\nprint('key' + s[5:])\nrepr(s)"
    );
    let (live, r) = streamed(&k, &code).await;
    let value = r.value.clone().unwrap_or_default();
    for (what, text) in [("stdout", &r.stdout), ("value", &value), ("stream", &live)] {
        assert!(!text.contains(&TOKEN_BODY[..12]), "{what}: {text}");
        assert!(text.contains("[REDACTED:github_token]"), "{what}: {text}");
    }
    assert!(r.stdout.starts_with("'user\\n[REDACTED"), "{}", r.stdout);
}

#[tokio::test]
async fn a_bearer_credential_after_a_long_line_cut_at_its_last_space_is_never_streamed() {
    let k = kernel().await;
    let code = r#"
import sys, time
sys.stdout.write("x" * 16370); sys.stdout.flush(); time.sleep(0.2)
sys.stdout.write(" Authorization: Bearer "); sys.stdout.flush(); time.sleep(0.2)
print("Qm9vZ2llV29vZ2llMTIzNDU2Nzg5MA")
"#;
    let (live, r) = streamed(&k, code).await;
    assert!(
        r.stdout.contains("Bearer [REDACTED:bearer]"),
        "{}",
        &r.stdout[16000..]
    );
    assert!(
        !live.contains("Qm9vZ2ll"),
        "{}",
        &live[live.len().saturating_sub(200)..]
    );
    assert_eq!(live, r.stdout);
}

#[tokio::test]
async fn a_multi_line_secret_printed_line_by_line_is_never_streamed() {
    let secret = "first-line-of-the-secret\nsecond-line-of-the-secret";
    let k = kernel_with_env(&[("MY_PRIVATE_CREDS", secret)], &[]).await;
    let code = r#"
import sys, time
print("before")
print("first-line-of-the-secret", flush=True); time.sleep(0.3)
print("second-line-of-the-secret", flush=True); time.sleep(0.3)
print("after")
"#;
    let (live, r) = streamed(&k, code).await;
    assert_eq!(r.stdout, "before\n[REDACTED:secret]\nafter\n");
    assert!(!live.contains("first-line-of"), "{live}");
    assert_eq!(live, r.stdout);
}

#[tokio::test]
async fn c1_control_characters_are_stripped_like_escape_sequences() {
    let k = kernel().await;
    let code = r#"
import sys
print("A\u009b2JB\u009d0;pwned\u0007C\u0085D")
sys.stderr.write("E\u009b31mF\u009c\n")
"A\u009bmB"
"#;
    let (live, r) = streamed(&k, code).await;
    assert_eq!(r.stdout, "ABCD\n");
    assert_eq!(r.stderr, "EF\n");
    assert_eq!(live, "ABCD\n");
    let c1 = |s: &str| s.chars().any(|c| ('\u{80}'..='\u{9f}').contains(&c));
    assert!(!c1(r.value.as_deref().unwrap_or("")), "{:?}", r.value);
}

#[tokio::test]
async fn a_cut_streams_spill_file_is_stripped_of_c1_controls_and_redacted() {
    let k = kernel().await;
    let code = format!(
        "print('\\u009b2J' + '\\\\n{TOKEN_HEAD}' + '{TOKEN_BODY}')\nprint('y' * 120_000)\nprint('\\u009d0;t\\u0007end')"
    );
    let r = k.run(&code).await;
    let spill = r.truncated.spill_path.clone().expect("the output was cut");
    let full = std::fs::read_to_string(spill).unwrap();
    assert!(!full.chars().any(|c| ('\u{80}'..='\u{9f}').contains(&c)));
    assert!(!full.contains(&TOKEN_BODY[..12]), "{}", &full[..200]);
    assert!(full.ends_with("end\n"), "{}", &full[full.len() - 50..]);
}

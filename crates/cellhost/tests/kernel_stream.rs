//! Live stdout/stderr events of a running cell, through a real kernel.
mod common;

use std::time::Duration;

use cellhost::{Cell, CellEvent};
use common::*;

fn texts(events: &[CellEvent]) -> (String, String) {
    let (mut out, mut err) = (String::new(), String::new());
    for e in events {
        match e {
            CellEvent::Stdout(t) => out.push_str(t),
            CellEvent::Stderr(t) => err.push_str(t),
            _ => {}
        }
    }
    (out, err)
}

#[tokio::test]
async fn stdout_streams_while_the_cell_runs_and_matches_the_result() {
    let k = kernel().await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let cell = Cell::new(
        "import sys, time\nprint('first', flush=True)\ntime.sleep(1)\nprint('second')\nprint('oops', file=sys.stderr)",
    )
    .events(tx);
    let kernel = k.kernel.clone();
    let running = tokio::spawn(async move { kernel.execute(cell).await.unwrap() });
    let first = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("an event before the cell ends")
        .unwrap();
    assert!(k.kernel.is_busy(), "the event came while the cell ran");
    assert_eq!(first, CellEvent::Stdout("first\n".into()));
    let r = running.await.unwrap();
    let mut events = vec![first];
    while let Some(e) = rx.recv().await {
        events.push(e);
    }
    let (out, err) = texts(&events);
    assert_eq!(out, r.stdout);
    assert_eq!(err, r.stderr);
    assert_eq!(out, "first\nsecond\n");
}

#[tokio::test]
async fn a_secret_printed_in_pieces_never_reaches_the_stream() {
    let k = kernel().await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let code = r#"
import sys, time
tok = "ghp_" + "abcdefghijklmnopqrstuvwxyz0123456789AB"
sys.stdout.write(tok[:10]); sys.stdout.flush(); time.sleep(0.2)
sys.stdout.write(tok[10:] + "\n"); sys.stdout.flush()
print("-----BEGIN OPENSSH PRIVATE KEY-----", flush=True); time.sleep(0.2)
print("b3BlbnNzaC1rZXktdjEAAAAA", flush=True); time.sleep(0.2)
print("-----END OPENSSH PRIVATE KEY-----")
print("\x1b[32mgreen\x1b[0m")
"#;
    let r = k.run_cell(Cell::new(code).events(tx)).await;
    let mut events = Vec::new();
    while let Some(e) = rx.recv().await {
        events.push(e);
    }
    let (out, _) = texts(&events);
    assert!(!out.contains("abcdefghij"), "{out}");
    assert!(!out.contains("b3BlbnNzaC1rZXkt"), "{out}");
    assert!(out.contains("[REDACTED:github_token]"), "{out}");
    assert!(out.contains("[REDACTED:private_key]"), "{out}");
    assert!(out.contains("green\n") && !out.contains('\x1b'), "{out}");
    assert_eq!(out, r.stdout);
}

#[tokio::test]
async fn streaming_stops_at_the_cap_while_the_result_keeps_head_and_tail() {
    let k = kernel().await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let r = k
        .run_cell(Cell::new("for i in range(20000): print('line', i)").events(tx))
        .await;
    let mut events = Vec::new();
    while let Some(e) = rx.recv().await {
        events.push(e);
    }
    let (out, _) = texts(&events);
    assert!(
        out.contains("streaming of stdout stopped after 50,000 bytes"),
        "{}",
        &out[out.len().saturating_sub(300)..]
    );
    assert!(out.len() < 60_000, "{}", out.len());
    assert!(r.truncated.stdout && r.stdout.contains("line 19999"));
}

#[tokio::test]
async fn a_kernel_that_cannot_respawn_lets_go_of_the_cells_event_sink() {
    let k = kernel().await;
    k.run("1").await;
    // The staging root becomes a file: the reset's respawn fails.
    let root = k.dir.path().join("kernels");
    std::fs::remove_dir_all(&root).unwrap();
    std::fs::write(&root, "not a dir").unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let r = k
        .kernel
        .execute(Cell::new("2").reset(true).events(tx))
        .await;
    assert!(r.is_err(), "{r:?}");
    // Every sender is gone: the receiver ends instead of waiting forever.
    let end = tokio::time::timeout(Duration::from_secs(5), async {
        while rx.recv().await.is_some() {}
    })
    .await;
    assert!(
        end.is_ok(),
        "the kernel still holds the failed cell's event sink"
    );
}

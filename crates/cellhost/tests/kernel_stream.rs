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

/// The markers of a cell's events in arrival order: each stdout or stderr
/// line, each display's text.
fn order_of(events: &[CellEvent]) -> Vec<String> {
    let mut got = Vec::new();
    for e in events {
        match e {
            CellEvent::Stdout(t) | CellEvent::Stderr(t) => got.extend(
                t.lines()
                    .map(|l| l.split(' ').next().unwrap_or("").to_owned()),
            ),
            CellEvent::Display(items) => got.push(items[0].data.trim_matches('\'').to_owned()),
            _ => {}
        }
    }
    got
}

/// stdout, stderr and displays travel on separate pipes; a watched cell's
/// display still reaches the sink after everything printed before it.
#[tokio::test]
async fn prints_and_displays_of_a_watched_cell_arrive_in_the_order_they_were_made() {
    let k = kernel().await;
    let code = "import sys\n\
        for i in range(40):\n\
        \x20   print('o%d' % i, 'x' * 300)\n\
        \x20   print('e%d' % i, 'y' * 300, file=sys.stderr)\n\
        \x20   display('d%d' % i)";
    let want: Vec<String> = (0..40)
        .flat_map(|i| [format!("o{i}"), format!("e{i}"), format!("d{i}")])
        .collect();
    for _ in 0..3 {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let r = k.run_cell(Cell::new(code).events(tx)).await;
        assert_eq!(r.status, cellhost::Status::Success, "{:?}", r.error);
        let mut events = Vec::new();
        while let Some(e) = rx.recv().await {
            events.push(e);
        }
        assert_eq!(order_of(&events), want);
    }
}

/// Many displays in a row with prints between: output printed after a
/// display never overtakes it (the host's display-flood throttle must not
/// skip the reply pipe of a runner that syncs).
#[tokio::test]
async fn output_after_a_display_never_overtakes_it() {
    let k = kernel().await;
    let code = "for i in range(60):\n    display('d%d' % i)\n    print('o%d' % i)";
    let want: Vec<String> = (0..60)
        .flat_map(|i| [format!("d{i}"), format!("o{i}")])
        .collect();
    for _ in 0..5 {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let r = k.run_cell(Cell::new(code).events(tx)).await;
        assert_eq!(r.status, cellhost::Status::Success, "{:?}", r.error);
        let mut events = Vec::new();
        while let Some(e) = rx.recv().await {
            events.push(e);
        }
        assert_eq!(order_of(&events), want);
    }
}

/// The same cell unwatched: no sync, same result.
#[tokio::test]
async fn an_unwatched_cell_with_prints_and_displays_gets_them_all() {
    let k = kernel().await;
    let r = k
        .run("for i in range(40):\n    print('o%d' % i)\n    display('d%d' % i)")
        .await;
    assert_eq!(r.status, cellhost::Status::Success, "{:?}", r.error);
    assert_eq!(r.displays.len(), 40);
    assert_eq!(r.stdout.lines().count(), 40);
}

/// A SIGINT that lands while the runner waits for a sync ack is raised
/// only after the display went out: the ack is never left unread, so the
/// next cell's reply is its own.
#[tokio::test]
async fn interrupting_a_watched_cell_that_prints_and_displays_keeps_the_protocol_intact() {
    // No count cap: the cell syncs until the timeout lands.
    let k = common::display::kernel_limits(cellhost::DisplayLimits {
        max_cell_displays: u32::MAX,
        ..cellhost::DisplayLimits::default()
    })
    .await;
    for _ in 0..8 {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let cell = Cell::new("while True:\n    print(1)\n    display(2)")
            .timeout(Duration::from_millis(300))
            .events(tx);
        let r = k.run_cell(cell).await;
        assert_eq!(r.status, cellhost::Status::Timeout, "{:?}", r.error);
        assert!(!r.kernel.state_lost, "{:?}", r.kernel.note);
        while rx.recv().await.is_some() {}
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let r = k
            .run_cell(Cell::new("print('next')\ndisplay('shown')\n7").events(tx))
            .await;
        assert_eq!(r.value.as_deref(), Some("7"), "{r:?}");
        assert!(!r.kernel.state_lost, "{:?}", r.kernel.note);
        assert_eq!((r.stdout.as_str(), r.displays.len()), ("next\n", 1));
    }
}

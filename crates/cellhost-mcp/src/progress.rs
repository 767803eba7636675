//! Output of a running cell as MCP progress notifications: each carries
//! the new output lines as its message and the count of lines so far as
//! its progress. Bursts are coalesced (one notification per 50 ms, at most
//! 16 KiB of text), so a cell printing a million lines cannot flood the
//! client.

use std::time::Duration;

use cellhost::CellEvent;
use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::service::{Peer, RoleServer};
use tokio::sync::mpsc::UnboundedReceiver;

const BATCH: Duration = Duration::from_millis(50);
/// How long the reply waits for the last notification once the cell ended.
pub(crate) const DRAIN: Duration = Duration::from_millis(250);
const MAX_MESSAGE: usize = 16 * 1024;

/// Forward `events` until the cell drops its sender.
pub(crate) async fn forward(
    peer: Peer<RoleServer>,
    token: ProgressToken,
    mut events: UnboundedReceiver<CellEvent>,
) {
    let mut lines = 0u64;
    while let Some(first) = events.recv().await {
        let mut text = String::new();
        push(&mut text, first);
        // Gather what else arrives in this batch window.
        let deadline = tokio::time::Instant::now() + BATCH;
        while text.len() < MAX_MESSAGE {
            match tokio::time::timeout_at(deadline, events.recv()).await {
                Ok(Some(e)) => push(&mut text, e),
                Ok(None) | Err(_) => break,
            }
        }
        if text.is_empty() {
            continue;
        }
        if text.len() > MAX_MESSAGE {
            let mut cut = MAX_MESSAGE;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
            text.push_str("\n[… more output in the result]");
        }
        lines += text.lines().count().max(1) as u64;
        let note = ProgressNotificationParam::new(token.clone(), lines as f64).with_message(text);
        if peer.notify_progress(note).await.is_err() {
            return;
        }
    }
}

fn push(text: &mut String, e: CellEvent) {
    match e {
        CellEvent::Stdout(t) => text.push_str(&t),
        CellEvent::Stderr(t) => text.push_str(&t),
        CellEvent::Display(items) | CellEvent::Value(items) => {
            for i in items {
                text.push_str(&format!("[display {}]\n", i.mime));
            }
        }
        _ => {}
    }
}

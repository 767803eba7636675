//! `complete_request`, `inspect_request` and `is_complete_request`,
//! answered by the session's own kernel: a hidden cell runs
//! `introspect.py` (rlcompleter, `inspect`, `codeop`) against the cell
//! namespace and prints its answer.
//!
//! Hidden cells go neither into the history nor the metrics; Jupyter's
//! execution count leaves them out (`HubShared::hidden`). When a hidden
//! cell is the one that finds the state lost (the kernel was evicted or
//! reaped), its note waits for the next real cell (`pending_note`).

use std::time::Duration;

use cellhost::registry::KernelSpec;
use cellhost::Cell;
use serde_json::{json, Value};

use super::messages::Incoming;
use super::HubShared;
use crate::AppState;

const SOURCE: &str = include_str!("introspect.py");
const MARKER: &str = "@@cellhost-jupyter@@";
/// Longest a hidden cell may run.
const HIDDEN_TIMEOUT: Duration = Duration::from_secs(10);

/// The reply content of an introspection request.
pub(crate) async fn answer(app: &AppState, hub: &HubShared, msg: &Incoming) -> Value {
    let kind = match msg.msg_type() {
        "complete_request" => "complete",
        "inspect_request" => "inspect",
        _ => "is_complete",
    };
    let mut req = json!({
        "kind": kind,
        "code": msg.str_field("code").unwrap_or(""),
        "detail_level": msg.content.get("detail_level").and_then(Value::as_u64).unwrap_or(0),
    });
    if let Some(pos) = msg.content.get("cursor_pos").and_then(Value::as_u64) {
        req["cursor_pos"] = json!(pos);
    }
    match hidden(app, hub, &req.to_string()).await {
        Ok(v) => v,
        Err(why) if kind == "is_complete" => json!({"status": "unknown", "why": why}),
        Err(why) => json!({
            "status": "error", "ename": "CellhostError", "evalue": why, "traceback": [],
        }),
    }
}

/// The kernel's spec for a session's default cells, as
/// `POST /v1/sessions/{s}/execute` picks it without `tools`/`backend`.
pub(crate) fn default_spec(app: &AppState) -> KernelSpec {
    KernelSpec::default().tools(app.manager.options().tools.names())
}

/// Run the helper with request `req` (JSON text); its parsed answer.
async fn hidden(app: &AppState, hub: &HubShared, req: &str) -> Result<Value, String> {
    let lit = |s: &str| serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_owned());
    let code = format!(
        "exec(compile({}, '<cellhost-jupyter>', 'exec'), \
         {{'__name__': '__cellhost_jupyter__', '_ns': globals(), '_req': {}, '_marker': {}}})",
        lit(SOURCE),
        lit(req),
        lit(MARKER)
    );
    let mut cell = Cell::new(code).timeout(HIDDEN_TIMEOUT);
    // Completion and inspection are Jupyter's own: no watcher sees them.
    cell.hidden = true;
    let r = app
        .manager
        .execute_with(&hub.id, &default_spec(app), cell)
        .await
        .map_err(|e| e.to_string())?;
    hub.count_hidden(&r);
    r.stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(MARKER))
        .and_then(|j| serde_json::from_str(j).ok())
        .ok_or_else(|| {
            r.error
                .unwrap_or_else(|| "the kernel gave no introspection answer".to_owned())
        })
}

impl HubShared {
    /// A hidden cell ran: leave it out of Jupyter's count, and keep any
    /// state note for the next real cell.
    fn count_hidden(&self, r: &cellhost::CellResult) {
        *self
            .hidden
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(r.kernel.id.clone())
            .or_default() += 1;
        if r.kernel.state_lost || r.kernel.state_reset || r.kernel.ended {
            if let Some(n) = &r.kernel.note {
                *self.pending_note.lock().unwrap_or_else(|e| e.into_inner()) = Some(n.clone());
            }
        }
    }

    /// Jupyter's execution count of a result: the kernel's, without
    /// hidden cells.
    pub(crate) fn jupyter_count(&self, kernel_id: &str, raw: u64) -> u64 {
        let hidden = self
            .hidden
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(kernel_id)
            .copied()
            .unwrap_or(0);
        raw.saturating_sub(hidden).max(1)
    }

    pub(crate) fn take_pending_note(&self) -> Option<String> {
        self.pending_note
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }
}

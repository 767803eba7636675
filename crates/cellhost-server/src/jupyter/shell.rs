//! A kernel's shell worker: runs its shell requests one at a time, in
//! arrival order across all its sockets, each between iopub `status:
//! busy` and `status: idle` (as ipykernel does).
//!
//! An `execute_request` becomes a cellhost cell run like
//! `POST /v1/sessions/{id}/execute` (counted, in the history, its live
//! output from the same cleaned and redacted tap as SSE): `execute_input`,
//! then `stream` / `display_data` as they happen, then the state note
//! (a stderr `stream`) when the result says state was lost, reset or
//! ended, `execute_result` or `error`, and the `execute_reply` with the
//! cellhost result's kernel facts in its metadata.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use cellhost::{CellEvent, CellResult, Status};
use cellhost_protocol::DisplayItem;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use super::messages::{self, Incoming, Outgoing};
use super::{HubShared, ShellJob};
use crate::{ApiError, AppState, ExecuteRequest};

pub(crate) async fn worker(
    app: AppState,
    hub: Arc<HubShared>,
    mut jobs: mpsc::UnboundedReceiver<ShellJob>,
) {
    while let Some(job) = jobs.recv().await {
        let msg = &job.msg;
        let me = Some(job.socket);
        let session = hub.session.clone();
        if *hub.closed.borrow() {
            let content = json!({"status": "aborted"});
            hub.send(me, &messages::reply(msg, &session, content));
            continue;
        }
        hub.busy.store(true, Ordering::SeqCst);
        hub.touch();
        // Sent in two broadcasts: `busy` (with `execute_input`) before the
        // work, the answer with `idle` after it.
        let mut out: Out = vec![(None, messages::status("busy", &session, Some(msg)))];
        match msg.msg_type() {
            "execute_request" => execute(&app, &hub, job.socket, msg, &mut out).await,
            "history_request" => {
                let content = json!({"status": "ok", "history": []});
                out.push((me, messages::reply(msg, &session, content)));
            }
            _ => {
                flush(&hub, &mut out);
                let content = super::introspect::answer(&app, &hub, msg).await;
                out.push((me, messages::reply(msg, &session, content)));
            }
        }
        hub.touch();
        hub.busy.store(false, Ordering::SeqCst);
        out.push((None, messages::status("idle", &session, Some(msg))));
        flush(&hub, &mut out);
    }
}

/// Messages made together, sent as one broadcast by [`flush`].
type Out = Vec<(Option<u64>, Outgoing)>;

fn flush(hub: &HubShared, out: &mut Out) {
    let refs: Vec<(Option<u64>, &Outgoing)> = out.iter().map(|(t, m)| (*t, m)).collect();
    hub.send_all(&refs);
    out.clear();
}

/// The execution count the next cell of kernel `id` will likely get.
fn next_count(app: &AppState, hub: &HubShared) -> u64 {
    app.manager
        .list()
        .into_iter()
        .find(|k| k.owner == hub.id && !k.id.is_empty())
        .map_or(1, |k| hub.jupyter_count(&k.id, k.execution_count + 1))
}

async fn execute(app: &AppState, hub: &HubShared, socket: u64, msg: &Incoming, out: &mut Out) {
    let session = &hub.session;
    let code = msg.str_field("code").unwrap_or("").to_owned();
    let silent = msg.bool_field("silent").unwrap_or(false);
    if !silent {
        let input = json!({"code": code, "execution_count": next_count(app, hub)});
        out.push((
            None,
            Outgoing::new("iopub", "execute_input", session, Some(msg), input),
        ));
    }
    let req = ExecuteRequest::new(code);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut result = match crate::execute::submit(
        app,
        hub.id.clone(),
        hub.id.clone(),
        req,
        Some(tx),
        cellhost::events::FrontEnd::Jupyter,
    ) {
        Ok(rx) => rx,
        // Past the queue bounds (429) or shutting down: an error reply.
        Err(e) => return failed(out, hub, socket, msg, &e),
    };
    flush(hub, out);
    // The last value's rich repr, sent as the `execute_result` (not as a
    // `display_data`), as IPython's display formatter does.
    let mut value: Option<Vec<DisplayItem>> = None;
    let mut forward = |e: CellEvent| match e {
        CellEvent::Value(items) => value = Some(items),
        e if !silent => {
            if let Some(m) = event_message(e, session, msg) {
                hub.send(None, &m);
            }
        }
        _ => {}
    };
    let result = loop {
        tokio::select! {
            biased;
            e = rx.recv() => match e {
                Some(e) => forward(e),
                None => break (&mut result).await,
            },
            r = &mut result => {
                while let Ok(e) = rx.try_recv() {
                    forward(e);
                }
                break r;
            }
        }
    };
    match result {
        Ok(Ok(r)) => finished(out, hub, socket, msg, silent, &r.result, value.as_deref()),
        Ok(Err(e)) => failed(out, hub, socket, msg, &e),
        Err(_) => failed(
            out,
            hub,
            socket,
            msg,
            &ApiError::new(
                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "the cell's task ended without a result; see the server's log",
            ),
        ),
    }
}

/// The iopub message of a live event.
fn event_message(e: CellEvent, session: &str, parent: &Incoming) -> Option<Outgoing> {
    Some(match e {
        CellEvent::Stdout(t) => messages::stream("stdout", &t, session, Some(parent)),
        CellEvent::Stderr(t) => messages::stream("stderr", &t, session, Some(parent)),
        CellEvent::Display(items) => Outgoing::new(
            "iopub",
            "display_data",
            session,
            Some(parent),
            json!({"data": bundle(&items), "metadata": {}, "transient": {}}),
        ),
        _ => return None,
    })
}

/// A MIME bundle: JSON mimes as JSON, text as text, binary as base64.
fn bundle(items: &[DisplayItem]) -> Value {
    let mut data = Map::new();
    for it in items {
        let v = if it.mime.ends_with("json") {
            serde_json::from_str(&it.data).unwrap_or_else(|_| Value::String(it.data.clone()))
        } else {
            Value::String(it.data.clone())
        };
        data.insert(it.mime.clone(), v);
    }
    Value::Object(data)
}

/// The sentence telling the client what happened to its state, if
/// anything did.
fn state_note(hub: &HubShared, r: &CellResult) -> Option<String> {
    let k = &r.kernel;
    let own = if k.state_lost || k.state_reset || k.ended || k.note.is_some() {
        Some(k.note.clone().unwrap_or_else(|| {
            if k.state_lost {
                "State lost: this cell ran in a fresh kernel.".to_owned()
            } else if k.state_reset {
                "State reset: this cell ran in a fresh kernel.".to_owned()
            } else {
                "The kernel ended; the next cell gets a fresh one.".to_owned()
            }
        }))
    } else {
        None
    };
    match (hub.take_pending_note(), own) {
        (Some(p), Some(o)) => Some(format!("{p} {o}")),
        (p, o) => p.or(o),
    }
}

/// `value`: the last value's rich bundle (a [`CellEvent::Value`]), if
/// it has one; else the `execute_result` is its `text/plain` repr.
fn finished(
    out: &mut Out,
    hub: &HubShared,
    socket: u64,
    msg: &Incoming,
    silent: bool,
    r: &CellResult,
    value: Option<&[DisplayItem]>,
) {
    let session = &hub.session;
    let count = hub.jupyter_count(&r.kernel.id, r.kernel.execution_count);
    let note = state_note(hub, r);
    if let Some(n) = &note {
        let text = format!("cellhost: {n}\n");
        out.push((None, messages::stream("stderr", &text, session, Some(msg))));
    }
    let mut metadata = json!({
        "status": if r.is_success() { "ok" } else { "error" },
        "cellhost": {
            "status": r.status.as_str(),
            "kernel": r.kernel,
            "duration_seconds": r.duration_seconds,
            "truncated": r.truncated,
            "tool_calls_made": r.tool_calls_made,
        },
    });
    if let Some(n) = &note {
        metadata["cellhost"]["state_note"] = json!(n);
    }
    if let (Some(v), false) = (&r.value, silent) {
        let mut data = value.map_or_else(|| json!({}), bundle);
        if data.get("text/plain").is_none() {
            data["text/plain"] = json!(v);
        }
        let content = json!({
            "execution_count": count,
            "data": data,
            "metadata": {},
        });
        out.push((
            None,
            Outgoing::new("iopub", "execute_result", session, Some(msg), content),
        ));
    }
    let mut content = json!({
        "status": "ok",
        "execution_count": count,
        "user_expressions": {},
        "payload": [],
    });
    if !r.is_success() {
        let line = r.error.clone().unwrap_or_else(|| match r.status {
            Status::Timeout => "TimeoutError: the cell ran past its timeout".to_owned(),
            Status::Interrupted => "KeyboardInterrupt".to_owned(),
            _ => "Error: the cell failed".to_owned(),
        });
        let (ename, evalue) = messages::split_error(&line);
        let mut traceback: Vec<String> = r
            .traceback
            .as_deref()
            .map(|t| t.lines().map(str::to_owned).collect())
            .unwrap_or_default();
        if let Some(extra) = r
            .error_beyond_traceback()
            .or(r.error.is_none().then_some(&*line))
        {
            traceback.push(extra.to_owned());
        }
        if ename == "EOFError" && evalue.contains("reading a line") {
            let hint = "cellhost: input() cannot read here: a cellhost kernel's stdin is \
                        closed (allow_stdin is not supported); put the value in the code.\n";
            out.push((None, messages::stream("stderr", hint, session, Some(msg))));
        }
        let err = json!({"ename": ename, "evalue": evalue, "traceback": traceback});
        if !silent {
            out.push((
                None,
                Outgoing::new("iopub", "error", session, Some(msg), err.clone()),
            ));
        }
        content = json!({
            "status": "error",
            "execution_count": count,
            "ename": err["ename"],
            "evalue": err["evalue"],
            "traceback": err["traceback"],
            "user_expressions": {},
            "payload": [],
        });
    }
    out.push((
        Some(socket),
        messages::reply(msg, session, content).with_metadata(metadata),
    ));
}

/// The cell never ran (no kernel could start, shutting down, ...).
fn failed(out: &mut Out, hub: &HubShared, socket: u64, msg: &Incoming, e: &ApiError) {
    let session = &hub.session;
    let err = json!({
        "ename": "CellhostError",
        "evalue": e.message,
        "traceback": [format!("CellhostError: {}", e.message)],
    });
    out.push((
        None,
        Outgoing::new("iopub", "error", session, Some(msg), err.clone()),
    ));
    let content = json!({
        "status": "error",
        "execution_count": 0,
        "ename": err["ename"],
        "evalue": err["evalue"],
        "traceback": err["traceback"],
        "user_expressions": {},
        "payload": [],
    });
    let metadata =
        json!({"status": "error", "cellhost": {"error": {"code": e.code, "message": e.message}}});
    out.push((
        Some(socket),
        messages::reply(msg, session, content).with_metadata(metadata),
    ));
}

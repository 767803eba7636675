//! `POST /v1/sessions/{session}/execute`: the request, the [`Cell`] it
//! becomes, and the run itself (plain JSON or Server-Sent Events).
//!
//! Every cell runs in its own task, so a client that hangs up never
//! cancels it halfway: it still finishes, is counted and lands in the
//! history. A result is sent only after its history row has committed;
//! when it could not be (a full disk), the answer says so in a `history`
//! field and in its note. Cells in flight are bounded per session and in
//! total (`queue`: 429 past the bounds).

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use cellhost::history::HistoryEntry;
use cellhost::registry::{child_owner, validate_owner, KernelSpec};
use cellhost::{Cell, CellEvent, CellResult};
use futures_util::stream;
use serde::Deserialize;
use tokio::sync::{mpsc, oneshot};

use crate::{ApiError, AppState};

/// Longest timeout a request may ask for (one day).
const MAX_TIMEOUT_SECONDS: f64 = 86_400.0;
/// Most tools one request may allow.
const MAX_TOOLS: usize = 256;

/// The body of an execute request.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecuteRequest {
    /// Python source of the cell.
    pub code: String,
    /// Seconds before the cell is interrupted (then killed if it does not
    /// stop); default: the server's.
    #[serde(default)]
    pub timeout: Option<f64>,
    /// Restart the session's kernel (discarding its state) before running.
    #[serde(default)]
    pub reset: bool,
    /// Run in this delegated child's own kernel (`{session}::child::{child}`).
    #[serde(default)]
    pub child: Option<String>,
    /// Tools the cell may call (Tool RPC), by name; default: every tool the
    /// server has. A different tool set gets a different kernel.
    #[serde(default)]
    pub tools: Option<Vec<String>>,
    /// Most tool calls the cell may make (default 50).
    #[serde(default)]
    pub max_tool_calls: Option<u32>,
    /// The backend to run on: `"local"` or a `[backends.NAME]` of
    /// cellhost.toml; default: the session's, else `default_backend`.
    #[serde(default)]
    pub backend: Option<String>,
}

impl ExecuteRequest {
    /// Parse and validate a request body.
    ///
    /// # Errors
    /// A 400 [`ApiError`] that says what was wrong.
    pub fn parse(body: &[u8]) -> Result<ExecuteRequest, ApiError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Err(ApiError::bad_request(
                "bad_json",
                "the request body is empty; send JSON like {\"code\": \"1 + 1\"}",
            ));
        }
        // serde would also take a struct as a positional array
        // (`["1 + 1", 5]`): only an object is a request.
        let first = body.iter().find(|b| !b.is_ascii_whitespace());
        if first.is_some_and(|&b| b == b'[') {
            return Err(ApiError::bad_request(
                "invalid_request",
                "the request body must be a JSON object, not an array; send JSON like {\"code\": \"1 + 1\"}",
            ));
        }
        let req: ExecuteRequest = serde_json::from_slice(body).map_err(|e| {
            use serde_json::error::Category;
            match e.classify() {
                Category::Data => ApiError::bad_request(
                    "invalid_request",
                    format!("{e}; send JSON like {{\"code\": \"1 + 1\"}}"),
                ),
                _ => ApiError::bad_request(
                    "bad_json",
                    format!("the request body is not valid JSON ({e}); send JSON like {{\"code\": \"1 + 1\"}}"),
                ),
            }
        })?;
        if let Some(t) = req.timeout {
            if !(t > 0.0 && t.is_finite() && t <= MAX_TIMEOUT_SECONDS) {
                return Err(ApiError::bad_request(
                    "invalid_request",
                    format!("timeout must be a number of seconds above 0 and at most {MAX_TIMEOUT_SECONDS}, not {t}"),
                ));
            }
        }
        let tools = req.tools.as_deref().unwrap_or_default();
        if tools.len() > MAX_TOOLS {
            return Err(ApiError::bad_request(
                "invalid_request",
                format!(
                    "at most {MAX_TOOLS} tools may be allowed per cell, not {}",
                    tools.len()
                ),
            ));
        }
        Ok(req)
    }

    /// The kernel's owner: the session, or its delegated child.
    fn owner(&self, session: &str) -> Result<String, ApiError> {
        let bad = |e: cellhost::registry::OwnerError| {
            ApiError::bad_request("invalid_session", e.to_string())
        };
        match &self.child {
            Some(child) => child_owner(session, child).map_err(bad),
            None => validate_owner(session)
                .map(|()| session.to_owned())
                .map_err(bad),
        }
    }

    /// The kernel key's spec: the tool set picks the kernel. Without a
    /// `tools` list, every tool of the server (`all`).
    fn spec(&self, all: &cellhost::ToolSet) -> KernelSpec {
        let spec = match &self.tools {
            Some(names) => KernelSpec::default().tools(names),
            None => KernelSpec::default().tools(all.names()),
        };
        match &self.backend {
            Some(b) => spec.backend(b),
            None => spec,
        }
    }

    /// Every named tool must be one of the server's (a typo is a 400,
    /// also for an SSE request, whose stream could only say it in an event).
    fn check_tools(&self, all: &cellhost::ToolSet) -> Result<(), ApiError> {
        match &self.tools {
            Some(names) => all
                .subset(&names.iter().cloned().collect())
                .map(|_| ())
                .map_err(|e| ApiError::bad_request("unknown_tool", e.to_string())),
            None => Ok(()),
        }
    }

    /// A named backend must exist (a typo is a 400, not a failed spawn).
    fn check_backend(&self, backends: &cellhost::remote::Backends) -> Result<(), ApiError> {
        match &self.backend {
            Some(b) if b != "local" && !backends.names().iter().any(|n| n == b) => {
                Err(ApiError::bad_request(
                    "unknown_backend",
                    format!(
                        "unknown backend {b:?}: use \"local\" or one of the [backends.NAME] of the \
                         server's cellhost.toml ({})",
                        backends.names().join(", ")
                    ),
                ))
            }
            _ => Ok(()),
        }
    }
}

/// The [`Cell`] a request asks for (its tools come from the kernel key).
pub fn build_cell(req: &ExecuteRequest) -> Cell {
    let mut cell = Cell::new(req.code.clone()).reset(req.reset);
    if let Some(t) = req.timeout {
        cell = cell.timeout(Duration::from_secs_f64(t));
    }
    if let Some(n) = req.max_tool_calls {
        cell = cell.max_tool_calls(n);
    }
    cell
}

/// Map a body extraction failure (too large, unreadable) to an error.
pub(crate) fn body_error(rejection: BytesRejection, limit: usize) -> ApiError {
    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!("the request body is over the {limit}-byte limit; send less, or raise [server] max_body_bytes"),
        )
    } else {
        ApiError::bad_request(
            "bad_body",
            format!("the request body could not be read: {rejection}"),
        )
    }
}

/// Run a request's cell; `sse` streams its events.
pub(crate) async fn run(
    state: AppState,
    session: String,
    body: Result<Bytes, BytesRejection>,
    sse: bool,
) -> Response {
    let prepared = body
        .map_err(|r| body_error(r, state.options.max_body_bytes))
        .and_then(|b| ExecuteRequest::parse(&b))
        .and_then(|req| {
            req.check_backend(state.manager.backends())?;
            req.check_tools(&state.manager.options().tools)?;
            if state.manager.is_shut_down() {
                return Err(cellhost::registry::ManagerError::ShutDown.into());
            }
            Ok((req.owner(&session)?, req))
        });
    let (owner, req) = match prepared {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    let mut cell = build_cell(&req);
    let events = sse.then(|| {
        let (tx, rx) = mpsc::unbounded_channel();
        cell = cell.clone().events(tx);
        rx
    });
    let result = match spawn_cell(&state, session, owner, req, cell) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    match events {
        None => match result.await {
            Ok(Ok(r)) => Json(r).into_response(),
            Ok(Err(e)) => e.into_response(),
            Err(_) => ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "the cell's task ended without a result; see the server's log",
            )
            .into_response(),
        },
        Some(rx) => sse_response(rx, result).into_response(),
    }
}

/// A cell's answer: its result, and (only when its history row could not
/// be written) a `history` field saying so. Additive to the cell-result
/// contract: clients that do not know the field still get the result.
#[derive(Debug, serde::Serialize)]
pub(crate) struct Ran {
    #[serde(flatten)]
    pub(crate) result: CellResult,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) history: Option<NotRecorded>,
}

/// `"history": {"recorded": false, "error": "…"}`.
#[derive(Debug, serde::Serialize)]
pub(crate) struct NotRecorded {
    recorded: bool,
    error: String,
}

/// What the task sends back.
pub(crate) type Answer = Result<Ran, ApiError>;

/// Run `cell` in its own task (counted, recorded in metrics and history
/// as `session`'s), so a caller that goes away never cuts it halfway.
///
/// # Errors
/// A 429 [`ApiError`] (with `Retry-After`) when the session already has
/// as many cells waiting, or as much code in flight, as allowed.
pub(crate) fn spawn_cell(
    state: &AppState,
    session: String,
    owner: String,
    req: ExecuteRequest,
    cell: Cell,
) -> Result<oneshot::Receiver<Answer>, ApiError> {
    let ticket = state
        .queue
        .admit(&state.options.limits, &session, req.code.len())?;
    let (done, result) = oneshot::channel();
    // Counted before the task exists, so a shutdown that starts now still
    // waits for this cell (and its history row).
    let in_flight = InFlight::enter(state);
    tokio::spawn(run_cell(
        state.clone(),
        session,
        owner,
        req,
        cell,
        done,
        (in_flight, ticket),
    ));
    Ok(result)
}

async fn run_cell(
    state: AppState,
    session: String,
    owner: String,
    req: ExecuteRequest,
    cell: Cell,
    done: oneshot::Sender<Answer>,
    _held: (InFlight, crate::queue::Ticket),
) {
    let started_at = unix_now();
    let mut result = state
        .manager
        .execute_with(&owner, &req.spec(&state.manager.options().tools), cell)
        .await
        .map_err(ApiError::from);
    if let Ok(r) = &mut result {
        tell_restart(&state, &owner, r);
    }
    let mut history = None;
    match &mut result {
        Ok(r) => {
            state.metrics.record(r);
            // Answer only once the row has committed: a cell the client
            // saw is in the history even if the daemon is SIGKILLed next.
            if let Some(h) = &state.history {
                let committed = h
                    .record_committed(HistoryEntry::of(
                        &session,
                        req.child.as_deref(),
                        &req.code,
                        started_at,
                        r,
                    ))
                    .await;
                if !committed {
                    history = Some(not_recorded(h, r));
                }
            }
        }
        Err(_) => state.metrics.failed(),
    }
    let _ = done.send(result.map(|result| Ran { result, history }));
}

/// The cell's row could not be written: say so in the answer (a field for
/// programs, a sentence in the note for people and models).
fn not_recorded(h: &cellhost::history::History, r: &mut CellResult) -> NotRecorded {
    let why = h
        .health()
        .failing
        .unwrap_or_else(|| "the history writer has stopped".to_owned());
    let error = format!(
        "this cell ran but is not in the daemon's history: its row could not be written ({why}); \
         free space in the daemon's data dir (see /healthz)"
    );
    let sentence = format!("History: {error}.");
    cellhost::kernel::add_note(&mut r.kernel, sentence, cellhost::kernel::NoteAt::End);
    NotRecorded {
        recorded: false,
        error,
    }
}

/// Owners (sessions and `{session}::child::{child}`) with recorded cells.
pub(crate) fn previous_owners(h: &cellhost::history::History) -> HashSet<String> {
    match h.owners() {
        Ok(owners) => owners
            .into_iter()
            .filter_map(|(s, c)| match c {
                Some(c) => child_owner(&s, &c).ok(),
                None => Some(s),
            })
            .collect(),
        Err(e) => {
            eprintln!(
                "cellhost: cannot tell sessions of an earlier daemon that their state is gone: {e}"
            );
            HashSet::new()
        }
    }
}

/// `owner` (and its children) was disposed on request: a fresh kernel is
/// then explained by that, not by a daemon restart.
pub(crate) fn forget_previous(state: &AppState, owner: &str) {
    let children = format!("{owner}{}", cellhost::registry::CHILD_SEPARATOR);
    state
        .previous
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|o| o != owner && !o.starts_with(&children));
}

/// The first cell an owner of an earlier daemon process runs here got a
/// fresh kernel: say its state was lost, unless the result already says
/// why it is fresh (a reset, an eviction).
fn tell_restart(state: &AppState, owner: &str, r: &mut CellResult) {
    let was_previous = state
        .previous
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(owner);
    if !was_previous || r.kernel.reused || r.kernel.state_lost || r.kernel.state_reset {
        return;
    }
    cellhost::kernel::StateChange::DaemonRestarted.tell(&mut r.kernel);
}

/// One cell counted in `AppState::in_flight` until dropped (recorded).
struct InFlight(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl InFlight {
    fn enter(state: &AppState) -> InFlight {
        state.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(state.in_flight.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

pub(crate) fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Events while the cell runs (`stdout`, `stderr`, `display`), then one
/// `result` (or `error`), then the stream ends.
///
/// The result ends the stream even while event senders are still alive
/// (a cell that never ran may leave them so): once it arrives, the events
/// already queued are sent, then the result.
fn sse_response(
    events: mpsc::UnboundedReceiver<CellEvent>,
    result: oneshot::Receiver<Answer>,
) -> Sse<impl futures_util::Stream<Item = Result<Event, std::convert::Infallible>>> {
    enum Phase {
        Running(
            mpsc::UnboundedReceiver<CellEvent>,
            oneshot::Receiver<Answer>,
        ),
        Draining(mpsc::UnboundedReceiver<CellEvent>, Event),
        Done,
    }
    let s = stream::unfold(Phase::Running(events, result), |phase| async move {
        match phase {
            Phase::Running(mut rx, mut result) => loop {
                tokio::select! {
                    biased;
                    e = rx.recv() => match e {
                        Some(e) => {
                            if let Some(ev) = event_of(e) {
                                return Some((Ok(ev), Phase::Running(rx, result)));
                            }
                        }
                        None => return Some((Ok(final_event(result.await)), Phase::Done)),
                    },
                    r = &mut result => {
                        let last = final_event(r);
                        return Some(drain(rx, last));
                    }
                }
            },
            Phase::Draining(rx, last) => Some(drain(rx, last)),
            Phase::Done => None,
        }
    });
    /// The next queued event, else the last one.
    fn drain(
        mut rx: mpsc::UnboundedReceiver<CellEvent>,
        last: Event,
    ) -> (Result<Event, std::convert::Infallible>, Phase) {
        while let Ok(e) = rx.try_recv() {
            if let Some(ev) = event_of(e) {
                return (Ok(ev), Phase::Draining(rx, last));
            }
        }
        (Ok(last), Phase::Done)
    }
    Sse::new(s).keep_alive(KeepAlive::default())
}

/// The `result` (or `error`) event that ends a stream.
fn final_event(r: Result<Answer, oneshot::error::RecvError>) -> Event {
    match r {
        Ok(Ok(r)) => json_event("result", &r),
        Ok(Err(e)) => json_event(
            "error",
            &serde_json::json!({"error": {"code": e.code, "message": e.message}}),
        ),
        Err(_) => json_event(
            "error",
            &serde_json::json!({"error": {"code": "internal", "message": "the cell's task ended without a result"}}),
        ),
    }
}

fn event_of(e: CellEvent) -> Option<Event> {
    Some(match e {
        CellEvent::Stdout(text) => json_event("stdout", &serde_json::json!({ "text": text })),
        CellEvent::Stderr(text) => json_event("stderr", &serde_json::json!({ "text": text })),
        CellEvent::Display(items) => json_event("display", &serde_json::json!({ "items": items })),
        _ => return None,
    })
}

fn json_event(name: &str, value: &impl serde::Serialize) -> Event {
    let data = serde_json::to_string(value).unwrap_or_else(|_| "{}".to_owned());
    Event::default().event(name).data(data)
}

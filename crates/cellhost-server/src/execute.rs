//! `POST /v1/sessions/{session}/execute`: the request
//! ([`ExecuteRequest`], from cellhost-protocol), the [`Cell`] it becomes,
//! and the run itself (plain JSON or Server-Sent Events). [`submit`] is
//! the one way a cell runs in the daemon: HTTP, `/mcp` and the Jupyter
//! gateway all call it.
//!
//! Every cell runs in its own task, so a client that hangs up never
//! cancels it halfway: it still finishes, is counted and lands in the
//! history. A result is sent only after its history row has committed;
//! when it could not be (a full disk), the answer says so in a `history`
//! field and in its note. Cells in flight are bounded per session and in
//! total (`queue`: 429 past the bounds).

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use cellhost::history::HistoryEntry;
use cellhost::registry::{child_owner, validate_owner, KernelSpec};
use cellhost::{Cell, CellEvent, CellResult};
use cellhost_protocol::{CellAnswer, ErrorDetail, ExecuteEvent, ExecuteRequest, NotRecorded};
use futures_util::stream;
use tokio::sync::{mpsc, oneshot};

use crate::{ApiError, AppState};

/// The kernel's owner: the session, or its delegated child.
fn owner(req: &ExecuteRequest, session: &str) -> Result<String, ApiError> {
    let bad =
        |e: cellhost::registry::OwnerError| ApiError::bad_request("invalid_session", e.to_string());
    match &req.child {
        Some(child) => child_owner(session, child).map_err(bad),
        None => validate_owner(session)
            .map(|()| session.to_owned())
            .map_err(bad),
    }
}

/// The kernel key's spec: the tool set picks the kernel. Without a
/// `tools` list, every tool of the server (`all`).
fn spec(req: &ExecuteRequest, all: &cellhost::ToolSet) -> KernelSpec {
    let spec = match &req.tools {
        Some(names) => KernelSpec::default().tools(names),
        None => KernelSpec::default().tools(all.names()),
    };
    match &req.backend {
        Some(b) => spec.backend(b),
        None => spec,
    }
}

/// Every named tool must be one of the server's (a typo is a 400,
/// also for an SSE request, whose stream could only say it in an event).
fn check_tools(req: &ExecuteRequest, all: &cellhost::ToolSet) -> Result<(), ApiError> {
    match &req.tools {
        Some(names) => all
            .subset(&names.iter().cloned().collect())
            .map(|_| ())
            .map_err(|e| ApiError::bad_request("unknown_tool", e.to_string())),
        None => Ok(()),
    }
}

/// A named backend must exist (a typo is a 400, not a failed spawn).
fn check_backend(
    req: &ExecuteRequest,
    backends: &cellhost::remote::Backends,
) -> Result<(), ApiError> {
    match &req.backend {
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
        .and_then(|b| ExecuteRequest::parse(&b).map_err(ApiError::from))
        .and_then(|req| {
            check_backend(&req, state.manager.backends())?;
            check_tools(&req, &state.manager.options().tools)?;
            Ok((owner(&req, &session)?, req))
        });
    let (owner, req) = match prepared {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    let (events, rx) = if sse {
        let (tx, rx) = mpsc::unbounded_channel();
        (Some(tx), Some(rx))
    } else {
        (None, None)
    };
    let result = match submit(
        &state,
        session,
        owner,
        req,
        events,
        cellhost::events::FrontEnd::Http,
    ) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    match rx {
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

/// What the task sends back.
pub(crate) type Answer = Result<CellAnswer, ApiError>;

/// Run `req`'s cell as `owner`'s, recorded as `session`'s, in its own task
/// (see [`spawn_cell`]); `events` gets its live events. The one entry of
/// every front end of the daemon (HTTP, `/mcp`, the Jupyter gateway).
///
/// # Errors
/// A 503 [`ApiError`] when the daemon is shutting down; a 429 past the
/// queue bounds.
pub(crate) fn submit(
    state: &AppState,
    session: String,
    owner: String,
    req: ExecuteRequest,
    events: Option<mpsc::UnboundedSender<CellEvent>>,
    front_end: cellhost::events::FrontEnd,
) -> Result<oneshot::Receiver<Answer>, ApiError> {
    if state.manager.is_shut_down() {
        return Err(cellhost::registry::ManagerError::ShutDown.into());
    }
    let mut cell = Cell::from_request(&req).front_end(front_end);
    if let Some(tx) = events {
        cell = cell.events(tx);
    }
    // The MCP client behind the owner (its `clientInfo`), for the history.
    let client = matches!(front_end, cellhost::events::FrontEnd::Mcp)
        .then(|| state.clients.get(&owner))
        .flatten();
    spawn_cell(state, session, owner, req, cell, client)
}

/// Run `cell` in its own task (counted, recorded in metrics and history
/// as `session`'s), so a caller that goes away never cuts it halfway.
///
/// # Errors
/// A 429 [`ApiError`] (with `Retry-After`) when the session already has
/// as many cells waiting, or as much code in flight, as allowed, or when
/// the cell would pass one of its tenant's limits (`tenant::Gate`).
fn spawn_cell(
    state: &AppState,
    session: String,
    owner: String,
    req: ExecuteRequest,
    mut cell: Cell,
    client: Option<String>,
) -> Result<oneshot::Receiver<Answer>, ApiError> {
    // `run_cell` tells the watchers the result as answered (with the
    // restart and history notes it adds).
    cell.caller_finishes = true;
    let ticket = state
        .queue
        .admit(&state.options.limits, &session, req.code.len())?;
    // After the queue: a cell the queue refuses does not use up the
    // tenant's cells per minute.
    let admitted = state.gate.admit(state, &owner).inspect_err(|_| {
        state
            .metrics
            .refused(crate::tenant::tenant_of(state, &owner));
    })?;
    let (done, result) = oneshot::channel();
    // Counted before the task exists, so a shutdown that starts now still
    // waits for this cell (and its history row).
    let in_flight = InFlight::enter(state);
    tokio::spawn(run_cell(
        state.clone(),
        Origin {
            session,
            owner,
            client,
        },
        req,
        cell,
        done,
        (in_flight, ticket, admitted),
    ));
    Ok(result)
}

/// Whose cell it is: recorded as `session`'s, run in `owner`'s kernel,
/// sent by `client` (an MCP client's name) when known.
struct Origin {
    session: String,
    owner: String,
    client: Option<String>,
}

async fn run_cell(
    state: AppState,
    origin: Origin,
    req: ExecuteRequest,
    cell: Cell,
    done: oneshot::Sender<Answer>,
    _held: (
        InFlight,
        crate::queue::Ticket,
        Option<crate::tenant::Admitted>,
    ),
) {
    let Origin {
        session,
        owner,
        client,
    } = origin;
    let tenant = crate::tenant::tenant_of(&state, &session).map(str::to_owned);
    let started_at = unix_now();
    let mut result = state
        .manager
        .execute_with(&owner, &spec(&req, &state.manager.options().tools), cell)
        .await
        .map_err(ApiError::from);
    if let Ok(r) = &mut result {
        tell_restart(&state, &owner, r);
    }
    let mut history = None;
    match &mut result {
        Ok(r) => {
            state.metrics.record(r, tenant.as_deref());
            // Answer only once the row has committed: a cell the client
            // saw is in the history even if the daemon is SIGKILLed next.
            if let Some(h) = &state.history {
                let mut row =
                    HistoryEntry::of(&session, req.child.as_deref(), &req.code, started_at, r);
                row.tenant = tenant.clone();
                row.client = client;
                let committed = h.record_committed(row).await;
                if !committed {
                    history = Some(not_recorded(h, r));
                }
            }
        }
        Err(_) => state.metrics.failed(tenant.as_deref()),
    }
    let result = result.map(|result| CellAnswer { result, history });
    // Answer first, then tell the watchers: waking them must not delay
    // the caller's response.
    let bus = state.manager.events();
    let finished = match &result {
        Ok(ran) if bus.watchers(&owner) > 0 => serde_json::to_value(ran)
            .ok()
            .map(|v| (ran.result.kernel.execution_count, v)),
        _ => None,
    };
    let _ = done.send(result);
    if let Some((n, v)) = finished {
        bus.cell_finished(&owner, n, &v);
    }
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
                "cellhost: cannot tell sessions of an earlier daemon that their state is gone: {}",
                cellhost::error_chain(&e)
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
    if !was_previous
        || r.kernel.reused
        || r.kernel.state_lost
        || r.kernel.state_reset
        || r.kernel.restored.is_some()
    {
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
    sse_event(&match r {
        Ok(Ok(r)) => ExecuteEvent::Result(Box::new(r)),
        Ok(Err(e)) => ExecuteEvent::Error(ErrorDetail {
            code: e.code.to_owned(),
            message: e.message,
        }),
        Err(_) => ExecuteEvent::Error(ErrorDetail {
            code: "internal".to_owned(),
            message: "the cell's task ended without a result".to_owned(),
        }),
    })
}

fn event_of(e: CellEvent) -> Option<Event> {
    Some(sse_event(&match e {
        CellEvent::Stdout(text) => ExecuteEvent::Stdout(text),
        CellEvent::Stderr(text) => ExecuteEvent::Stderr(text),
        CellEvent::Display(items) => ExecuteEvent::Display(items),
        // The last value's rich repr: a display like the others, marked.
        CellEvent::Value(items) => ExecuteEvent::Value(items),
        CellEvent::StreamStopped {
            stream,
            after_bytes,
        } => ExecuteEvent::StreamStopped {
            stream,
            after_bytes,
        },
        _ => return None,
    }))
}

fn sse_event(e: &ExecuteEvent) -> Event {
    Event::default().event(e.name()).data(e.data())
}

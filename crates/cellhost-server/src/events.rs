//! `GET /v1/sessions/{session}/events` (and a child's): the session's
//! events as Server-Sent Events, for people and programs watching it live.
//!
//! The events come from the manager's bus ([`cellhost::events`]); this
//! module only serializes them: `event:` the name, `id:` the session's
//! sequence number, `data:` the JSON. `?since=N` first replays the
//! recorded cells of the session's newest kernel with an execution count
//! above N (a `cell_started` and a `cell_finished`, both with
//! `"replayed": true`), then goes live; a cell that lands in the history
//! while the replay is read is not sent twice. A session that does not
//! exist yet is watched all the same: the stream opens and waits for its
//! first cell (as a Jupyter client may attach to a kernel before it runs
//! anything). The stream ends with `dropped` when the watcher fell behind,
//! and at daemon shutdown.

use std::collections::HashSet;
use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use cellhost::events::{SessionEvent, Watcher};
use cellhost::history::HistoryEntry;
use cellhost::registry::{child_owner, validate_owner};
use futures_util::stream::{self, StreamExt};
use serde::Deserialize;
use serde_json::json;

use crate::{ApiError, AppState};

/// Most history rows a replay reads.
const REPLAY_ROWS: usize = 1000;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub(crate) struct EventsQuery {
    /// Replay the recorded cells of the session's newest kernel with an
    /// execution count above this, then go live.
    since: Option<u64>,
}

/// Watch a session live: its cells (from any front end), their output as
/// it streams, their results and what happens to its kernels.
#[utoipa::path(
    get, path = "/v1/sessions/{session}/events",
    params(("session" = String, Path, description = "Session id"), EventsQuery),
    responses(
        (status = 200, description = "text/event-stream of cell_started {session, execution_count, code, front_end, started_at}, stdout/stderr {execution_count, text}, display {execution_count, display}, cell_finished {execution_count, result}, kernel {change, note}, and a last dropped {reason, missed} for a watcher that fell behind. See docs/events.md."),
        (status = 400, description = "Bad session id or query", body = crate::error::ErrorBody),
    )
)]
pub(crate) async fn session(
    State(state): State<AppState>,
    session: Result<Path<String>, PathRejection>,
    query: Result<Query<EventsQuery>, QueryRejection>,
) -> Response {
    let r: Result<_, ApiError> = (|| {
        let Path(session) = session.map_err(path_error)?;
        validate_owner(&session).map_err(bad_session)?;
        Ok((session, query.map_err(query_error)?.0))
    })();
    match r {
        Ok((session, q)) => watch(state, session.clone(), session, None, q.since).await,
        Err(e) => e.into_response(),
    }
}

/// Watch one delegated child of a session live (its own kernel).
#[utoipa::path(
    get, path = "/v1/sessions/{session}/children/{child}/events",
    params(("session" = String, Path, description = "Session id"), ("child" = String, Path, description = "Child id"), EventsQuery),
    responses(
        (status = 200, description = "The child's events, as for the session's"),
        (status = 400, description = "Bad session or child id, or query", body = crate::error::ErrorBody),
    )
)]
pub(crate) async fn child(
    State(state): State<AppState>,
    path: Result<Path<(String, String)>, PathRejection>,
    query: Result<Query<EventsQuery>, QueryRejection>,
) -> Response {
    let r: Result<_, ApiError> = (|| {
        let Path((session, child)) = path.map_err(path_error)?;
        let owner = child_owner(&session, &child).map_err(bad_session)?;
        Ok((session, child, owner, query.map_err(query_error)?.0))
    })();
    match r {
        Ok((session, child, owner, q)) => watch(state, owner, session, Some(child), q.since).await,
        Err(e) => e.into_response(),
    }
}

fn path_error(r: PathRejection) -> ApiError {
    ApiError::bad_request("bad_path", format!("the URL path could not be read: {r}"))
}

fn query_error(r: QueryRejection) -> ApiError {
    ApiError::bad_request(
        "bad_query",
        format!("{r}; the only parameter is ?since=<execution count>"),
    )
}

fn bad_session(e: cellhost::registry::OwnerError) -> ApiError {
    ApiError::bad_request("invalid_session", e.to_string())
}

async fn watch(
    state: AppState,
    owner: String,
    session: String,
    child: Option<String>,
    since: Option<u64>,
) -> Response {
    // Subscribe before reading the history: a cell that finishes meanwhile
    // is either in the rows or in the live events (or both: skipped below).
    let watcher = state.manager.events().subscribe(&owner);
    let rows = match (since, state.history.clone()) {
        (Some(n), Some(h)) => {
            let s = session.clone();
            let rows = tokio::task::spawn_blocking(move || h.session(&s, REPLAY_ROWS)).await;
            match rows {
                Ok(Ok(rows)) => replay_rows(rows, child.as_deref(), n),
                Ok(Err(e)) => {
                    eprintln!("cellhost: events replay: {e}");
                    return ApiError::new(
                        axum::http::StatusCode::SERVICE_UNAVAILABLE,
                        "history_unavailable",
                        "the history database could not be read for ?since=; see the server's log",
                    )
                    .into_response();
                }
                Err(_) => Vec::new(),
            }
        }
        _ => Vec::new(),
    };
    let replayed: HashSet<u64> = rows.iter().map(|r| r.execution_count).collect();
    let mut past = Vec::with_capacity(rows.len() * 2);
    for r in &rows {
        past.push(replay_started(&owner, r));
        past.push(replay_finished(r));
    }
    let stop = state.mcp_stop.clone();
    let live = Live {
        watcher,
        skip: replayed,
    };
    let live = stream::unfold(live, |mut live| async move {
        let e = live.next().await?;
        Some((Ok::<_, Infallible>(sse_event(&e)), live))
    });
    let s = stream::iter(past.into_iter().map(Ok))
        .chain(live)
        .take_until(async move { stop.cancelled().await });
    Sse::new(s).keep_alive(KeepAlive::default()).into_response()
}

/// Live events, without the cells the replay already sent.
struct Live {
    watcher: Watcher,
    /// Execution counts replayed: their live events (a cell that finished
    /// while the replay was read) are skipped, until a cell or kernel
    /// event says the counts have moved on.
    skip: HashSet<u64>,
}

impl Live {
    async fn next(&mut self) -> Option<Arc<SessionEvent>> {
        loop {
            let e = self.watcher.next().await?;
            if self.skip.is_empty() {
                return Some(e);
            }
            let count = match e.name {
                "cell_started" | "cell_finished" | "stdout" | "stderr" | "display" => {
                    e.value()["execution_count"].as_u64()
                }
                _ => None,
            };
            match count {
                Some(n) if self.skip.contains(&n) => continue,
                _ => {
                    self.skip.clear();
                    return Some(e);
                }
            }
        }
    }
}

fn sse_event(e: &SessionEvent) -> Event {
    let ev = Event::default().event(e.name).data(&e.data);
    if e.id > 0 {
        ev.id(e.id.to_string())
    } else {
        ev
    }
}

/// The rows of `child` (or of the session itself) of its newest kernel,
/// with an execution count above `since`, oldest first.
fn replay_rows(rows: Vec<HistoryEntry>, child: Option<&str>, since: u64) -> Vec<HistoryEntry> {
    let mine: Vec<HistoryEntry> = rows
        .into_iter()
        .filter(|r| r.child.as_deref() == child)
        .collect();
    let Some(newest) = mine.last().map(|r| r.kernel_id.clone()) else {
        return Vec::new();
    };
    mine.into_iter()
        .filter(|r| r.kernel_id == newest && r.execution_count > since)
        .collect()
}

fn replay_started(owner: &str, r: &HistoryEntry) -> Event {
    let data = json!({
        "session": owner,
        "execution_count": r.execution_count,
        "code": r.code,
        "front_end": null,
        "started_at": r.started_at,
        "replayed": true,
    });
    Event::default()
        .event("cell_started")
        .data(data.to_string())
}

/// A recorded cell as a result: what the history keeps of it (no
/// displays; text fields as recorded, bounded).
fn replay_finished(r: &HistoryEntry) -> Event {
    let mut result = json!({
        "status": r.status,
        "stdout": r.stdout,
        "stderr": r.stderr,
        "displays": [],
        "tool_calls_made": r.tool_calls_made,
        "duration_seconds": r.duration_seconds,
        "kernel": {
            "id": r.kernel_id,
            "execution_count": r.execution_count,
            "state_reset": r.state_reset,
            "state_lost": r.state_lost,
        },
    });
    for (k, v) in [("value", &r.value), ("error", &r.error)] {
        if let Some(v) = v {
            result[k] = json!(v);
        }
    }
    if let Some(n) = &r.note {
        result["kernel"]["note"] = json!(n);
    }
    let data = json!({
        "execution_count": r.execution_count,
        "result": result,
        "replayed": true,
    });
    Event::default()
        .event("cell_finished")
        .data(data.to_string())
}

//! The `/v1` handlers, `/healthz` and the JSON fallbacks.

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use cellhost::history::HistoryEntry;
use cellhost::registry::belongs_to_session;
use cellhost::KernelSummary;
use serde::{Deserialize, Serialize};

use crate::{ApiError, AppState};

/// Default and largest `limit` of a history query.
const HISTORY_DEFAULT: usize = 100;
const HISTORY_MAX: usize = 10_000;

fn path_error(r: PathRejection) -> ApiError {
    ApiError::bad_request("bad_path", format!("the URL path could not be read: {r}"))
}

/// Run a cell in a session's kernel (started on first use). With
/// `Accept: text/event-stream` the answer is a stream of `stdout`,
/// `stderr` and `display` events, then one `result` (or `error`).
#[utoipa::path(
    post, path = "/v1/sessions/{session}/execute",
    params(("session" = String, Path, description = "The conversation's stable session id")),
    request_body = crate::ExecuteRequest,
    responses(
        (status = 200, description = "The cell result (DESIGN.md contract); a failed cell is a result too, with status error/timeout/interrupted. With Accept: text/event-stream, events stdout/stderr ({text}), display ({items}), then result (this object) or error.", body = cellhost_protocol::CellResult),
        (status = 400, description = "Bad JSON, missing code, bad field", body = crate::error::ErrorBody),
        (status = 401, description = "Missing or wrong bearer token", body = crate::error::ErrorBody),
        (status = 403, description = "Host not this machine (tokenless daemon, see [server] allowed_hosts) or a cross-site Origin", body = crate::error::ErrorBody),
        (status = 413, description = "Body over the limit", body = crate::error::ErrorBody),
        (status = 415, description = "The body was not sent as Content-Type: application/json", body = crate::error::ErrorBody),
        (status = 503, description = "No kernel could be started, or shutting down", body = crate::error::ErrorBody),
    )
)]
pub(crate) async fn execute(
    State(state): State<AppState>,
    session: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let session = match session {
        Ok(Path(s)) => s,
        Err(r) => return path_error(r).into_response(),
    };
    let sse = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("text/event-stream"));
    crate::execute::run(state, session, body, sse).await
}

#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct Count {
    /// How many cells were interrupted / kernels disposed.
    count: usize,
}

fn has_kernels(state: &AppState, owner: &str) -> bool {
    state.manager.list().iter().any(|k| k.owner == owner)
}

/// Interrupt the running cell of the session's kernels (KeyboardInterrupt;
/// state kept).
#[utoipa::path(
    post, path = "/v1/sessions/{session}/interrupt",
    params(("session" = String, Path, description = "Session id")),
    responses(
        (status = 200, description = "How many cells were interrupted (0: none was running)", body = Count),
        (status = 404, description = "The session has no live kernel", body = crate::error::ErrorBody),
    )
)]
pub(crate) async fn interrupt(
    State(state): State<AppState>,
    session: Result<Path<String>, PathRejection>,
) -> Result<Json<Count>, ApiError> {
    let Path(session) = session.map_err(path_error)?;
    if !has_kernels(&state, &session) {
        return Err(ApiError::unknown_session(&session));
    }
    let count = state.manager.interrupt(&session).await;
    Ok(Json(Count { count }))
}

/// Dispose of the session: kill its kernels and its children's (a reset:
/// the next cell starts fresh and says so). History is kept.
#[utoipa::path(
    delete, path = "/v1/sessions/{session}",
    params(("session" = String, Path, description = "Session id")),
    responses(
        (status = 200, description = "Kernels disposed", body = Count),
        (status = 404, description = "The session has no live kernel", body = crate::error::ErrorBody),
    )
)]
pub(crate) async fn dispose_session(
    State(state): State<AppState>,
    session: Result<Path<String>, PathRejection>,
) -> Result<Json<Count>, ApiError> {
    let Path(session) = session.map_err(path_error)?;
    let live = state
        .manager
        .list()
        .iter()
        .any(|k| belongs_to_session(&k.owner, &session));
    let count = state.manager.dispose_owner(&session).await;
    crate::execute::forget_previous(&state, &session);
    if count == 0 && !live {
        return Err(ApiError::unknown_session(&session));
    }
    Ok(Json(Count { count }))
}

/// Dispose of one delegated child of the session (and its own children).
#[utoipa::path(
    delete, path = "/v1/sessions/{session}/children/{child}",
    params(("session" = String, Path, description = "Session id"), ("child" = String, Path, description = "Child id")),
    responses(
        (status = 200, description = "Kernels disposed", body = Count),
        (status = 400, description = "Bad child id", body = crate::error::ErrorBody),
        (status = 404, description = "The child has no live kernel", body = crate::error::ErrorBody),
    )
)]
pub(crate) async fn dispose_child(
    State(state): State<AppState>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<Count>, ApiError> {
    let Path((session, child)) = path.map_err(path_error)?;
    let count = state
        .manager
        .dispose_child(&session, &child)
        .await
        .map_err(|e| ApiError::bad_request("invalid_session", e.to_string()))?;
    if let Ok(owner) = cellhost::registry::child_owner(&session, &child) {
        crate::execute::forget_previous(&state, &owner);
    }
    if count == 0 {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_session",
            format!("session {session:?} has no live child {child:?}; nothing to dispose"),
        ));
    }
    Ok(Json(Count { count }))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub(crate) struct HistoryQuery {
    /// Most cells returned, newest ones, oldest first (default 100, at
    /// most 10000).
    limit: Option<usize>,
}

fn limit_of(q: Result<Query<HistoryQuery>, QueryRejection>) -> Result<usize, ApiError> {
    let Query(q) = q.map_err(|r| {
        ApiError::bad_request(
            "bad_query",
            format!("{}; use ?limit=N with N a positive number", r.body_text()),
        )
    })?;
    match q.limit {
        Some(0) => Err(ApiError::bad_request(
            "bad_query",
            "limit must be at least 1",
        )),
        Some(n) => Ok(n.min(HISTORY_MAX)),
        None => Ok(HISTORY_DEFAULT),
    }
}

async fn read_history(
    state: &AppState,
    session: Option<String>,
    limit: usize,
) -> Result<Vec<HistoryEntry>, ApiError> {
    let Some(history) = state.history.clone() else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "history_disabled",
            "this server keeps no history ([history] enabled = false)",
        ));
    };
    let rows = tokio::task::spawn_blocking(move || match &session {
        Some(s) => history.session(s, limit),
        None => history.recent(limit),
    })
    .await;
    match rows {
        Ok(Ok(rows)) => Ok(rows),
        Ok(Err(e)) => {
            eprintln!("cellhost: {e}");
            Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "history_unavailable",
                "the history database could not be read; see the server's log",
            ))
        }
        Err(_) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "reading the history failed; see the server's log",
        )),
    }
}

/// The session's last cells (its children's included), oldest first.
#[utoipa::path(
    get, path = "/v1/sessions/{session}/history",
    params(("session" = String, Path, description = "Session id"), HistoryQuery),
    responses(
        (status = 200, description = "Recorded cells: session, child, code, status, stdout, stderr, value, error, started_at, duration_seconds, execution_count, kernel_id, tool_calls_made"),
        (status = 404, description = "Unknown session", body = crate::error::ErrorBody),
    )
)]
pub(crate) async fn session_history(
    State(state): State<AppState>,
    session: Result<Path<String>, PathRejection>,
    query: Result<Query<HistoryQuery>, QueryRejection>,
) -> Result<Json<Vec<HistoryEntry>>, ApiError> {
    let Path(session) = session.map_err(path_error)?;
    let limit = limit_of(query)?;
    let rows = read_history(&state, Some(session.clone()), limit).await?;
    if rows.is_empty() && !has_kernels(&state, &session) {
        return Err(ApiError::unknown_session(&session));
    }
    Ok(Json(rows))
}

/// The last cells of every session, oldest first (the dashboard's feed).
#[utoipa::path(
    get, path = "/v1/history",
    params(HistoryQuery),
    responses((status = 200, description = "Recorded cells of all sessions"))
)]
pub(crate) async fn recent_history(
    State(state): State<AppState>,
    query: Result<Query<HistoryQuery>, QueryRejection>,
) -> Result<Json<Vec<HistoryEntry>>, ApiError> {
    let limit = limit_of(query)?;
    Ok(Json(read_history(&state, None, limit).await?))
}

/// Live kernels: owner, key, state, idle time, RSS, execution count.
#[utoipa::path(
    get, path = "/v1/kernels",
    responses((status = 200, description = "One entry per live owned kernel, oldest first", body = Vec<cellhost_protocol::KernelSummary>))
)]
pub(crate) async fn kernels(State(state): State<AppState>) -> Json<Vec<KernelSummary>> {
    Json(state.manager.list())
}

/// What code in a new session's kernel runs in: Python version, sandbox
/// profile and network mode, working dir, the dialect (`!cmd`, `%pip`,
/// magics), notable importable packages, and all of it as a paragraph for
/// a model's prompt (`summary`). The interpreter is asked once and cached.
#[utoipa::path(
    get, path = "/v1/environment",
    responses((status = 200, description = "The environment of new sessions' kernels", body = cellhost_protocol::Environment))
)]
pub(crate) async fn environment(
    State(state): State<AppState>,
) -> Json<cellhost::environment::Environment> {
    Json(cellhost::environment::describe(state.manager.options()).await)
}

#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct Health {
    status: &'static str,
    kernels: usize,
}

/// Liveness (no auth needed).
#[utoipa::path(get, path = "/healthz", responses((status = 200, body = Health)))]
pub(crate) async fn healthz(State(state): State<AppState>) -> Json<Health> {
    Json(Health {
        status: "ok",
        kernels: state.manager.list().len(),
    })
}

pub(crate) async fn not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!(
            "no route {method} {}; the API is listed at /openapi.json",
            uri.path()
        ),
    )
}

pub(crate) async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!(
            "{method} is not allowed on {}; the API is listed at /openapi.json",
            uri.path()
        ),
    )
}

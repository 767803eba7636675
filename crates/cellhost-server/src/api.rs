//! The `/v1` handlers, `/healthz` and the JSON fallbacks.

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use cellhost::history::{cap_text, Page, PageQuery};
use cellhost::registry::belongs_to_session;
use cellhost::KernelSummary;
use serde::{Deserialize, Serialize};

use crate::tenant::Scope;
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
    scope: Scope,
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
    crate::execute::run(state, scope.key(&session), body, sse).await
}

use cellhost_protocol::Count;

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
    scope: Scope,
    session: Result<Path<String>, PathRejection>,
) -> Result<Json<Count>, ApiError> {
    let Path(session) = session.map_err(path_error)?;
    let key = scope.key(&session);
    if !has_kernels(&state, &key) {
        return Err(ApiError::unknown_session(&session));
    }
    let count = state.manager.interrupt(&key).await;
    Ok(Json(Count { count }))
}

/// Snapshot the session's live kernel now, between its cells (see
/// docs/snapshots.md): a daemon that starts after this one was killed
/// restores it, saying how old it is; eviction, reaping and shutdown take
/// their own.
#[utoipa::path(
    post, path = "/v1/sessions/{session}/snapshot",
    params(("session" = String, Path, description = "Session id")),
    responses(
        (status = 200, description = "What the snapshot kept and skipped", body = cellhost_protocol::SnapshotReport),
        (status = 404, description = "Unknown session", body = crate::error::ErrorBody),
        (status = 409, description = "No live kernel, or snapshots are off", body = crate::error::ErrorBody),
        (status = 413, description = "The state is over [snapshots] max_mib", body = crate::error::ErrorBody),
    )
)]
pub(crate) async fn snapshot_session(
    State(state): State<AppState>,
    scope: Scope,
    session: Result<Path<String>, PathRejection>,
) -> Result<Json<cellhost_protocol::SnapshotReport>, ApiError> {
    let Path(session) = session.map_err(path_error)?;
    let key = scope.key(&session);
    if !has_kernels(&state, &key) {
        return Err(ApiError::unknown_session(&session));
    }
    Ok(Json(state.manager.snapshot(&key).await?))
}

/// Fork the session's live kernel into new sessions (see
/// docs/snapshots.md): each starts with an independent copy of its state
/// (loaded before its first cell, which says so) and of its workspace
/// files.
#[utoipa::path(
    post, path = "/v1/sessions/{session}/fork",
    params(("session" = String, Path, description = "Session id")),
    request_body = cellhost_protocol::ForkRequest,
    responses(
        (status = 200, description = "The new sessions, in the order asked for, and which path made each", body = cellhost_protocol::ForkReport),
        (status = 400, description = "No, too many, repeated or invalid targets", body = crate::error::ErrorBody),
        (status = 404, description = "The session has no live kernel and no snapshot of its state", body = crate::error::ErrorBody),
        (status = 409, description = "No live kernel, or a target already has a kernel, a snapshot or files", body = crate::error::ErrorBody),
        (status = 413, description = "The state is over [snapshots] max_mib", body = crate::error::ErrorBody),
        (status = 507, description = "The files are over a target's workspace quota", body = crate::error::ErrorBody),
    )
)]
pub(crate) async fn fork_session(
    State(state): State<AppState>,
    scope: Scope,
    session: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<cellhost_protocol::ForkReport>, ApiError> {
    let Path(session) = session.map_err(path_error)?;
    let source = scope.key(&session);
    fork(&state, &scope, &session, None, source, body).await
}

/// Fork one delegated child of the session, as `POST
/// /v1/sessions/{session}/fork` forks a session.
#[utoipa::path(
    post, path = "/v1/sessions/{session}/children/{child}/fork",
    params(("session" = String, Path, description = "Session id"), ("child" = String, Path, description = "Child id")),
    request_body = cellhost_protocol::ForkRequest,
    responses(
        (status = 200, description = "The new sessions", body = cellhost_protocol::ForkReport),
        (status = 400, description = "Bad child id or targets", body = crate::error::ErrorBody),
        (status = 404, description = "The child has no live kernel and no snapshot of its state", body = crate::error::ErrorBody),
        (status = 409, description = "A target already has a kernel, a snapshot or files", body = crate::error::ErrorBody),
    )
)]
pub(crate) async fn fork_child(
    State(state): State<AppState>,
    scope: Scope,
    path: Result<Path<(String, String)>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<cellhost_protocol::ForkReport>, ApiError> {
    let Path((session, child)) = path.map_err(path_error)?;
    let source = cellhost::registry::child_owner(&scope.key(&session), &child)
        .map_err(|e| ApiError::bad_request("invalid_session", e.to_string()))?;
    fork(&state, &scope, &session, Some(child), source, body).await
}

async fn fork(
    state: &AppState,
    scope: &Scope,
    session: &str,
    child: Option<String>,
    source: String,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<cellhost_protocol::ForkReport>, ApiError> {
    let body = body.map_err(|r| crate::execute::body_error(r, state.options.max_body_bytes))?;
    let req: cellhost_protocol::ForkRequest = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request(
            "bad_request",
            format!("the body must be {{\"into\": \"s2\"}} or {{\"into\": [\"a\", {{\"session\": \"b\", \"child\": \"c\"}}]}}: {e}"),
        )
    })?;
    // A session at rest (its kernel evicted or reaped, its state in a
    // snapshot) forks too.
    if !has_kernels(state, &source) && !state.manager.has_snapshot(&source) {
        let what = match &child {
            Some(c) => format!(
                "session {session:?} has no live child {c:?} and no snapshot of one to fork"
            ),
            None => format!(
                "session {session:?} has no live kernel and no snapshot of its state to fork; \
                 run a cell in it first (POST /v1/sessions/{{session}}/execute)"
            ),
        };
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_session",
            what,
        ));
    }
    let targets = req.into.to_vec();
    let mut owners = Vec::with_capacity(targets.len());
    for t in &targets {
        let (s, c) = t.parts();
        owners.push(match c {
            None => scope.key(s),
            Some(c) => cellhost::registry::child_owner(&scope.key(s), c)
                .map_err(|e| ApiError::bad_request("invalid_session", e.to_string()))?,
        });
    }
    let mut report = state.manager.fork(&source, &owners).await?;
    // The caller's names, not the tenant-scoped keys.
    report.from = session.to_owned();
    for (forked, t) in report.into.iter_mut().zip(&targets) {
        let (s, c) = t.parts();
        forked.session = s.to_owned();
        forked.child = c.map(str::to_owned);
    }
    Ok(Json(report))
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
    scope: Scope,
    session: Result<Path<String>, PathRejection>,
) -> Result<Json<Count>, ApiError> {
    let Path(session) = session.map_err(path_error)?;
    let key = scope.key(&session);
    let live = state
        .manager
        .list()
        .iter()
        .any(|k| belongs_to_session(&k.owner, &key));
    let count = state.manager.dispose_owner(&key).await;
    crate::execute::forget_previous(&state, &key);
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
    scope: Scope,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<Count>, ApiError> {
    let Path((session, child)) = path.map_err(path_error)?;
    let key = scope.key(&session);
    let count = state
        .manager
        .dispose_child(&key, &child)
        .await
        .map_err(|e| ApiError::bad_request("invalid_session", e.to_string()))?;
    if let Ok(owner) = cellhost::registry::child_owner(&key, &child) {
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
    /// Most bytes of code and output in the page (default 2 MiB, at most
    /// 16 MiB); the newest cell comes even when it alone is larger.
    max_bytes: Option<usize>,
    /// Only cells older than this id: the `Cellhost-Next-Before` header
    /// of the previous page, which is there when older cells were left out.
    before: Option<i64>,
    /// Only cells newer than this id (a poller's last seen id).
    after: Option<i64>,
    /// Cut each text field to about this many bytes (head and tail), for
    /// a listing; at least 256.
    preview: Option<usize>,
}

/// Default and largest `max_bytes` of a history page.
const PAGE_BYTES_DEFAULT: usize = 2 << 20;
const PAGE_BYTES_MAX: usize = 16 << 20;

fn page_of(
    q: Result<Query<HistoryQuery>, QueryRejection>,
    session: Option<String>,
    scope: &Scope,
) -> Result<(PageQuery, Option<usize>), ApiError> {
    let Query(q) = q.map_err(|r| {
        ApiError::bad_request(
            "bad_query",
            format!(
                "{}; use ?limit=N&max_bytes=N&before=ID&after=ID&preview=N with positive numbers",
                r.body_text()
            ),
        )
    })?;
    if q.limit == Some(0) || q.max_bytes == Some(0) {
        return Err(ApiError::bad_request(
            "bad_query",
            "limit and max_bytes must be at least 1",
        ));
    }
    let mut page = PageQuery {
        session,
        tenant: None,
        limit: q.limit.unwrap_or(HISTORY_DEFAULT).min(HISTORY_MAX),
        max_bytes: q
            .max_bytes
            .unwrap_or(PAGE_BYTES_DEFAULT)
            .min(PAGE_BYTES_MAX),
        before: q.before,
        after: q.after,
    };
    scope.history(&mut page);
    Ok((page, q.preview.map(|p| p.max(256))))
}

async fn read_history(state: &AppState, q: PageQuery) -> Result<Page, ApiError> {
    let Some(history) = state.history.clone() else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "history_disabled",
            "this server keeps no history ([history] enabled = false)",
        ));
    };
    let rows = tokio::task::spawn_blocking(move || history.page(&q)).await;
    match rows {
        Ok(Ok(page)) => Ok(page),
        Ok(Err(e)) => {
            eprintln!("cellhost: {}", cellhost::error_chain(&e));
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

/// The rows as JSON (an array, as before paging), with the continuation
/// in `Cellhost-Next-Before` and a `Link: <…?before=ID…>; rel="next"`.
fn page_response(
    scope: &Scope,
    path: &str,
    q: &PageQuery,
    mut page: Page,
    preview: Option<usize>,
) -> Response {
    for r in &mut page.rows {
        scope.row(r);
    }
    if let Some(n) = preview {
        for r in &mut page.rows {
            r.code = cap_text(&r.code, n, true);
            for t in [&mut r.stdout, &mut r.stderr] {
                *t = cap_text(t, n, false);
            }
            for t in [&mut r.value, &mut r.error].into_iter().flatten() {
                *t = cap_text(t, n, false);
            }
            // A listing carries small displays only (text fallbacks,
            // icons); a plot comes with the session's own page.
            r.displays.retain(|d| d.data.len() <= n);
        }
    }
    let mut resp = Json(page.rows).into_response();
    if let Some(id) = page.next_before {
        let mut link = format!(
            "<{path}?before={id}&limit={}&max_bytes={}",
            q.limit, q.max_bytes
        );
        if let Some(a) = q.after {
            link.push_str(&format!("&after={a}"));
        }
        if let Some(p) = preview {
            link.push_str(&format!("&preview={p}"));
        }
        link.push_str(">; rel=\"next\"");
        let h = resp.headers_mut();
        h.insert("cellhost-next-before", id.into());
        if let Ok(v) = link.parse() {
            h.insert(header::LINK, v);
        }
    }
    resp
}

/// The session's last cells (its children's included), oldest first,
/// bounded by rows and bytes.
#[utoipa::path(
    get, path = "/v1/sessions/{session}/history",
    params(("session" = String, Path, description = "Session id"), HistoryQuery),
    responses(
        (status = 200, description = "Recorded cells: session, child, code, status, stdout, stderr, value, error, started_at, duration_seconds, execution_count, kernel_id, tool_calls_made. When older cells were left out (limit or max_bytes), the header Cellhost-Next-Before names the id to pass as ?before= for the next page (also as a Link rel=next)."),
        (status = 404, description = "Unknown session", body = crate::error::ErrorBody),
    )
)]
pub(crate) async fn session_history(
    State(state): State<AppState>,
    scope: Scope,
    session: Result<Path<String>, PathRejection>,
    query: Result<Query<HistoryQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Path(session) = session.map_err(path_error)?;
    let (q, preview) = page_of(query, Some(session.clone()), &scope)?;
    let page = read_history(&state, q.clone()).await?;
    let cursor = q.before.is_some() || q.after.is_some();
    if page.rows.is_empty() && !cursor && !has_kernels(&state, &scope.key(&session)) {
        return Err(ApiError::unknown_session(&session));
    }
    let path = format!("/v1/sessions/{}/history", percent(&session));
    Ok(page_response(&scope, &path, &q, page, preview))
}

/// The last cells of every session, oldest first (the dashboard's feed),
/// bounded by rows and bytes.
#[utoipa::path(
    get, path = "/v1/history",
    params(HistoryQuery),
    responses((status = 200, description = "Recorded cells of all sessions; Cellhost-Next-Before / Link rel=next when older cells were left out"))
)]
pub(crate) async fn recent_history(
    State(state): State<AppState>,
    scope: Scope,
    query: Result<Query<HistoryQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let (q, preview) = page_of(query, None, &scope)?;
    let page = read_history(&state, q.clone()).await?;
    Ok(page_response(&scope, "/v1/history", &q, page, preview))
}

/// A path segment with everything but unreserved characters escaped.
fn percent(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// One `/v1/kernels` entry: the kernel, and the MCP client that runs it
/// when known.
#[derive(Serialize)]
pub(crate) struct KernelView {
    #[serde(flatten)]
    kernel: KernelSummary,
    #[serde(skip_serializing_if = "Option::is_none")]
    client: Option<String>,
}

/// Live kernels: owner, key, state, idle time, RSS, execution count.
#[utoipa::path(
    get, path = "/v1/kernels",
    responses((status = 200, description = "One entry per live owned kernel, oldest first; `client` names the MCP client (clientInfo) that ran cells as this owner, when known", body = Vec<cellhost_protocol::KernelSummary>))
)]
pub(crate) async fn kernels(State(state): State<AppState>, scope: Scope) -> Json<Vec<KernelView>> {
    Json(
        scope
            .kernels(&state)
            .into_iter()
            .map(|kernel| KernelView {
                client: state.clients.get(&scope.key(&kernel.owner)),
                kernel,
            })
            .collect(),
    )
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
    /// `ok`, or `degraded` while something below is wrong (the daemon
    /// still runs cells).
    status: &'static str,
    kernels: usize,
    /// What is wrong, one sentence each (absent when `ok`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    problems: Vec<String>,
}

/// Liveness (no auth needed); `degraded` when the history cannot be
/// written (a full disk).
#[utoipa::path(get, path = "/healthz", responses((status = 200, body = Health)))]
pub(crate) async fn healthz(State(state): State<AppState>) -> Json<Health> {
    let mut problems = Vec::new();
    if let Some(h) = &state.history {
        let health = h.health();
        if let Some(why) = health.failing {
            problems.push(format!(
                "history: the latest cell could not be recorded ({why}; {} row(s) lost since \
                 start); free space in the data dir",
                health.write_failures
            ));
        }
    }
    Json(Health {
        status: if problems.is_empty() {
            "ok"
        } else {
            "degraded"
        },
        kernels: state.manager.list().len(),
        problems,
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

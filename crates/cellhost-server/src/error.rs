//! One error shape for every route: `{"error": {"code", "message"}}` with
//! the right status. Messages say what was wrong and what to do; internal
//! details never leak.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

/// An API error: an HTTP status, a stable machine code, a sentence.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// The response's status.
    pub status: StatusCode,
    /// The stable code clients match on (`bad_json`, `unknown_session`, …).
    pub code: &'static str,
    /// What was wrong and what to do, for a person.
    pub message: String,
    /// Seconds for a `Retry-After` header (429, 503).
    pub retry_after: Option<u64>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct ErrorBody {
    error: ErrorDetail,
}

#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct ErrorDetail {
    /// Stable machine-readable code, e.g. `bad_json`, `unknown_session`.
    code: String,
    /// What was wrong and what to do.
    message: String,
}

impl ApiError {
    /// An error answered with `status`, `code` and `message`.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after: None,
        }
    }

    /// Ask the client to retry after `seconds` (`Retry-After`).
    pub fn retry_after(mut self, seconds: u64) -> ApiError {
        self.retry_after = Some(seconds);
        self
    }

    /// A 400 with `code` and `message`.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, code, message)
    }

    /// A 404 `unknown_session`: no live kernel and no history for
    /// `session`.
    pub fn unknown_session(session: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_session",
            format!(
                "no session {session:?} is known here (no live kernel and no history); \
                 run a cell with POST /v1/sessions/{{session}}/execute to start one"
            ),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code.to_owned(),
                message: self.message,
            },
        };
        let mut resp = (self.status, Json(body)).into_response();
        if let Some(s) = self.retry_after {
            resp.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, s.into());
        }
        resp
    }
}

/// A refused cell request is a 400 with the request's own code.
impl From<cellhost_protocol::RequestError> for ApiError {
    fn from(e: cellhost_protocol::RequestError) -> ApiError {
        ApiError::bad_request(e.code, e.message)
    }
}

impl From<cellhost::registry::ManagerError> for ApiError {
    fn from(e: cellhost::registry::ManagerError) -> ApiError {
        use cellhost::registry::ManagerError;
        match e {
            ManagerError::Owner(e) => {
                ApiError::bad_request("invalid_session", cellhost::error_chain(&e))
            }
            ManagerError::Tools(e) => {
                ApiError::bad_request("unknown_tool", cellhost::error_chain(&e))
            }
            ManagerError::ShutDown => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting_down",
                "the server is shutting down; retry against a new one",
            ),
            // A remote start failure already says what failed on the
            // backend and what to check; a local one is about Python or
            // the sandbox.
            ManagerError::Kernel(e) if e.remote_backend().is_some() => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "kernel_unavailable",
                cellhost::error_chain(&e),
            ),
            ManagerError::Kernel(e) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "kernel_unavailable",
                format!(
                    "{}; check the server's Python and sandbox setup (cellhost serve --help)",
                    cellhost::error_chain(&e)
                ),
            ),
            ManagerError::Snapshot(e) => snapshot_error(&e),
            ManagerError::Fork(e) => fork_error(e),
            // A failure the library added later: a 500 that still names it.
            other => ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                cellhost::error_chain(&other),
            ),
        }
    }
}

/// A fork refused or failed: what the caller can do about it.
fn fork_error(e: cellhost::registry::ForkError) -> ApiError {
    use cellhost::registry::ForkError;
    let text = cellhost::error_chain(&e);
    match e {
        ForkError::TargetInUse { .. } => {
            ApiError::new(StatusCode::CONFLICT, "fork_target_in_use", text)
        }
        ForkError::Workspace { err, .. } => {
            let mut api = ApiError::from(err);
            if api.status != StatusCode::INTERNAL_SERVER_ERROR {
                api.message = text; // which target, and why
            }
            api
        }
        _ => ApiError::bad_request("invalid_fork", text),
    }
}

/// A snapshot asked for and not taken: what the caller can do about it.
fn snapshot_error(e: &cellhost::SnapshotError) -> ApiError {
    use cellhost::SnapshotError;
    let (status, code) = match e {
        SnapshotError::NoKernel => (StatusCode::CONFLICT, "no_kernel"),
        SnapshotError::Off => (StatusCode::CONFLICT, "snapshots_off"),
        SnapshotError::Unsupported { .. } => (StatusCode::NOT_IMPLEMENTED, "snapshot_unsupported"),
        SnapshotError::TooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "snapshot_too_large"),
        SnapshotError::Runner(_)
        | SnapshotError::KernelGone(_)
        | SnapshotError::TimedOut { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "snapshot_failed"),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "snapshot_failed"),
    };
    ApiError::new(status, code, cellhost::error_chain(e))
}

//! The workspace file routes: `PUT`/`GET`/`DELETE`
//! `/v1/sessions/{session}/files/{path}` (and the same under
//! `…/children/{child}/files…`), `GET …/files` for the listing.
//!
//! Everything goes through the library's [`Workspace`] handle (path rules,
//! ownership, quota live there). Bodies stream both ways in chunks: an
//! upload is never held in memory whole, so the `/v1` body limit does not
//! apply here; `[files] max_upload_mib` does (413 naming the key).

use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use cellhost::files::{FileError, Opened, Workspace, WriteLimits, DEFAULT_MAX_ENTRIES};
use futures_util::TryStreamExt;
use serde::Deserialize;

use crate::tenant::Scope;
use crate::{ApiError, AppState};

const MIB: u64 = 1024 * 1024;

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct FilesQuery {
    /// Listing: every level; DELETE: a directory with what is in it.
    #[serde(default)]
    recursive: bool,
    /// Most listing entries (default and at most 10,000).
    limit: Option<usize>,
}

impl From<FileError> for ApiError {
    fn from(e: FileError) -> ApiError {
        let status = match &e {
            FileError::InvalidPath { .. } | FileError::Body(_) => StatusCode::BAD_REQUEST,
            FileError::NotFound { .. } => StatusCode::NOT_FOUND,
            FileError::IsADirectory { .. }
            | FileError::NotADirectory { .. }
            | FileError::NotRegular { .. } => StatusCode::CONFLICT,
            FileError::QuotaExceeded { .. } => StatusCode::INSUFFICIENT_STORAGE,
            FileError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            // `Io`, and any failure the library adds later: logged, and
            // answered without internals.
            _ => {
                eprintln!("cellhost: workspace: {}", cellhost::error_chain(&e));
                return ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "io",
                    "the workspace could not be read or written; see the server's log",
                );
            }
        };
        ApiError::new(status, e.code(), cellhost::error_chain(&e))
    }
}

fn query_of(q: Result<Query<FilesQuery>, QueryRejection>) -> Result<FilesQuery, ApiError> {
    q.map(|Query(q)| q).map_err(|r| {
        ApiError::bad_request(
            "bad_query",
            format!("{}; use ?recursive=true and ?limit=N", r.body_text()),
        )
    })
}

fn path_error(r: PathRejection) -> ApiError {
    ApiError::bad_request("bad_path", format!("the URL path could not be read: {r}"))
}

/// The handle of the owner a route names (a session, or its child).
fn workspace_of(
    state: &AppState,
    scope: &Scope,
    session: &str,
    child: Option<&str>,
) -> Result<Workspace, ApiError> {
    let session = &scope.key(session);
    let owner = match child {
        Some(c) => cellhost::registry::child_owner(session, c)
            .map_err(|e| ApiError::bad_request("invalid_session", e.to_string()))?,
        None => session.to_owned(),
    };
    Ok(state.manager.workspace(&owner)?)
}

/// `(session, child, path)` from any of the file routes.
#[derive(Debug, Deserialize)]
pub(crate) struct Target {
    session: String,
    child: Option<String>,
    #[serde(default)]
    path: String,
}

/// Upload: the body is the file's bytes, streamed to a temporary file and
/// renamed into place. 201 new, 200 replaced: `{path, size, sha256}`.
pub(crate) async fn put(
    State(state): State<AppState>,
    scope: Scope,
    target: Result<Path<Target>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let Path(t) = target.map_err(path_error)?;
    let ws = workspace_of(&state, &scope, &t.session, t.child.as_deref())?;
    let max = state.options.max_upload_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let (Some(max), Some(len)) = (max, declared) {
        if len > max {
            return Err(FileError::TooLarge {
                limit_mib: max / MIB,
            }
            .into());
        }
    }
    let reader = tokio_util::io::StreamReader::new(
        body.into_data_stream()
            .map_err(|e| std::io::Error::other(e.to_string())),
    );
    let written = ws
        .write(&t.path, reader, WriteLimits { max_bytes: max })
        .await?;
    let status = if written.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(written)).into_response())
}

/// Download (a file: its bytes, ranges, ETag) or list (a directory).
pub(crate) async fn get(
    State(state): State<AppState>,
    scope: Scope,
    target: Result<Path<Target>, PathRejection>,
    query: Result<Query<FilesQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let Path(t) = target.map_err(path_error)?;
    let q = query_of(query)?;
    let ws = workspace_of(&state, &scope, &t.session, t.child.as_deref())?;
    let file = match ws.open(&t.path).await? {
        Opened::Dir => {
            let max = q
                .limit
                .unwrap_or(DEFAULT_MAX_ENTRIES)
                .clamp(1, DEFAULT_MAX_ENTRIES);
            let listing = ws.list(&t.path, q.recursive, max).await?;
            return Ok(Json(serde_json::json!({
                "path": t.path.trim_matches('/'),
                "entries": listing.entries,
                "truncated": listing.truncated,
            }))
            .into_response());
        }
        Opened::File(f) => f,
    };
    let etag = file.etag.clone();
    let size = file.size;
    let mut h = HeaderMap::new();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(cellhost::files::mime_of(&t.path)),
    );
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    // Whatever a cell wrote is served inert: never sniffed, never run
    // as a page of this origin (the dashboard's).
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("sandbox"),
    );
    if let Ok(v) = HeaderValue::from_str(&etag) {
        h.insert(header::ETAG, v);
    }
    if headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag || t.trim() == "*"))
    {
        return Ok((StatusCode::NOT_MODIFIED, h).into_response());
    }
    let range = headers
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .map(|v| parse_range(v, size));
    let (status, start, len) = match range {
        None | Some(Range::Ignored) => (StatusCode::OK, 0, size),
        Some(Range::Bytes(start, len)) => {
            let end = start + len - 1;
            let v = format!("bytes {start}-{end}/{size}");
            h.insert(
                header::CONTENT_RANGE,
                HeaderValue::from_str(&v).expect("ascii"),
            );
            (StatusCode::PARTIAL_CONTENT, start, len)
        }
        Some(Range::Unsatisfiable) => {
            let v = format!("bytes */{size}");
            h.insert(
                header::CONTENT_RANGE,
                HeaderValue::from_str(&v).expect("ascii"),
            );
            return Ok((
                StatusCode::RANGE_NOT_SATISFIABLE,
                h,
                ApiError::new(
                    StatusCode::RANGE_NOT_SATISFIABLE,
                    "range_not_satisfiable",
                    format!("the file has {size} bytes; ask for a range inside it"),
                ),
            )
                .into_response());
        }
    };
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    let reader = file.range(start, len).await.map_err(|err| FileError::Io {
        about: "seek a file",
        err,
    })?;
    let stream = tokio_util::io::ReaderStream::with_capacity(reader, 256 * 1024);
    Ok((status, h, Body::from_stream(stream)).into_response())
}

/// Remove a file, or a directory with `?recursive=true`.
pub(crate) async fn delete(
    State(state): State<AppState>,
    scope: Scope,
    target: Result<Path<Target>, PathRejection>,
    query: Result<Query<FilesQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Path(t) = target.map_err(path_error)?;
    let q = query_of(query)?;
    let ws = workspace_of(&state, &scope, &t.session, t.child.as_deref())?;
    ws.remove(&t.path, q.recursive).await?;
    Ok(
        Json(serde_json::json!({ "path": t.path.trim_matches('/'), "removed": true }))
            .into_response(),
    )
}

#[derive(Debug, PartialEq, Eq)]
enum Range {
    /// Start and length.
    Bytes(u64, u64),
    Unsatisfiable,
    /// Not a single byte range: the whole file (RFC 9110 allows that).
    Ignored,
}

/// `bytes=a-b`, `bytes=a-`, `bytes=-n` (one range).
fn parse_range(v: &str, size: u64) -> Range {
    let Some(spec) = v.trim().strip_prefix("bytes=") else {
        return Range::Ignored;
    };
    if spec.contains(',') {
        return Range::Ignored;
    }
    let Some((a, b)) = spec.trim().split_once('-') else {
        return Range::Ignored;
    };
    let (a, b) = (a.trim(), b.trim());
    let parsed = match (a.parse::<u64>(), b.parse::<u64>()) {
        (Ok(start), Ok(end)) if start <= end => Some((start, end.min(size.saturating_sub(1)))),
        (Ok(start), Err(_)) if b.is_empty() => Some((start, size.saturating_sub(1))),
        (Err(_), Ok(n)) if a.is_empty() => {
            if n == 0 {
                return Range::Unsatisfiable;
            }
            Some((size.saturating_sub(n), size.saturating_sub(1)))
        }
        _ => return Range::Ignored,
    };
    match parsed {
        Some((start, end)) if start < size && start <= end => Range::Bytes(start, end - start + 1),
        _ => Range::Unsatisfiable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_follow_rfc_9110() {
        assert_eq!(parse_range("bytes=0-9", 100), Range::Bytes(0, 10));
        assert_eq!(parse_range("bytes=90-", 100), Range::Bytes(90, 10));
        assert_eq!(parse_range("bytes=-5", 100), Range::Bytes(95, 5));
        assert_eq!(parse_range("bytes=50-500", 100), Range::Bytes(50, 50));
        assert_eq!(parse_range("bytes=100-", 100), Range::Unsatisfiable);
        assert_eq!(parse_range("bytes=-0", 100), Range::Unsatisfiable);
        assert_eq!(parse_range("bytes=0-1,5-6", 100), Range::Ignored);
        assert_eq!(parse_range("items=0-1", 100), Range::Ignored);
        assert_eq!(parse_range("bytes=9-3", 100), Range::Ignored);
        assert_eq!(cellhost::files::mime_of("a/chart.PNG"), "image/png");
        assert_eq!(
            cellhost::files::mime_of("noext"),
            "application/octet-stream"
        );
    }
}

//! The dashboard at `/`: one page, its script and style embedded in the
//! binary (no CDN: it works offline). The overview lists sessions (live
//! kernels and recent cells, with a search box); a session's page
//! (`/#/session/NAME`) is its timeline, files and controls. Everything the
//! page shows comes from the API with the page's own credentials, so it
//! sees what the caller may see. Cell text is only ever put in the page as
//! text (never parsed as HTML); HTML displays render in a sandboxed
//! iframe without same-origin or scripts.
//!
//! Every response of the daemon says it may not be framed
//! ([`no_framing`]): the dashboard's buttons cannot be clickjacked.

use axum::extract::{Path, Request};
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::ApiError;

const INDEX: &str = include_str!("../assets/index.html");
const APP_JS: &str = include_str!("../assets/app.js");
const STYLE: &str = include_str!("../assets/style.css");

/// The page's policy: its own script and style only, images from itself
/// or inline data, no plugins, nothing framing it. HTML displays live in
/// `srcdoc` iframes, which inherit this policy (so a display cannot load
/// from elsewhere either); inline styles are allowed for them (tables of
/// dataframes), inline scripts are not.
const PAGE_CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
     img-src 'self' data: blob:; connect-src 'self'; frame-src 'self'; base-uri 'none'; \
     form-action 'none'; object-src 'none'; frame-ancestors 'none'";

pub(crate) async fn index() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (header::CONTENT_SECURITY_POLICY, PAGE_CSP),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        INDEX,
    )
        .into_response()
}

pub(crate) async fn asset(Path(file): Path<String>) -> Response {
    let (mime, body) = match file.as_str() {
        "app.js" => ("text/javascript; charset=utf-8", APP_JS),
        "style.css" => ("text/css; charset=utf-8", STYLE),
        _ => {
            return ApiError::new(
                axum::http::StatusCode::NOT_FOUND,
                "not_found",
                format!("no dashboard asset {file:?}"),
            )
            .into_response()
        }
    };
    (
        [
            (header::CONTENT_TYPE, mime),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response()
}

/// `X-Frame-Options: DENY` and `frame-ancestors 'none'` on every answer
/// (added to a policy the handler set, e.g. the files' `sandbox`).
pub(crate) async fn no_framing(req: Request, next: Next) -> Response {
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    let csp = match h.get(header::CONTENT_SECURITY_POLICY) {
        None => Some(HeaderValue::from_static("frame-ancestors 'none'")),
        Some(v) => match v.to_str() {
            Ok(s) if s.contains("frame-ancestors") => None,
            Ok(s) => HeaderValue::from_str(&format!("{s}; frame-ancestors 'none'")).ok(),
            Err(_) => Some(HeaderValue::from_static("frame-ancestors 'none'")),
        },
    };
    if let Some(v) = csp {
        h.insert(header::CONTENT_SECURITY_POLICY, v);
    }
    resp
}

//! Bearer-token auth: with a token configured, every route but `/healthz`
//! needs `Authorization: Bearer <token>`. Browsers get the dashboard by
//! opening `/?token=<token>` once: that sets an HttpOnly, SameSite=Strict
//! cookie the page's own requests then carry (as Jupyter does).

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::{ApiError, AppState};

/// The dashboard's cookie.
pub(crate) const COOKIE: &str = "cellhost_token";

pub(crate) async fn require_token(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Response {
    let Some(token) = state.options.token.as_deref() else {
        return next.run(req).await;
    };
    if req.uri().path() == "/healthz" {
        return next.run(req).await;
    }
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let cookie = req
        .headers()
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().strip_prefix(COOKIE)?.strip_prefix('='))
        .any(|v| equal(v.as_bytes(), token.as_bytes()));
    if bearer.is_some_and(|b| equal(b.as_bytes(), token.as_bytes())) || cookie {
        return next.run(req).await;
    }
    // `/?token=…` (the URL `cellhost serve` prints) sets the cookie.
    let query_token = (req.uri().path() == "/")
        .then(|| req.uri().query())
        .flatten()
        .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("token=")));
    if query_token.is_some_and(|q| equal(q.as_bytes(), token.as_bytes())) {
        let mut resp = next.run(req).await;
        let cookie = format!("{COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/");
        if let Ok(v) = HeaderValue::from_str(&cookie) {
            resp.headers_mut().insert(header::SET_COOKIE, v);
        }
        return resp;
    }
    let message = if bearer.is_some() {
        "the bearer token is wrong; use the token the server was started with (CELLHOST_TOKEN)"
    } else {
        "this server needs a token: send `Authorization: Bearer <token>` (CELLHOST_TOKEN), \
         or open the dashboard as /?token=<token>"
    };
    let mut resp = ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message).into_response();
    resp.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"cellhost\""),
    );
    resp
}

/// Constant-time comparison (for equal lengths; the length is not secret).
fn equal(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

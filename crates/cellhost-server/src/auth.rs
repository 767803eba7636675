//! Bearer-token auth: with a token configured, every route but `/healthz`
//! needs `Authorization: Bearer <token>`. Browsers get the dashboard by
//! opening `/?token=<token>` once: that sets an HttpOnly, SameSite=Strict
//! cookie the page's own requests then carry (as Jupyter does). The
//! cookie alone authenticates reads (GET/HEAD) only: a state-changing
//! request with the cookie also needs the header `X-Cellhost: 1`, which
//! the dashboard's script sends and a cross-site form cannot.
//!
//! The token says who the caller is: the `[server] token` is the admin,
//! a `[[tenants]]` token that tenant (see `tenant`).

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::tenant::Caller;
use crate::{ApiError, AppState};

/// The dashboard's cookie.
pub(crate) const COOKIE: &str = "cellhost_token";
/// The header (value `1`) that lets the cookie authenticate a
/// state-changing request.
pub(crate) const CSRF_HEADER: &str = "x-cellhost";

/// The token of `Authorization: Bearer <token>` (scheme case-insensitive,
/// the token taken as sent), or of `Authorization: token <token>` as
/// Jupyter clients send it.
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    (scheme.eq_ignore_ascii_case("bearer") || scheme.eq_ignore_ascii_case("token")).then_some(token)
}

/// `?token=` of a Jupyter request (`/api/…`), as Jupyter clients put it
/// on WebSocket URLs.
fn jupyter_query_token(req: &Request) -> Option<&str> {
    let path = req.uri().path();
    if path != "/api" && !path.starts_with("/api/") {
        return None;
    }
    req.uri()
        .query()?
        .split('&')
        .find_map(|kv| kv.strip_prefix("token="))
}

/// Who `token` is: the admin (`[server] token`) or a tenant.
fn caller_of(state: &AppState, token: &str) -> Option<Caller> {
    let admin = state
        .options
        .token
        .as_deref()
        .is_some_and(|t| equal(token.as_bytes(), t.as_bytes()));
    let tenant = state.options.tenants.authenticate(token.as_bytes());
    match (admin, tenant) {
        (true, _) => Some(Caller::Admin),
        (false, Some(t)) => Some(Caller::Tenant(t.name.clone())),
        (false, None) => None,
    }
}

/// Resolves the request's [`Caller`] (put in its extensions for the
/// routes, see `tenant`) or answers 401. Without any token configured
/// everyone is the admin; with tenants but no admin token (refused by
/// `cellhost serve`) nobody is.
pub(crate) async fn require_token(
    State(state): State<AppState>,
    mut req: Request,
    next: Next,
) -> Response {
    if state.options.token.is_none() && state.options.tenants.is_empty() {
        req.extensions_mut().insert(Caller::Admin);
        return next.run(req).await;
    }
    if req.uri().path() == "/healthz" {
        return next.run(req).await;
    }
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer);
    let reads = matches!(*req.method(), Method::GET | Method::HEAD);
    let csrf_header = req
        .headers()
        .get(CSRF_HEADER)
        .is_some_and(|v| v.as_bytes() == b"1");
    let cookie_ok = reads || csrf_header;
    let sent_cookie = req.headers().contains_key(header::COOKIE);
    let by_bearer = bearer.and_then(|b| caller_of(&state, b));
    let by_cookie = || {
        if !cookie_ok {
            return None;
        }
        req.headers()
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|kv| kv.trim().strip_prefix(COOKIE)?.strip_prefix('='))
            .find_map(|v| caller_of(&state, v))
    };
    let by_jupyter = || jupyter_query_token(&req).and_then(|q| caller_of(&state, q));
    let caller = by_bearer.or_else(by_cookie).or_else(by_jupyter);
    if let Some(caller) = caller {
        req.extensions_mut().insert(caller);
        return next.run(req).await;
    }
    // `/?token=…` (the URL `cellhost serve` prints) sets the cookie.
    let query_token = (req.uri().path() == "/")
        .then(|| req.uri().query())
        .flatten()
        .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("token=")))
        .map(str::to_owned);
    if let Some((token, caller)) =
        query_token.and_then(|q| Some((q.clone(), caller_of(&state, &q)?)))
    {
        req.extensions_mut().insert(caller);
        let mut resp = next.run(req).await;
        let cookie = format!("{COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/");
        if let Ok(v) = HeaderValue::from_str(&cookie) {
            resp.headers_mut().insert(header::SET_COOKIE, v);
        }
        return resp;
    }
    let message = if bearer.is_some() {
        "the bearer token is wrong; use the token the server was started with (CELLHOST_TOKEN)"
    } else if sent_cookie && !cookie_ok {
        "this request changes state: send `Authorization: Bearer <token>` (CELLHOST_TOKEN); \
         the dashboard cookie counts only with the header `X-Cellhost: 1`"
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

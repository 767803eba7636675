//! Browser-attack guards (CSRF, DNS rebinding), for the default daemon
//! without a token above all: any web page the user opens can send
//! requests to 127.0.0.1.
//!
//! - `Host` must name this machine (a loopback literal, `localhost`, the
//!   bound address) or a `[server] allowed_hosts` entry, unless a token is
//!   configured: a rebound DNS name (`evil.example` → 127.0.0.1) is refused.
//! - A present `Origin` must match `Host`: a cross-site page's request is
//!   refused even when the browser sends it without a preflight.
//! - A request body must be `Content-Type: application/json` (415
//!   otherwise): HTML forms and "simple" cross-site requests cannot send
//!   that type. A POST or DELETE without a body may leave it out.
//!
//! Clients that send no `Host` (not browsers: they always do) pass the
//! Host check.

use std::net::IpAddr;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::{ApiError, AppState};

/// Host and Origin checks, before auth.
pub(crate) async fn check_origin(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Response {
    let host = req
        .headers()
        .get(header::HOST)
        .map(|v| v.to_str().unwrap_or("\u{fffd}").to_ascii_lowercase());
    if let Some(host) = &host {
        if state.options.token.is_none() && !host_allowed(host, &state.options) {
            return ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden_host",
                format!(
                    "the Host {host:?} is not this machine (requests through other names are \
                     refused, against DNS rebinding); use http://127.0.0.1:PORT or \
                     http://localhost:PORT, or list the name in [server] allowed_hosts, or set a \
                     token (CELLHOST_TOKEN)"
                ),
            )
            .into_response();
        }
    }
    if let Some(origin) = req.headers().get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("null").to_ascii_lowercase();
        let authority = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"));
        if authority.is_none() || authority != host.as_deref() {
            return ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden_origin",
                format!(
                    "a request from the web page at {origin:?} is refused (cross-site); only \
                     this server's own dashboard may call the API from a browser"
                ),
            )
            .into_response();
        }
    }
    next.run(req).await
}

/// Bodies must be JSON (after auth, so a missing token is still a 401).
pub(crate) async fn require_json(req: Request, next: Next) -> Response {
    // PUT (file uploads, any type) is never a "simple" request: a
    // cross-site page cannot send it without a preflight we never answer.
    if matches!(
        *req.method(),
        Method::GET | Method::HEAD | Method::OPTIONS | Method::PUT
    ) {
        return next.run(req).await;
    }
    let empty = axum::body::HttpBody::size_hint(req.body()).exact() == Some(0);
    match content_type(req.headers()) {
        Some(t) if t == "application/json" => next.run(req).await,
        None if empty => next.run(req).await,
        t => ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!(
                "the request body must be JSON sent with `Content-Type: application/json`, not {}",
                t.map_or("no Content-Type".to_owned(), |t| format!("{t:?}"))
            ),
        )
        .into_response(),
    }
}

/// The media type, lowercased, without parameters.
fn content_type(headers: &HeaderMap) -> Option<String> {
    let v = headers.get(header::CONTENT_TYPE)?;
    let v = v.to_str().unwrap_or("\u{fffd}");
    Some(
        v.split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase(),
    )
}

/// Whether `host` (a lowercased Host header, maybe with a port) names this
/// machine or an allowed host.
fn host_allowed(host: &str, options: &crate::ServerOptions) -> bool {
    if options
        .allowed_hosts
        .iter()
        .any(|a| a.eq_ignore_ascii_case(host) || a.eq_ignore_ascii_case(strip_port(host)))
    {
        return true;
    }
    let name = strip_port(host);
    if name == "localhost" {
        return true;
    }
    let ip = name
        .strip_prefix('[')
        .and_then(|n| n.strip_suffix(']'))
        .unwrap_or(name);
    match ip.parse::<IpAddr>() {
        Ok(ip) => ip.is_loopback() || options.bound.is_some_and(|b| b.ip() == ip),
        Err(_) => false,
    }
}

/// `name:port` → `name`; `[v6]:port` → `[v6]`.
fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host.find(']').map_or(host, |i| &host[..=i]);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(allowed: &[&str], bound: Option<&str>) -> crate::ServerOptions {
        crate::ServerOptions {
            allowed_hosts: allowed.iter().map(|s| (*s).to_owned()).collect(),
            bound: bound.map(|b| b.parse().unwrap()),
            ..crate::ServerOptions::default()
        }
    }

    #[test]
    fn loopback_names_pass_and_others_need_listing() {
        let o = opts(&[], Some("10.1.2.3:8787"));
        for h in [
            "127.0.0.1:8787",
            "127.9.9.9",
            "localhost:1",
            "localhost",
            "[::1]:8787",
            "[::1]",
            "10.1.2.3:8787",
        ] {
            assert!(host_allowed(h, &o), "{h}");
        }
        for h in [
            "evil.example",
            "evil.example:8787",
            "10.1.2.4:8787",
            "[::2]:1",
            "localhost.evil.example",
        ] {
            assert!(!host_allowed(h, &o), "{h}");
        }
        let o = opts(&["box.lan"], None);
        assert!(host_allowed("box.lan:8787", &o));
        assert!(!host_allowed("other.lan:8787", &o));
    }
}

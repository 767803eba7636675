//! A small HTTP/1 client for the daemon (hyper, plain http only: the
//! daemon listens on loopback, or behind a TLS-terminating proxy).

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;

/// Where the daemon is and how to authenticate.
pub(crate) struct Server {
    base: String,
    token: Option<String>,
    client: Client<HttpConnector, Body>,
}

/// A request body: JSON in memory, or a file streamed from disk.
pub(crate) type Body = BoxBody<Bytes, std::io::Error>;

/// A body held in memory.
pub(crate) fn full(bytes: Bytes) -> Body {
    Full::new(bytes).map_err(|never| match never {}).boxed()
}

/// Why a call failed, as one line for the terminal; `exit` is the code.
pub(crate) struct Failure {
    pub line: String,
    pub exit: u8,
}

impl Failure {
    fn new(exit: u8, line: impl Into<String>) -> Failure {
        Failure {
            line: line.into(),
            exit,
        }
    }
}

impl Server {
    /// `url` from `--server` or `CELLHOST_URL`.
    pub(crate) fn new(url: &str, token: Option<String>) -> Result<Server, Failure> {
        let base = url.trim_end_matches('/').to_owned();
        if !base.starts_with("http://") {
            return Err(Failure::new(
                2,
                format!(
                    "the server URL {url:?} must start with http:// (e.g. http://127.0.0.1:8787)"
                ),
            ));
        }
        if base.parse::<hyper::Uri>().is_err() {
            return Err(Failure::new(
                2,
                format!("{url:?} is not a valid server URL"),
            ));
        }
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Ok(Server {
            base,
            token: token.filter(|t| !t.is_empty()),
            client,
        })
    }

    /// Send a request; a non-2xx answer becomes a [`Failure`] carrying
    /// the server's message.
    pub(crate) async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
        accept: &str,
    ) -> Result<Response<Incoming>, Failure> {
        let (body, content_type) = match body {
            Some(v) => (full(Bytes::from(v.to_string())), Some("application/json")),
            None => (full(Bytes::new()), None),
        };
        self.send_body(method, path, body, content_type, accept, None)
            .await
    }

    /// Send any body (a file upload streams its body from disk).
    pub(crate) async fn send_body(
        &self,
        method: Method,
        path: &str,
        body: Body,
        content_type: Option<&str>,
        accept: &str,
        content_length: Option<u64>,
    ) -> Result<Response<Incoming>, Failure> {
        let mut req = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header("accept", accept);
        if let Some(t) = &self.token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        if let Some(t) = content_type {
            req = req.header("content-type", t);
        }
        if let Some(n) = content_length {
            req = req.header("content-length", n);
        }
        let req = req
            .body(body)
            .map_err(|e| Failure::new(2, format!("cannot build the request: {e}")))?;
        let resp = self.client.request(req).await.map_err(|e| {
            if e.is_connect() {
                Failure::new(
                    1,
                    format!(
                        "no cellhost server at {}; start one with `cellhost serve`",
                        self.base
                    ),
                )
            } else {
                Failure::new(1, format!("the request to {} failed: {e}", self.base))
            }
        })?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status();
        let body = read_all(resp).await.unwrap_or_default();
        let message = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
            .unwrap_or_else(|| String::from_utf8_lossy(&body).trim().to_owned());
        let exit = if status == StatusCode::UNAUTHORIZED || status.is_client_error() {
            2
        } else {
            1
        };
        let hint = if status == StatusCode::UNAUTHORIZED && self.token.is_none() {
            " (set CELLHOST_TOKEN)"
        } else {
            ""
        };
        Err(Failure::new(exit, format!("{message}{hint}")))
    }

    /// `send` and parse the JSON answer.
    pub(crate) async fn json<T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<T, Failure> {
        let resp = self.send(method, path, body, "application/json").await?;
        let bytes = read_all(resp).await?;
        serde_json::from_slice(&bytes)
            .map_err(|e| Failure::new(1, format!("the server's answer is not what this client expects ({e}); is it a cellhost server of the same version?")))
    }
}

pub(crate) async fn read_all(resp: Response<Incoming>) -> Result<Bytes, Failure> {
    resp.into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|e| Failure::new(1, format!("reading the server's answer failed: {e}")))
}

/// Percent-encode a path segment (session and child ids may hold any
/// printable character).
pub(crate) fn segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

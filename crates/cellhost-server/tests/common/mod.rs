//! Helpers for the server tests: a real manager with real kernels
//! (sandbox none for speed), driven through the axum router.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, Response, StatusCode};
use axum::Router;
use cellhost::config::HistoryConfig;
use cellhost::history::History;
use cellhost::registry::{KernelManager, ManagerOptions};
use cellhost::KernelOptions;
use cellhost_server::{AppState, ServerOptions};
use http_body_util::BodyExt;
use tower::ServiceExt;

/// The server's tools: `search(query)` → `[query]`, `fetch(url)` → `url`.
pub fn tools() -> cellhost::ToolSet {
    use cellhost::FnTool;
    use serde_json::json;
    let search = FnTool::new(
        "search",
        "Search.",
        json!({"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}),
        |args| async move { Ok(json!([args["query"]])) },
    );
    let fetch = FnTool::new(
        "fetch",
        "Fetch.",
        json!({"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]}),
        |args| async move { Ok(args["url"].clone()) },
    );
    cellhost::ToolSet::new()
        .with(search)
        .and_then(|s| s.with(fetch))
        .unwrap()
}

pub struct TestServer {
    pub state: AppState,
    pub router: Router,
    pub dir: tempfile::TempDir,
}

pub async fn server() -> TestServer {
    server_with(ServerOptions::default(), 8).await
}

pub async fn server_with(options: ServerOptions, max_kernels: usize) -> TestServer {
    server_in(tempfile::tempdir().unwrap(), options, max_kernels).await
}

/// A server on `dir`'s data and history (a restarted daemon finds its
/// predecessor's history there).
pub async fn server_in(
    dir: tempfile::TempDir,
    options: ServerOptions,
    max_kernels: usize,
) -> TestServer {
    server_managed(dir, options, |o| o.max_kernels(max_kernels)).await
}

/// A server whose manager options `f` adjusts.
pub async fn server_managed(
    dir: tempfile::TempDir,
    options: ServerOptions,
    f: impl FnOnce(ManagerOptions) -> ManagerOptions,
) -> TestServer {
    let kernel = KernelOptions::default()
        .runtime_dir(dir.path().join("run"))
        .interrupt_grace(Duration::from_millis(1500));
    let manager = KernelManager::start(f(ManagerOptions::new(dir.path().join("data"))
        .kernel(kernel)
        .warm_pool(0)
        .tools(tools())))
    .await;
    let history = History::open(
        &dir.path().join("data/history.sqlite"),
        &HistoryConfig::default(),
        [],
    )
    .unwrap();
    let state = AppState::new(manager, Some(Arc::new(history)), options);
    let router = cellhost_server::router(state.clone());
    TestServer { state, router, dir }
}

impl TestServer {
    pub async fn call(&self, req: Request<Body>) -> Response<Body> {
        self.router.clone().oneshot(req).await.unwrap()
    }

    /// POST JSON and read the JSON answer.
    pub async fn post(&self, path: &str, body: &str) -> (StatusCode, serde_json::Value) {
        let req = Request::post(path)
            .header("content-type", "application/json")
            .body(Body::from(body.to_owned()))
            .unwrap();
        json(self.call(req).await).await
    }

    pub async fn get(&self, path: &str) -> (StatusCode, serde_json::Value) {
        json(
            self.call(Request::get(path).body(Body::empty()).unwrap())
                .await,
        )
        .await
    }

    pub async fn delete(&self, path: &str) -> (StatusCode, serde_json::Value) {
        json(
            self.call(Request::delete(path).body(Body::empty()).unwrap())
                .await,
        )
        .await
    }

    pub async fn exec(&self, session: &str, code: &str) -> serde_json::Value {
        let body = serde_json::json!({ "code": code }).to_string();
        let (status, v) = self
            .post(&format!("/v1/sessions/{session}/execute"), &body)
            .await;
        assert_eq!(status, StatusCode::OK, "{v}");
        v
    }

    pub async fn shutdown(self) {
        self.state.manager.shutdown().await;
    }
}

pub async fn text(resp: Response<Body>) -> String {
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

pub async fn json(resp: Response<Body>) -> (StatusCode, serde_json::Value) {
    let status = resp.status();
    let body = text(resp).await;
    let v = serde_json::from_str(&body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"));
    (status, v)
}

/// Assert the error shape and return its code.
pub fn error_code(v: &serde_json::Value) -> &str {
    let msg = v["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("no error.message: {v}"));
    assert!(!msg.is_empty());
    v["error"]["code"]
        .as_str()
        .unwrap_or_else(|| panic!("no error.code: {v}"))
}

/// (event, data) pairs of an SSE body.
pub fn sse_events(body: &str) -> Vec<(String, serde_json::Value)> {
    body.split("\n\n")
        .filter_map(|block| {
            let mut name = None;
            let mut data = String::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    name = Some(v.trim().to_owned());
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.strip_prefix(' ').unwrap_or(v));
                }
            }
            Some((name?, serde_json::from_str(&data).ok()?))
        })
        .collect()
}

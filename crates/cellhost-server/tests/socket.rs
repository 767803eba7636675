//! The daemon over a real TCP socket: keep-alive clients, SSE as the cell
//! runs, 64 concurrent sessions, graceful shutdown.
mod common;

use std::net::SocketAddr;
use std::time::Duration;

use cellhost_server::{Listening, ServeError, ServerOptions};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Request, StatusCode};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use tokio::sync::oneshot;

type HttpClient = Client<HttpConnector, Full<Bytes>>;

struct Running {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    done: tokio::task::JoinHandle<()>,
    server: common::TestServer,
}

async fn start(options: ServerOptions, max_kernels: usize) -> Running {
    let server = common::server_with(options, max_kernels).await;
    let listening = Listening::bind(
        "127.0.0.1:0".parse().unwrap(),
        server.state.options.token.is_some(),
    )
    .await
    .unwrap();
    let addr = listening.addr;
    let (stop, stopped) = oneshot::channel::<()>();
    let state = server.state.clone();
    let done = tokio::spawn(cellhost_server::serve(listening, state, async {
        let _ = stopped.await;
    }));
    Running {
        addr,
        stop: Some(stop),
        done,
        server,
    }
}

impl Running {
    /// Stop the server; the test server (and its temp dir) is handed back.
    async fn shutdown(mut self) -> common::TestServer {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(Duration::from_secs(60), self.done)
            .await
            .expect("the server stops")
            .unwrap();
        self.server
    }
}

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

async fn call(
    c: &HttpClient,
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, String) {
    let mut req = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"));
    if !body.is_empty() {
        req = req.header("content-type", "application/json");
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = c
        .request(req.body(Full::new(Bytes::from(body.to_owned()))).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

/// Wait until a kernel is busy; fail (not hang) after 60 s.
async fn wait_busy(c: &HttpClient, addr: SocketAddr) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (_, k) = call(c, addr, "GET", "/v1/kernels", "", &[]).await;
        if k.contains("\"busy\"") {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no kernel became busy within 60 s: {k}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn auth_error_shapes_and_the_body_limit_hold_over_a_socket() {
    let r = start(
        ServerOptions {
            token: Some("tok-123".into()),
            max_body_bytes: 8192,
            ..ServerOptions::default()
        },
        4,
    )
    .await;
    let c = client();
    let (st, body) = call(
        &c,
        r.addr,
        "POST",
        "/v1/sessions/a/execute",
        r#"{"code":"1"}"#,
        &[],
    )
    .await;
    assert_eq!(st, StatusCode::UNAUTHORIZED, "{body}");
    assert!(body.contains("\"unauthorized\""));
    let auth = [("authorization", "Bearer tok-123")];
    let (st, body) = call(
        &c,
        r.addr,
        "POST",
        "/v1/sessions/a/execute",
        r#"{"code":"6*7"}"#,
        &auth,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{body}");
    assert!(body.contains("\"value\":\"42\""));
    let (st, body) = call(&c, r.addr, "POST", "/v1/sessions/a/execute", "{oops", &auth).await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert!(body.contains("\"bad_json\""), "{body}");
    let big = format!(r#"{{"code":"{}"}}"#, "y".repeat(20_000));
    let (st, body) = call(&c, r.addr, "POST", "/v1/sessions/a/execute", &big, &auth).await;
    assert_eq!(st, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    let (st, _) = call(&c, r.addr, "GET", "/healthz", "", &[]).await;
    assert_eq!(st, StatusCode::OK);
    r.shutdown().await;
}

#[tokio::test]
async fn sse_output_arrives_while_the_cell_is_still_running() {
    let r = start(ServerOptions::default(), 4).await;
    let c = client();
    let req = Request::post(format!("http://{}/v1/sessions/s/execute", r.addr))
        .header("accept", "text/event-stream")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(
            r#"{"code":"import time\nprint('first', flush=True)\ntime.sleep(1.5)\nprint('second')"}"#,
        )))
        .unwrap();
    let mut body = c.request(req).await.unwrap().into_body();
    let mut seen = String::new();
    while !seen.contains("event: stdout") {
        let frame = body.frame().await.expect("a frame").unwrap();
        if let Some(d) = frame.data_ref() {
            seen.push_str(&String::from_utf8_lossy(d));
        }
    }
    assert!(seen.contains(r#"{"text":"first\n"}"#), "{seen}");
    assert!(!seen.contains("event: result"), "{seen}");
    let (_, kernels) = call(&c, r.addr, "GET", "/v1/kernels", "", &[]).await;
    assert!(
        kernels.contains("\"state\":\"busy\""),
        "the cell still runs: {kernels}"
    );
    let rest = body.collect().await.unwrap().to_bytes();
    seen.push_str(&String::from_utf8_lossy(&rest));
    let events = common::sse_events(&seen);
    let (last, result) = events.last().unwrap();
    assert_eq!(last, "result");
    assert_eq!(result["stdout"], "first\nsecond\n");
    r.shutdown().await;
}

#[tokio::test]
async fn sixty_four_concurrent_sessions_run_without_errors() {
    let r = start(ServerOptions::default(), 64).await;
    let c = client();
    let mut tasks = Vec::new();
    for i in 0..64 {
        let c = c.clone();
        let addr = r.addr;
        tasks.push(tokio::spawn(async move {
            let path = format!("/v1/sessions/s{i}/execute");
            let (st, body) = call(
                &c,
                addr,
                "POST",
                &path,
                &format!(r#"{{"code":"x = {i}"}}"#),
                &[],
            )
            .await;
            assert_eq!(st, StatusCode::OK, "{body}");
            let (st, body) = call(&c, addr, "POST", &path, r#"{"code":"x * 2"}"#, &[]).await;
            assert_eq!(st, StatusCode::OK, "{body}");
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(v["status"], "success", "{v}");
            assert_eq!(
                v["value"],
                (i * 2).to_string(),
                "session s{i} kept its own state"
            );
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let (_, kernels) = call(&c, r.addr, "GET", "/v1/kernels", "", &[]).await;
    let kernels: serde_json::Value = serde_json::from_str(&kernels).unwrap();
    assert_eq!(kernels.as_array().unwrap().len(), 64);
    r.shutdown().await;
}

#[tokio::test]
async fn shutdown_lets_a_running_cell_finish_and_flushes_its_history() {
    let r = start(ServerOptions::default(), 4).await;
    let c = client();
    let addr = r.addr;
    let c2 = c.clone();
    let running = tokio::spawn(async move {
        call(
            &c2,
            addr,
            "POST",
            "/v1/sessions/g/execute",
            r#"{"code":"import time\ntime.sleep(1)\nprint('finished')"}"#,
            &[],
        )
        .await
    });
    // Wait until the cell is running, then ask the server to stop.
    wait_busy(&c, addr).await;
    let history_path = r.server.dir.path().join("data/history.sqlite");
    let manager = r.server.state.manager.clone();
    let _kept = r.shutdown().await;
    let (st, body) = running.await.unwrap();
    assert_eq!(st, StatusCode::OK, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (v["status"].as_str(), v["stdout"].as_str()),
        (Some("success"), Some("finished\n"))
    );
    assert!(manager.list().is_empty(), "kernels are gone");
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "no longer accepting"
    );
    let reopened =
        cellhost::history::History::open(&history_path, &Default::default(), []).unwrap();
    let rows = reopened.session("g", 10).unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].stdout, "finished\n");
}

#[tokio::test]
async fn a_cell_still_running_after_the_grace_is_killed_and_told() {
    let r = start(
        ServerOptions {
            shutdown_grace: Duration::from_millis(300),
            ..ServerOptions::default()
        },
        4,
    )
    .await;
    let c = client();
    let addr = r.addr;
    let c2 = c.clone();
    let running = tokio::spawn(async move {
        call(
            &c2,
            addr,
            "POST",
            "/v1/sessions/g/execute",
            r#"{"code":"import time\ntime.sleep(60)"}"#,
            &[],
        )
        .await
    });
    wait_busy(&c, addr).await;
    r.shutdown().await;
    let (st, body) = running.await.unwrap();
    assert_eq!(st, StatusCode::OK, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_ne!(v["status"], "success", "{v}");
    assert_eq!(v["kernel"]["state_lost"], true, "{v}");
}

#[tokio::test]
async fn a_killed_cell_whose_client_left_is_still_in_the_history() {
    let r = start(
        ServerOptions {
            shutdown_grace: Duration::from_millis(300),
            ..ServerOptions::default()
        },
        4,
    )
    .await;
    let c = client();
    let addr = r.addr;
    let c2 = c.clone();
    let running = tokio::spawn(async move {
        call(
            &c2,
            addr,
            "POST",
            "/v1/sessions/k/execute",
            r#"{"code":"import time\ntime.sleep(60)"}"#,
            &[],
        )
        .await
    });
    wait_busy(&c, addr).await;
    // The client hangs up: nothing keeps the server waiting for the cell.
    running.abort();
    let _ = running.await;
    let history_path = r.server.dir.path().join("data/history.sqlite");
    let _kept = r.shutdown().await;
    let reopened =
        cellhost::history::History::open(&history_path, &Default::default(), []).unwrap();
    let rows = reopened.session("k", 10).unwrap();
    assert_eq!(rows.len(), 1, "the killed cell was recorded");
}

#[tokio::test]
async fn a_non_loopback_address_needs_a_token() {
    let err = Listening::bind("0.0.0.0:0".parse().unwrap(), false)
        .await
        .unwrap_err();
    assert!(matches!(err, ServeError::NeedToken { .. }));
    assert!(err.to_string().contains("CELLHOST_TOKEN"), "{err}");
    let ok = Listening::bind("0.0.0.0:0".parse().unwrap(), true)
        .await
        .unwrap();
    assert!(!ok.addr.ip().is_loopback());
    let busy = Listening::bind(ok.addr, true).await.unwrap_err();
    assert!(busy.to_string().contains("--listen"), "{busy}");
}

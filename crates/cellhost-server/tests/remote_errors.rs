//! A remote kernel that cannot start is a 503 that names the backend's
//! real failure (a real ssh client against a port nothing listens on),
//! not advice about the server's Python and sandbox.

mod common;

use std::time::Duration;

use axum::http::StatusCode;
use cellhost::config::HistoryConfig;
use cellhost::config::{BackendConfig, SshConfig};
use cellhost::history::History;
use cellhost::registry::{KernelManager, ManagerOptions};
use cellhost::KernelOptions;
use cellhost_server::{AppState, ServerOptions};
use common::{error_code, TestServer};

/// A local port nothing listens on (bound, then released).
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[tokio::test]
async fn a_remote_spawn_failure_names_the_backends_failure() {
    let dir = tempfile::tempdir().unwrap();
    let ssh = SshConfig {
        hosts: vec!["127.0.0.1".into()],
        port: Some(closed_port()),
        connect_timeout_seconds: Some(3),
        ..SshConfig::default()
    };
    let manager = KernelManager::start(
        ManagerOptions::new(dir.path().join("data"))
            .kernel(KernelOptions::default().runtime_dir(dir.path().join("run")))
            .warm_pool(0)
            .backend("box", BackendConfig::Ssh(ssh)),
    )
    .await;
    let history = History::open(
        &dir.path().join("data/history.sqlite"),
        &HistoryConfig::default(),
        [],
    )
    .unwrap();
    let state = AppState::new(
        manager,
        Some(std::sync::Arc::new(history)),
        ServerOptions::default(),
    );
    let router = cellhost_server::router(state.clone());
    let s = TestServer { state, router, dir };
    let (st, v) = tokio::time::timeout(
        Duration::from_secs(30),
        s.post(
            "/v1/sessions/a/execute",
            r#"{"code": "1", "backend": "box"}"#,
        ),
    )
    .await
    .unwrap();
    assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE, "{v}");
    assert_eq!(error_code(&v), "kernel_unavailable");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("backend \"box\"") && message.contains("connection refused"),
        "{message}"
    );
    assert!(!message.contains("Python and sandbox"), "{message}");
    s.shutdown().await;
}

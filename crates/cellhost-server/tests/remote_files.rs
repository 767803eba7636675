//! The workspace file routes for a session on a remote backend (the real
//! sshd on 127.0.0.1 of scripts/testenv-up): the same routes, the bytes
//! over the backend's exec transport into the remote session's workspace,
//! which the remote kernel sees as its cwd.

mod common;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use cellhost::config::HistoryConfig;
use cellhost::config::{BackendConfig, SshConfig};
use cellhost::history::History;
use cellhost::registry::{KernelManager, ManagerOptions};
use cellhost::KernelOptions;
use cellhost_server::{AppState, ServerOptions};
use common::{json, TestServer};
use http_body_util::BodyExt;

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: the remote tests need the hosts of scripts/testenv-up (scripts/test starts them)")
    })
}

async fn remote_server() -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    let ssh = SshConfig {
        hosts: vec![env("CELLHOST_TEST_SSH_HOST")],
        user: Some(env("CELLHOST_TEST_SSH_USER")),
        port: Some(env("CELLHOST_TEST_SSH_PORT").parse().unwrap()),
        identity: Some(env("CELLHOST_TEST_SSH_KEY").into()),
        connect_timeout_seconds: Some(5),
        ..SshConfig::default()
    };
    let manager = KernelManager::start(
        ManagerOptions::new(dir.path().join("data"))
            .kernel(KernelOptions::default().runtime_dir(dir.path().join("run")))
            .warm_pool(0)
            .backend("box", BackendConfig::Ssh(ssh))
            .default_backend("box"),
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
    TestServer { state, router, dir }
}

#[tokio::test]
async fn the_file_routes_reach_a_remote_sessions_workspace() {
    let s = remote_server().await;
    let big: Vec<u8> = (0..3 * 1024 * 1024u32).map(|i| (i % 249) as u8).collect();
    let req = Request::put("/v1/sessions/r1/files/data/in.bin")
        .header("content-type", "application/octet-stream")
        .body(Body::from(big.clone()))
        .unwrap();
    let (st, v) = json(s.call(req).await).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    let sha = v["sha256"].as_str().unwrap().to_owned();
    let r = s
        .exec(
            "r1",
            "import hashlib, os\nopen('out.txt','w').write('from the remote kernel')\n(hashlib.sha256(open('data/in.bin','rb').read()).hexdigest(), os.getcwd())",
        )
        .await;
    let value = r["value"].as_str().unwrap().to_owned();
    assert!(
        value.contains(&sha) && value.contains("cellhost-ws-"),
        "{value}"
    );
    let resp = s
        .call(
            Request::get("/v1/sessions/r1/files/out.txt")
                .header("range", "bytes=5-7")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::PARTIAL_CONTENT);
    assert_eq!(resp.headers()["content-range"], "bytes 5-7/22");
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"the");
    let resp = s
        .call(
            Request::get("/v1/sessions/r1/files/data/in.bin")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(
        resp.headers()["content-length"],
        big.len().to_string().as_str()
    );
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(body[..] == big[..], "downloaded byte-exact");
    let (st, v) = json(
        s.call(
            Request::get("/v1/sessions/r1/files")
                .body(Body::empty())
                .unwrap(),
        )
        .await,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let names: Vec<_> = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["data", "out.txt"], "{v}");
    s.exec("r1", "import os; os.symlink('/etc/shadow', 'leak')")
        .await;
    let resp = s
        .call(
            Request::get("/v1/sessions/r1/files/leak")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    let (st, v) = json(resp).await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"]["code"], "invalid_path", "{v}");
    let resp = s
        .call(
            Request::delete("/v1/sessions/r1/files/out.txt")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let resp = s
        .call(
            Request::get("/v1/sessions/r1/files/out.txt")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    s.state.manager.shutdown().await;
}

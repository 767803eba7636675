//! A cell the daemon answered is already committed to the history: a
//! SIGKILL right after the answer cannot lose its row. Read back through a
//! fresh connection, with no flush, right after each answer.

mod common;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::{server, text};

#[tokio::test]
async fn every_answered_cell_is_committed_before_the_answer() {
    let s = server().await;
    let history = s.state.history.clone().unwrap();
    for i in 0..20 {
        let r = s.exec("d", &format!("n = {i}\nn")).await;
        assert_eq!(r["value"], i.to_string());
        let rows = history.session("d", 100).unwrap();
        assert_eq!(
            rows.len(),
            i + 1,
            "cell {i} was answered before its history row committed"
        );
        assert_eq!(rows[i].code, format!("n = {i}\nn"));
    }
    s.shutdown().await;
}

#[tokio::test]
async fn a_streamed_cell_is_committed_before_its_result_event() {
    let s = server().await;
    let history = s.state.history.clone().unwrap();
    for i in 0..5 {
        let req = Request::post("/v1/sessions/sse/execute")
            .header("content-type", "application/json")
            .header("accept", "text/event-stream")
            .body(Body::from(format!("{{\"code\": \"print({i})\"}}")))
            .unwrap();
        let resp = s.call(req).await;
        assert_eq!(resp.status(), StatusCode::OK);
        let body = text(resp).await;
        assert!(body.contains("event: result"), "{body}");
        assert_eq!(history.session("sse", 100).unwrap().len(), i + 1);
    }
    s.shutdown().await;
}

#[tokio::test]
async fn a_sessions_first_cell_after_a_daemon_restart_says_its_state_was_lost() {
    use cellhost_server::ServerOptions;
    let s = server().await;
    s.exec("r", "x = 1").await;
    let child = serde_json::json!({"code": "y = 1", "child": "w"}).to_string();
    assert_eq!(
        s.post("/v1/sessions/r/execute", &child).await.0,
        StatusCode::OK
    );
    s.state.manager.shutdown().await;
    s.state.history.as_ref().unwrap().close();
    let s = common::server_in(s.dir, ServerOptions::default(), 8).await;
    let first = s.exec("r", "x = 2").await;
    assert_eq!(first["kernel"]["state_lost"], true, "{first}");
    let note = first["kernel"]["note"].as_str().unwrap();
    assert!(note.contains("daemon restarted"), "{note}");
    let (_, c) = s.post("/v1/sessions/r/execute", &child).await;
    assert_eq!(c["kernel"]["state_lost"], true, "the child too: {c}");
    // Told once; a session the old daemon never saw is told nothing.
    assert_eq!(s.exec("r", "x").await["kernel"]["state_lost"], false);
    assert_eq!(s.exec("new", "1").await["kernel"]["state_lost"], false);
    s.shutdown().await;
}

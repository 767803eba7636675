//! `[[tools]]` webhook tools: a real kernel's cell calls a tool that the
//! daemon POSTs to a real HTTP endpoint (an axum server in this test).

use std::time::Duration;

use axum::routing::post;
use axum::{Json, Router};
use cellhost::config::Config;
use cellhost::{Cell, Kernel, KernelOptions, Status};
use serde_json::{json, Value};

async fn endpoint() -> String {
    async fn answer(Json(body): Json<Value>) -> (axum::http::StatusCode, Json<Value>) {
        let args = body["args"].clone();
        match body["tool"].as_str() {
            Some("echo") => (axum::http::StatusCode::OK, Json(json!({"result": args}))),
            Some("refuse") => (
                axum::http::StatusCode::OK,
                Json(json!({"error": format!("no {}", args["q"].as_str().unwrap_or("?"))})),
            ),
            Some("slow") => {
                tokio::time::sleep(Duration::from_secs(5)).await;
                (axum::http::StatusCode::OK, Json(json!({"result": 1})))
            }
            _ => (
                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                Json(json!({"oops": true})),
            ),
        }
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, Router::new().route("/t", post(answer)))
            .await
            .unwrap()
    });
    format!("http://{addr}/t")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cells_call_webhook_tools_and_failures_say_why() {
    let url = endpoint().await;
    let config = Config::parse(
        &format!(
            r#"
[[tools]]
name = "echo"
description = "Echo the arguments."
url = "{url}"
parameters = {{ type = "object", properties = {{ q = {{ type = "string" }} }}, required = ["q"] }}

[[tools]]
name = "refuse"
url = "{url}"

[[tools]]
name = "broken"
url = "{url}"

[[tools]]
name = "slow"
url = "{url}"
timeout = 0.3

[[tools]]
name = "nowhere"
url = "http://127.0.0.1:9/t"
"#
        ),
        std::path::Path::new("cellhost.toml"),
    )
    .unwrap();
    let set = cellhost_server::webhook::toolset(&config.tools).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kernel = Kernel::spawn(KernelOptions::default().runtime_dir(dir.path()))
        .await
        .unwrap();
    let code = r#"
import tools
print(tools.echo(q="hi"))
for name in ("refuse", "broken", "slow", "nowhere"):
    try:
        tools.call(name, q="x")
    except tools.ToolError as e:
        print(name, "->", str(e)[:120])
"#;
    let r = kernel.execute(Cell::new(code).tools(set)).await.unwrap();
    assert_eq!(r.status, Status::Success, "{r:?}");
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines[0], "{'q': 'hi'}");
    assert_eq!(lines[1], "refuse -> no x");
    assert!(
        lines[2].starts_with("broken -> tool \"broken\": its endpoint answered 500"),
        "{lines:?}"
    );
    assert!(
        lines[3].starts_with("slow -> tool \"slow\": its endpoint")
            && lines[3].contains("did not answer within 0.3 s"),
        "{lines:?}"
    );
    assert!(
        lines[4].starts_with(
            "nowhere -> tool \"nowhere\": its endpoint http://127.0.0.1:9/t is unreachable"
        ),
        "{lines:?}"
    );
    assert_eq!(r.tool_calls_made, 5);
    kernel.shutdown().await;
}

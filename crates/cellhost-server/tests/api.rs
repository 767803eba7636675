//! The HTTP API through the axum router (`oneshot`), with real kernels.
mod common;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use cellhost_server::ServerOptions;
use common::*;

#[tokio::test]
async fn a_cell_returns_the_result_contract_and_state_persists_per_session() {
    let s = server().await;
    s.exec("a", "x = 41").await;
    let r = s.exec("a", "print('hi'); x + 1").await;
    assert_eq!(r["status"], "success");
    assert_eq!(r["stdout"], "hi\n");
    assert_eq!(r["value"], "42");
    assert_eq!(r["kernel"]["execution_count"], 2);
    assert_eq!(r["kernel"]["reused"], true);
    let other = s.exec("b", "'x' in dir()").await;
    assert_eq!(other["value"], "False", "sessions do not share state");
    let failed = s.exec("a", "1/0").await;
    assert_eq!(failed["status"], "error");
    assert_eq!(failed["error"], "ZeroDivisionError: division by zero");
    s.shutdown().await;
}

#[tokio::test]
async fn reset_and_timeout_fields_are_honoured() {
    let s = server().await;
    s.exec("a", "x = 1").await;
    let (st, r) = s
        .post(
            "/v1/sessions/a/execute",
            r#"{"code": "'x' in dir()", "reset": true}"#,
        )
        .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(r["value"], "False");
    assert_eq!(r["kernel"]["state_reset"], true);
    let (_, r) = s
        .post(
            "/v1/sessions/a/execute",
            r#"{"code": "import time; time.sleep(30)", "timeout": 0.5}"#,
        )
        .await;
    assert_eq!(r["status"], "timeout", "{r}");
    s.shutdown().await;
}

#[tokio::test]
async fn bad_json_a_missing_code_and_bad_fields_are_400s_with_the_error_shape() {
    let s = server().await;
    for (body, code) in [
        ("{not json", "bad_json"),
        ("", "bad_json"),
        (r#"{"timeout": 3}"#, "invalid_request"),
        (r#"{"code": 5}"#, "invalid_request"),
        (r#"{"code": "1", "colour": "red"}"#, "invalid_request"),
        (r#"{"code": "1", "timeout": -1}"#, "invalid_request"),
        (r#"{"code": "1", "tools": ["not a name"]}"#, "unknown_tool"),
        (
            r#"{"code": "1", "tools": ["search", "web"]}"#,
            "unknown_tool",
        ),
        (r#"{"code": "1", "backend": "nowhere"}"#, "unknown_backend"),
        (r#"{"code": "1", "max_tool_calls": -2}"#, "invalid_request"),
        (r#"{"code": "1", "child": "a::b"}"#, "invalid_session"),
    ] {
        let (st, v) = s.post("/v1/sessions/a/execute", body).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{body}: {v}");
        assert_eq!(error_code(&v), code, "{body}: {v}");
        // With SSE too: a plain 4xx, not a 200 stream with an error event.
        if !body.is_empty() {
            let req = Request::post("/v1/sessions/a/execute")
                .header("accept", "text/event-stream")
                .header("content-type", "application/json")
                .body(Body::from(body))
                .unwrap();
            let (st, v) = json(s.call(req).await).await;
            assert_eq!(
                (st, error_code(&v)),
                (StatusCode::BAD_REQUEST, code),
                "SSE {body}"
            );
        }
    }
    let (_, v) = s.post("/v1/sessions/a/execute", r#"{"timeout": 3}"#).await;
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("missing field `code`"),
        "{v}"
    );
    s.shutdown().await;
}

#[tokio::test]
async fn an_oversize_body_is_a_413_and_the_server_keeps_serving() {
    let s = server_with(
        ServerOptions {
            max_body_bytes: 4096,
            ..ServerOptions::default()
        },
        4,
    )
    .await;
    let big = serde_json::json!({ "code": "x".repeat(10_000) }).to_string();
    let (st, v) = s.post("/v1/sessions/a/execute", &big).await;
    assert_eq!(st, StatusCode::PAYLOAD_TOO_LARGE, "{v}");
    assert_eq!(error_code(&v), "body_too_large");
    assert!(v["error"]["message"].as_str().unwrap().contains("4096"));
    assert_eq!(s.exec("a", "1 + 1").await["value"], "2");
    s.shutdown().await;
}

#[tokio::test]
async fn unknown_sessions_routes_and_methods_are_json_4xx() {
    let s = server().await;
    for (st, v) in [
        s.post("/v1/sessions/nobody/interrupt", "").await,
        s.delete("/v1/sessions/nobody").await,
        s.delete("/v1/sessions/nobody/children/c").await,
        s.get("/v1/sessions/nobody/history").await,
    ] {
        assert_eq!(st, StatusCode::NOT_FOUND, "{v}");
        assert_eq!(error_code(&v), "unknown_session");
    }
    let (st, v) = s.get("/v2/nothing").await;
    assert_eq!((st, error_code(&v)), (StatusCode::NOT_FOUND, "not_found"));
    let (st, v) = s.get("/v1/sessions/a/execute").await;
    assert_eq!(
        (st, error_code(&v)),
        (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed")
    );
    let (st, v) = s.get("/v1/sessions/a/history?limit=lots").await;
    assert_eq!((st, error_code(&v)), (StatusCode::BAD_REQUEST, "bad_query"));
    s.shutdown().await;
}

#[tokio::test]
async fn with_a_token_every_route_but_healthz_needs_the_bearer() {
    let s = server_with(
        ServerOptions {
            token: Some("s3cret-token".into()),
            ..ServerOptions::default()
        },
        4,
    )
    .await;
    for path in [
        "/v1/kernels",
        "/metrics",
        "/openapi.json",
        "/",
        "/v1/history",
    ] {
        let resp = s
            .call(Request::get(path).body(Body::empty()).unwrap())
            .await;
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "{path}");
        assert!(resp.headers().contains_key(header::WWW_AUTHENTICATE));
        let (_, v) = json(resp).await;
        assert_eq!(error_code(&v), "unauthorized");
    }
    let wrong = Request::get("/v1/kernels")
        .header("authorization", "Bearer nope")
        .body(Body::empty())
        .unwrap();
    assert_eq!(s.call(wrong).await.status(), StatusCode::UNAUTHORIZED);
    let (st, _) = s.get("/healthz").await;
    assert_eq!(st, StatusCode::OK);
    let right = Request::post("/v1/sessions/a/execute")
        .header("authorization", "bearer s3cret-token")
        .header("content-type", "application/json")
        .body(Body::from(r#"{"code": "2 * 21"}"#))
        .unwrap();
    let (st, v) = json(s.call(right).await).await;
    assert_eq!((st, v["value"].as_str()), (StatusCode::OK, Some("42")));
    // The dashboard URL with ?token= sets a cookie the page's calls carry.
    let page = s
        .call(
            Request::get("/?token=s3cret-token")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(page.status(), StatusCode::OK);
    let cookie = page.headers()[header::SET_COOKIE]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"));
    let pair = cookie.split(';').next().unwrap().to_owned();
    let with_cookie = Request::get("/v1/kernels")
        .header("cookie", pair.clone())
        .body(Body::empty())
        .unwrap();
    assert_eq!(s.call(with_cookie).await.status(), StatusCode::OK);
    // The cookie alone does not authorize a change (CSRF); with the
    // dashboard's X-Cellhost header it does.
    let change = |extra: Option<&str>| {
        let mut r = Request::delete("/v1/sessions/a").header("cookie", pair.clone());
        if let Some(v) = extra {
            r = r.header("x-cellhost", v);
        }
        r.body(Body::empty()).unwrap()
    };
    let (st, v) = json(s.call(change(None)).await).await;
    assert_eq!(
        (st, error_code(&v)),
        (StatusCode::UNAUTHORIZED, "unauthorized")
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("X-Cellhost"),
        "{v}"
    );
    assert_eq!(s.call(change(Some("1"))).await.status(), StatusCode::OK);
    // The token is taken as sent: padding is not the token.
    let padded = Request::get("/v1/kernels")
        .header("authorization", "Bearer  s3cret-token")
        .body(Body::empty())
        .unwrap();
    assert_eq!(s.call(padded).await.status(), StatusCode::UNAUTHORIZED);
    s.shutdown().await;
}

#[tokio::test]
async fn bodies_must_be_json_and_browsers_must_come_from_this_host() {
    let s = server().await;
    let post = |ct: Option<&str>, body: &'static str| {
        let mut r = Request::post("/v1/sessions/a/execute");
        if let Some(ct) = ct {
            r = r.header("content-type", ct);
        }
        r.body(Body::from(body)).unwrap()
    };
    for ct in [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
    ] {
        let (st, v) = json(s.call(post(ct, r#"{"code": "1"}"#)).await).await;
        assert_eq!(
            (st, error_code(&v)),
            (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type"),
            "{ct:?}"
        );
    }
    let (st, _) = json(
        s.call(post(
            Some("application/json; charset=utf-8"),
            r#"{"code": "1"}"#,
        ))
        .await,
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    // No body: no Content-Type needed.
    let (st, v) = json(
        s.call(
            Request::post("/v1/sessions/a/interrupt")
                .body(Body::empty())
                .unwrap(),
        )
        .await,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    // DNS rebinding: a Host that is not this machine is refused.
    let with = |host: &str, origin: Option<&str>| {
        let mut r = Request::get("/v1/kernels").header("host", host);
        if let Some(o) = origin {
            r = r.header("origin", o);
        }
        r.body(Body::empty()).unwrap()
    };
    for host in [
        "127.0.0.1:8787",
        "localhost:8787",
        "[::1]:8787",
        "127.0.0.2",
    ] {
        assert_eq!(
            s.call(with(host, None)).await.status(),
            StatusCode::OK,
            "{host}"
        );
    }
    let (st, v) = json(s.call(with("evil.example:8787", None)).await).await;
    assert_eq!(
        (st, error_code(&v)),
        (StatusCode::FORBIDDEN, "forbidden_host")
    );
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("allowed_hosts"));
    // A cross-site Origin is refused; the same origin passes.
    let (st, v) = json(
        s.call(with("127.0.0.1:8787", Some("http://evil.example")))
            .await,
    )
    .await;
    assert_eq!(
        (st, error_code(&v)),
        (StatusCode::FORBIDDEN, "forbidden_origin")
    );
    let (st, _) = json(s.call(with("127.0.0.1:8787", Some("null"))).await).await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    let (st, _) = json(
        s.call(with("127.0.0.1:8787", Some("http://127.0.0.1:8787")))
            .await,
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    s.shutdown().await;
    // allowed_hosts lists a name; a token lifts the Host rule.
    for options in [
        ServerOptions {
            allowed_hosts: vec!["box.lan".into()],
            ..ServerOptions::default()
        },
        ServerOptions {
            token: Some("t".into()),
            ..ServerOptions::default()
        },
    ] {
        let s = server_with(options.clone(), 1).await;
        let req = Request::get("/healthz")
            .header("host", "box.lan:8787")
            .body(Body::empty())
            .unwrap();
        assert_eq!(s.call(req).await.status(), StatusCode::OK, "{options:?}");
        s.shutdown().await;
    }
}

#[tokio::test]
async fn sse_sends_output_events_then_the_result() {
    let s = server().await;
    let req = Request::post("/v1/sessions/a/execute")
        .header("accept", "text/event-stream")
        .header("content-type", "application/json")
        .body(Body::from(
            r#"{"code": "import sys\nprint('one', flush=True)\nprint('two', file=sys.stderr)\ndisplay('shown')\n3"}"#,
        ))
        .unwrap();
    let resp = s.call(req).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(resp.headers()[header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let events = sse_events(&text(resp).await);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.last(), Some(&"result"), "{names:?}");
    assert!(
        names.contains(&"stdout") && names.contains(&"stderr") && names.contains(&"display"),
        "{names:?}"
    );
    let out: String = events
        .iter()
        .filter(|(n, _)| n == "stdout")
        .map(|(_, v)| v["text"].as_str().unwrap())
        .collect();
    assert_eq!(out, "one\n");
    let (_, result) = events.last().unwrap();
    assert_eq!(result["value"], "3");
    assert_eq!(result["stdout"], "one\n");
    s.shutdown().await;
}

/// Displays and prints travel on separate pipes from the kernel; the
/// stream still has them in the order the cell made them.
#[tokio::test]
async fn sse_has_prints_and_displays_in_the_order_the_cell_made_them() {
    let s = server().await;
    let code = "for i in range(40):\n    print('o%d' % i, 'x' * 300)\n    display('d%d' % i)";
    let body = serde_json::json!({ "code": code }).to_string();
    let want: Vec<String> = (0..40)
        .flat_map(|i| [format!("o{i}"), format!("d{i}")])
        .collect();
    for _ in 0..3 {
        let req = Request::post("/v1/sessions/a/execute")
            .header("accept", "text/event-stream")
            .header("content-type", "application/json")
            .body(Body::from(body.clone()))
            .unwrap();
        let events = sse_events(&text(s.call(req).await).await);
        let mut got = Vec::new();
        for (name, v) in &events {
            match name.as_str() {
                "stdout" => got.extend(
                    v["text"]
                        .as_str()
                        .unwrap()
                        .lines()
                        .map(|l| l.split(' ').next().unwrap().to_owned()),
                ),
                "display" => {
                    let v = v.to_string();
                    let at = v.find("'d").expect("a display of 'dN'") + 1;
                    let end = v[at + 1..].find('\'').unwrap() + at + 1;
                    got.push(v[at..end].to_owned());
                }
                _ => {}
            }
        }
        assert_eq!(got, want);
    }
    s.shutdown().await;
}

#[tokio::test]
async fn sse_reports_a_request_error_as_json_before_streaming() {
    let s = server().await;
    let req = Request::post("/v1/sessions/a/execute")
        .header("accept", "text/event-stream")
        .header("content-type", "application/json")
        .body(Body::from("{"))
        .unwrap();
    let (st, v) = json(s.call(req).await).await;
    assert_eq!((st, error_code(&v)), (StatusCode::BAD_REQUEST, "bad_json"));
    s.shutdown().await;
}

#[tokio::test]
async fn children_get_their_own_kernels_and_can_be_disposed_alone() {
    let s = server().await;
    s.exec("p", "x = 'parent'").await;
    let (_, r) = s
        .post(
            "/v1/sessions/p/execute",
            r#"{"code": "x = 'child'; x", "child": "c1"}"#,
        )
        .await;
    assert_eq!(r["value"], "'child'");
    assert_eq!(s.exec("p", "x").await["value"], "'parent'");
    let (_, kernels) = s.get("/v1/kernels").await;
    let owners: Vec<&str> = kernels
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["owner"].as_str().unwrap())
        .collect();
    assert!(
        owners.contains(&"p") && owners.contains(&"p::child::c1"),
        "{owners:?}"
    );
    let (st, v) = s.delete("/v1/sessions/p/children/c1").await;
    assert_eq!((st, v["count"].as_u64()), (StatusCode::OK, Some(1)));
    assert_eq!(s.exec("p", "x").await["value"], "'parent'");
    let (st, v) = s.delete("/v1/sessions/p").await;
    assert_eq!((st, v["count"].as_u64()), (StatusCode::OK, Some(1)));
    let r = s.exec("p", "'x' in dir()").await;
    assert_eq!(r["value"], "False");
    assert!(
        r["kernel"]["note"].as_str().is_some(),
        "the next cell is told: {r}"
    );
    s.shutdown().await;
}

#[tokio::test]
async fn tools_are_the_servers_by_default_and_a_tool_set_picks_its_own_kernel() {
    let s = server().await;
    let r = s
        .exec(
            "t",
            "x = 1\nimport tools\nsorted(tools.names), tools.search(query='q')",
        )
        .await;
    assert_eq!(r["value"], "(['fetch', 'search'], ['q'])", "{r}");
    assert_eq!(r["tool_calls_made"], 1);
    let code = "import tools\nout = [tools.fetch(url='u')]\ntry:\n    tools.fetch(url='v')\nexcept tools.ToolError as e:\n    out.append(str(e)[:21])\n'x' in dir(), out";
    let body = serde_json::json!({"code": code, "tools": ["fetch"], "max_tool_calls": 1});
    let (st, r) = s.post("/v1/sessions/t/execute", &body.to_string()).await;
    assert_eq!(st, StatusCode::OK, "{r}");
    assert_eq!(
        r["value"], "(False, ['u', 'tool budget exhausted'])",
        "another tool set, another kernel, and the request's budget: {r}"
    );
    assert_eq!(r["tool_calls_made"], 1);
    let (_, kernels) = s.get("/v1/kernels").await;
    let keys: Vec<&str> = kernels
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert!(
        keys.iter()
            .any(|k| k.contains("tools=fetch") && !k.contains("search")),
        "{keys:?}"
    );
    let metrics = text(
        s.call(Request::get("/metrics").body(Body::empty()).unwrap())
            .await,
    )
    .await;
    assert!(metrics.contains("cellhost_tool_calls_total 2"), "{metrics}");
    s.shutdown().await;
}

#[tokio::test]
async fn history_lists_a_sessions_cells_oldest_first() {
    let s = server().await;
    s.exec("h", "a = 1").await;
    s.exec("h", "print(a)").await;
    s.exec("other", "0").await;
    s.state.history.as_ref().unwrap().flush();
    let (st, v) = s.get("/v1/sessions/h/history").await;
    assert_eq!(st, StatusCode::OK);
    let rows = v.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["code"], "a = 1");
    assert_eq!(rows[1]["stdout"], "1\n");
    assert_eq!(rows[1]["execution_count"], 2);
    assert!(rows[1]["kernel_id"].as_str().unwrap().starts_with("k-"));
    let (_, v) = s.get("/v1/sessions/h/history?limit=1").await;
    assert_eq!(v.as_array().unwrap().len(), 1);
    assert_eq!(v[0]["code"], "print(a)");
    let (_, all) = s.get("/v1/history").await;
    assert_eq!(all.as_array().unwrap().len(), 3);
    s.shutdown().await;
}

#[tokio::test]
async fn metrics_count_cells_by_status_and_kernels() {
    let s = server().await;
    s.exec("m", "1").await;
    s.exec("m", "1/0").await;
    let resp = s
        .call(Request::get("/metrics").body(Body::empty()).unwrap())
        .await;
    assert!(resp.headers()[header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    let body = text(resp).await;
    for line in [
        "cellhost_kernels_live 1",
        "cellhost_cells_total{status=\"success\"} 1",
        "cellhost_cells_total{status=\"error\"} 1",
        "cellhost_cell_duration_seconds_count 2",
        "cellhost_cell_duration_seconds_bucket{le=\"+Inf\"} 2",
        "cellhost_kernel_spawns_total 1",
        "cellhost_tool_calls_total 0",
        "# TYPE cellhost_cell_duration_seconds histogram",
    ] {
        assert!(
            body.lines().any(|l| l == line),
            "missing {line:?} in\n{body}"
        );
    }
    s.shutdown().await;
}

#[tokio::test]
async fn the_openapi_document_lists_every_route() {
    let s = server().await;
    let (st, v) = s.get("/openapi.json").await;
    assert_eq!(st, StatusCode::OK);
    assert!(v["openapi"].as_str().unwrap().starts_with("3."));
    let paths = v["paths"].as_object().unwrap();
    for p in [
        "/v1/sessions/{session}/execute",
        "/v1/sessions/{session}/interrupt",
        "/v1/sessions/{session}",
        "/v1/sessions/{session}/children/{child}",
        "/v1/sessions/{session}/history",
        "/v1/history",
        "/v1/kernels",
        "/healthz",
    ] {
        assert!(paths.contains_key(p), "{p} missing");
    }
    assert!(
        v["components"]["schemas"]["ExecuteRequest"]["properties"]["max_tool_calls"].is_object()
    );
    s.shutdown().await;
}

#[tokio::test]
async fn the_dashboard_and_its_assets_are_served_from_the_binary() {
    let s = server().await;
    let page = text(s.call(Request::get("/").body(Body::empty()).unwrap()).await).await;
    assert!(page.contains("/assets/app.js") && page.contains("Live kernels"));
    assert!(
        !page.contains("http://") && !page.contains("https://"),
        "no CDN"
    );
    let js = s
        .call(Request::get("/assets/app.js").body(Body::empty()).unwrap())
        .await;
    assert_eq!(js.status(), StatusCode::OK);
    assert!(text(js).await.contains("/v1/kernels"));
    let (st, _) = s.get("/assets/nope.js").await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    s.shutdown().await;
}

#[tokio::test]
async fn sse_after_shutdown_is_a_503_not_a_stream() {
    let s = server().await;
    s.state.manager.shutdown().await;
    let req = Request::post("/v1/sessions/a/execute")
        .header("accept", "text/event-stream")
        .header("content-type", "application/json")
        .body(Body::from(r#"{"code": "1"}"#))
        .unwrap();
    let (st, v) = json(s.call(req).await).await;
    assert_eq!(
        (st, error_code(&v)),
        (StatusCode::SERVICE_UNAVAILABLE, "shutting_down")
    );
}

#[tokio::test]
async fn sse_ends_with_an_error_when_the_kernel_cannot_start() {
    let s = server().await;
    s.exec("a", "1").await;
    // The staging root becomes a file: the reset's respawn fails.
    let root = s.dir.path().join("run/kernels");
    std::fs::remove_dir_all(&root).unwrap();
    std::fs::write(&root, "not a dir").unwrap();
    let req = Request::post("/v1/sessions/a/execute")
        .header("accept", "text/event-stream")
        .header("content-type", "application/json")
        .body(Body::from(r#"{"code": "2", "reset": true}"#))
        .unwrap();
    let body = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        text(s.call(req).await).await
    })
    .await
    .expect("the stream ends");
    let events = sse_events(&body);
    let (name, v) = events.last().expect("an event");
    assert_eq!(name, "error", "{body}");
    assert_eq!(error_code(v), "kernel_unavailable");
    s.shutdown().await;
}

#[tokio::test]
async fn the_fork_route_makes_independent_sessions_and_children_and_refuses_with_reasons() {
    let s = server().await; // snapshots off: a fork is asked for, so it runs
    s.exec("a", "x = 1\nopen('f.txt', 'w').write('from a')")
        .await;
    let (st, v) = s
        .post(
            "/v1/sessions/a/fork",
            r#"{"into": ["b", {"session": "a", "child": "w"}]}"#,
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["from"], "a");
    assert_eq!(v["into"][0]["session"], "b");
    // A `none` kernel forks its process.
    assert_eq!(v["into"][0]["path"], "process", "{v}");
    assert_eq!(v["into"][0]["workspace_bytes"], 6);
    assert!(v["into"][0]["kernel_id"].is_string(), "{v}");
    assert!(
        v["into"][0]
            .get("fallback_reason")
            .is_none_or(|r| r.is_null()),
        "{v}"
    );
    assert_eq!(v["into"][1]["session"], "a");
    assert_eq!(v["into"][1]["child"], "w");
    let r = s.exec("b", "x += 1\n(x, open('f.txt').read())").await;
    assert_eq!(r["value"], "(2, 'from a')", "{r}");
    assert_eq!(r["kernel"]["forked_from"], "a", "{r}");
    assert_eq!(r["kernel"]["restored"]["from"], "fork", "{r}");
    assert_eq!(r["kernel"]["state_lost"], false, "{r}");
    let body = serde_json::json!({"code": "x", "child": "w"}).to_string();
    let (st, r) = s.post("/v1/sessions/a/execute", &body).await;
    assert_eq!(
        (st, &r["value"]),
        (StatusCode::OK, &serde_json::json!("1")),
        "{r}"
    );
    assert_eq!(r["kernel"]["forked_from"], "a", "{r}");
    assert_eq!(
        s.exec("a", "x").await["value"],
        "1",
        "the source is untouched"
    );
    // The child forks too.
    let (st, v) = s
        .post("/v1/sessions/a/children/w/fork", r#"{"into": "c"}"#)
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(s.exec("c", "x").await["value"], "1");

    for (path, body, want) in [
        (
            "/v1/sessions/a/fork",
            r#"{"into": "b"}"#,
            (StatusCode::CONFLICT, "fork_target_in_use"),
        ),
        (
            "/v1/sessions/a/fork",
            r#"{"into": []}"#,
            (StatusCode::BAD_REQUEST, "invalid_fork"),
        ),
        (
            "/v1/sessions/a/fork",
            r#"{"into": ["d", "d"]}"#,
            (StatusCode::BAD_REQUEST, "invalid_fork"),
        ),
        (
            "/v1/sessions/a/fork",
            r#"{"onto": "d"}"#,
            (StatusCode::BAD_REQUEST, "bad_request"),
        ),
        (
            "/v1/sessions/nobody/fork",
            r#"{"into": "d"}"#,
            (StatusCode::NOT_FOUND, "unknown_session"),
        ),
        (
            "/v1/sessions/a/children/none/fork",
            r#"{"into": "d"}"#,
            (StatusCode::NOT_FOUND, "unknown_session"),
        ),
    ] {
        let (st, v) = s.post(path, body).await;
        assert_eq!((st, error_code(&v)), want, "{path} {body}: {v}");
    }
    s.shutdown().await;
}

#[tokio::test]
async fn the_snapshot_route_reports_what_it_kept_and_refuses_with_reasons() {
    let s = server().await; // snapshots off (the library's default)
    s.exec("a", "x = 1").await;
    let (st, v) = s.post("/v1/sessions/a/snapshot", "").await;
    assert_eq!(
        (st, error_code(&v)),
        (StatusCode::CONFLICT, "snapshots_off"),
        "{v}"
    );
    let (st, v) = s.post("/v1/sessions/nobody/snapshot", "").await;
    assert_eq!(
        (st, error_code(&v)),
        (StatusCode::NOT_FOUND, "unknown_session")
    );
    s.shutdown().await;

    let dir = tempfile::tempdir().unwrap();
    let s = server_managed(dir, ServerOptions::default(), |o| {
        o.snapshots(Some(1 << 20)).max_kernels(1)
    })
    .await;
    s.exec("a", "import socket\nx = 1\nsock = socket.socket()")
        .await;
    let (st, v) = s.post("/v1/sessions/a/snapshot", "").await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["names"], 2, "x and the socket module: {v}");
    assert_eq!(v["skipped"][0]["name"], "sock");
    assert_eq!(v["skipped"][0]["type"], "socket.socket");
    assert!(v["bytes"].as_u64().unwrap() > 0 && v["seconds"].is_number());
    s.exec("a", "big = bytes(2 << 20)").await;
    let (st, v) = s.post("/v1/sessions/a/snapshot", "").await;
    assert_eq!(
        (st, error_code(&v)),
        (StatusCode::PAYLOAD_TOO_LARGE, "snapshot_too_large"),
        "{v}"
    );
    // Evicted and back: the result says it was restored (the state over
    // the cap was not: its loss is told as before).
    s.exec("a", "del big").await;
    s.exec("b", "1").await;
    let r = s.exec("a", "x").await;
    assert_eq!(r["value"], "1", "{r}");
    assert_eq!(r["kernel"]["restored"]["from"], "evicted", "{r}");
    s.shutdown().await;
}

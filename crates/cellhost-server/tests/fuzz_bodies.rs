//! Property tests of request bodies against the real router: whatever
//! bytes or JSON a client sends to the execute route, the answer is a 4xx
//! with the JSON error shape, never a 5xx or a panic; `/mcp` never answers
//! garbage with a 5xx either. `PROPTEST_CASES` raises the case count
//! (`scripts/reliability` runs 20,000).

mod common;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use proptest::prelude::*;
use serde_json::Value;

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(128)
}

/// Arbitrary JSON, a few levels deep.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        ".{0,40}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::btree_map(".{0,12}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// An execute body that is never a valid request: a non-object, an
/// object without a string `code`, or one with an unknown key.
fn invalid_body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..512),
        json_value().prop_map(|v| v.to_string().into_bytes()),
        (json_value(), ".{1,12}").prop_map(|(v, k)| {
            let mut m = serde_json::Map::new();
            m.insert("code".into(), Value::from(1));
            m.insert(format!("x{k}"), v);
            Value::Object(m).to_string().into_bytes()
        }),
        json_value().prop_filter_map("a non-string code", |v| {
            (!v.is_string()).then(|| serde_json::json!({ "code": v }).to_string().into_bytes())
        }),
    ]
}

fn check_error(status: StatusCode, body: &[u8]) -> Result<(), TestCaseError> {
    prop_assert!(
        status.is_client_error(),
        "status {status}: {}",
        String::from_utf8_lossy(body)
    );
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| TestCaseError::fail(format!("not JSON ({e}): {body:?}")))?;
    prop_assert!(v["error"]["code"].is_string(), "{v}");
    prop_assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{v}"
    );
    Ok(())
}

async fn send(
    s: &common::TestServer,
    path: &str,
    content_type: &str,
    body: Vec<u8>,
) -> (StatusCode, Vec<u8>) {
    use http_body_util::BodyExt;
    let req = Request::post(path)
        .header("content-type", content_type)
        .header("accept", "application/json, text/event-stream")
        .body(Body::from(body))
        .unwrap();
    let resp = s.call(req).await;
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, bytes.to_vec())
}

#[test]
fn execute_answers_any_invalid_body_with_a_json_4xx() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt.block_on(common::server());
    let config = ProptestConfig::with_cases(cases());
    proptest!(config, |(body in invalid_body(), session in "[^/?#]{1,24}")| {
        let path = format!(
            "/v1/sessions/{}/execute",
            session.bytes().map(|b| format!("%{b:02X}")).collect::<String>()
        );
        let (status, bytes) = rt.block_on(send(&server, &path, "application/json", body));
        check_error(status, &bytes)?;
    });
    rt.block_on(server.shutdown());
}

#[test]
fn any_content_type_or_body_on_any_route_is_never_a_5xx() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt.block_on(common::server());
    let config = ProptestConfig::with_cases(cases());
    let routes = prop_oneof![
        Just("/v1/sessions/s/interrupt"),
        Just("/v1/sessions/s/execute"),
        Just("/v1/kernels"),
        Just("/v1/nowhere"),
    ];
    proptest!(config, |(
        route in routes,
        ct in prop_oneof![
            Just("application/json".to_owned()),
            Just("text/plain".to_owned()),
            ".{0,30}",
        ],
        body in invalid_body(),
    )| {
        let ct = if axum::http::HeaderValue::from_str(&ct).is_ok() { ct } else { "x/y".to_owned() };
        let (status, bytes) = rt.block_on(send(&server, route, &ct, body));
        prop_assert!(
            !status.is_server_error(),
            "{route} {ct:?}: {status} {}",
            String::from_utf8_lossy(&bytes)
        );
        if !status.is_success() {
            check_error(status, &bytes)?;
        }
    });
    rt.block_on(server.shutdown());
}

#[test]
fn mcp_never_answers_garbage_with_a_5xx() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt.block_on(common::server());
    let config = ProptestConfig::with_cases(cases());
    proptest!(config, |(body in invalid_body())| {
        let (status, bytes) = rt.block_on(send(&server, "/mcp", "application/json", body));
        prop_assert!(
            !status.is_server_error(),
            "/mcp: {status} {}",
            String::from_utf8_lossy(&bytes)
        );
    });
    rt.block_on(server.shutdown());
}

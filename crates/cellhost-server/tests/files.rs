//! The workspace file routes through the router, on a real manager with
//! real kernels: upload, download, ranges, listing, delete, the error
//! codes and limits, children apart, files gone with the session.

mod common;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use cellhost_server::ServerOptions;
use common::{error_code, json, server, server_with};
use http_body_util::BodyExt;

async fn put(
    s: &common::TestServer,
    path: &str,
    bytes: Vec<u8>,
) -> (StatusCode, serde_json::Value) {
    let req = Request::put(path)
        .header("content-type", "application/octet-stream")
        .body(Body::from(bytes))
        .unwrap();
    json(s.call(req).await).await
}

async fn get_raw(
    s: &common::TestServer,
    path: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, axum::http::HeaderMap, Vec<u8>) {
    let mut req = Request::get(path);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = s.call(req.body(Body::empty()).unwrap()).await;
    let (parts, body) = resp.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes().to_vec();
    (parts.status, parts.headers, bytes)
}

#[tokio::test]
async fn a_file_goes_in_and_out_byte_exact_with_ranges_listing_and_delete() {
    let s = server().await;
    // Over the 10 MiB /v1 body limit: file routes have their own.
    let big: Vec<u8> = (0..12 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let (st, v) = put(&s, "/v1/sessions/s1/files/data/big.bin", big.clone()).await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    assert_eq!(v["size"], big.len());
    assert_eq!(v["path"], "data/big.bin");
    let sha = v["sha256"].as_str().unwrap().to_owned();
    let (st, _) = put(&s, "/v1/sessions/s1/files/data/big.bin", big.clone()).await;
    assert_eq!(st, StatusCode::OK, "replaced");
    let r = s
        .exec(
            "s1",
            "import hashlib\nhashlib.sha256(open('data/big.bin','rb').read()).hexdigest()",
        )
        .await;
    assert_eq!(r["value"], format!("'{sha}'"));
    s.exec(
        "s1",
        "open('chart.png','wb').write(bytes(range(256)))\nopen('e.txt','w').close()",
    )
    .await;
    let (st, h, body) = get_raw(&s, "/v1/sessions/s1/files/chart.png", &[]).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(body, (0..=255u8).collect::<Vec<_>>());
    assert_eq!(h["content-type"], "image/png");
    assert_eq!(h["content-length"], "256");
    let etag = h["etag"].to_str().unwrap().to_owned();
    let (st, _, _) = get_raw(
        &s,
        "/v1/sessions/s1/files/chart.png",
        &[("if-none-match", &etag)],
    )
    .await;
    assert_eq!(st, StatusCode::NOT_MODIFIED);
    let (st, h, body) = get_raw(
        &s,
        "/v1/sessions/s1/files/chart.png",
        &[("range", "bytes=10-19")],
    )
    .await;
    assert_eq!(st, StatusCode::PARTIAL_CONTENT);
    assert_eq!(body, (10..20u8).collect::<Vec<_>>());
    assert_eq!(h["content-range"], "bytes 10-19/256");
    let (st, _, _) = get_raw(
        &s,
        "/v1/sessions/s1/files/chart.png",
        &[("range", "bytes=900-")],
    )
    .await;
    assert_eq!(st, StatusCode::RANGE_NOT_SATISFIABLE);
    let (st, _, body) = get_raw(&s, "/v1/sessions/s1/files/e.txt", &[]).await;
    assert_eq!((st, body.len()), (StatusCode::OK, 0));
    let (_, _, body) = get_raw(&s, "/v1/sessions/s1/files/data/big.bin", &[]).await;
    assert!(body == big, "12 MiB byte-exact");
    // Listings: the root, a directory (also by GET on it), recursive.
    let (st, v) = s.get("/v1/sessions/s1/files").await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let names: Vec<_> = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"chart.png") && names.contains(&"data"),
        "{v}"
    );
    assert_eq!(v["truncated"], false);
    let (_, v) = s.get("/v1/sessions/s1/files/data/").await;
    assert_eq!(v["entries"][0]["path"], "data/big.bin", "{v}");
    assert_eq!(v["entries"][0]["type"], "file");
    let (_, v) = s.get("/v1/sessions/s1/files?recursive=true&limit=1").await;
    assert_eq!(v["truncated"], true, "{v}");
    // Delete.
    let (st, v) = s.delete("/v1/sessions/s1/files/data").await;
    assert_eq!(
        (st, error_code(&v)),
        (StatusCode::CONFLICT, "is_a_directory")
    );
    let (st, _) = s.delete("/v1/sessions/s1/files/data?recursive=true").await;
    assert_eq!(st, StatusCode::OK);
    let (st, v) = s.get("/v1/sessions/s1/files/data/big.bin").await;
    assert_eq!((st, error_code(&v)), (StatusCode::NOT_FOUND, "not_found"));
    // Gone with the session.
    let (st, _) = s.delete("/v1/sessions/s1").await;
    assert_eq!(st, StatusCode::OK);
    let (_, v) = s.get("/v1/sessions/s1/files").await;
    assert_eq!(v["entries"].as_array().unwrap().len(), 0, "{v}");
    s.shutdown().await;
}

#[tokio::test]
async fn bad_paths_and_limits_answer_in_the_error_shape() {
    let s = server_with(
        ServerOptions {
            max_upload_bytes: Some(1024 * 1024),
            ..ServerOptions::default()
        },
        4,
    )
    .await;
    for path in ["../x", "a/../../x", "a/./b", "%2Fetc%2Fpasswd", "a%00b"] {
        let (st, v) = put(&s, &format!("/v1/sessions/s1/files/{path}"), b"x".to_vec()).await;
        assert_eq!(
            (st, error_code(&v)),
            (StatusCode::BAD_REQUEST, "invalid_path"),
            "{path}: {v}"
        );
        let (st, v) = s.get(&format!("/v1/sessions/s1/files/{path}")).await;
        assert_eq!(
            (st, error_code(&v)),
            (StatusCode::BAD_REQUEST, "invalid_path"),
            "{path}: {v}"
        );
    }
    let long = "n".repeat(4096);
    let (st, v) = put(&s, &format!("/v1/sessions/s1/files/{long}"), b"x".to_vec()).await;
    assert_eq!(
        (st, error_code(&v)),
        (StatusCode::BAD_REQUEST, "invalid_path")
    );
    let (st, v) = put(&s, "/v1/sessions/s1/files/big", vec![0; 2 * 1024 * 1024]).await;
    assert_eq!(
        (st, error_code(&v)),
        (StatusCode::PAYLOAD_TOO_LARGE, "too_large")
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_upload_mib"),
        "{v}"
    );
    put(&s, "/v1/sessions/s1/files/f", b"x".to_vec()).await;
    let (st, v) = put(&s, "/v1/sessions/s1/files/f/inside", b"x".to_vec()).await;
    assert_eq!(
        (st, error_code(&v)),
        (StatusCode::CONFLICT, "not_a_directory"),
        "{v}"
    );
    put(&s, "/v1/sessions/s1/files/d/x", b"x".to_vec()).await;
    let (st, v) = put(&s, "/v1/sessions/s1/files/d", b"x".to_vec()).await;
    assert_eq!(
        (st, error_code(&v)),
        (StatusCode::CONFLICT, "is_a_directory"),
        "{v}"
    );
    let (st, v) = s.get("/v1/sessions/s1/files/f/").await;
    assert_eq!(
        (st, error_code(&v)),
        (StatusCode::CONFLICT, "not_a_directory"),
        "{v}"
    );
    let (st, v) = s.get("/v1/sessions/s1/files/nope.txt").await;
    assert_eq!((st, error_code(&v)), (StatusCode::NOT_FOUND, "not_found"));
    let (st, v) = s.get("/v1/sessions/s1/files?bogus=1").await;
    assert_eq!((st, error_code(&v)), (StatusCode::BAD_REQUEST, "bad_query"));
    s.shutdown().await;
}

#[tokio::test]
async fn the_quota_answers_507() {
    let dir = tempfile::tempdir().unwrap();
    let kernel = cellhost::KernelOptions::default().runtime_dir(dir.path().join("run"));
    let manager = cellhost::registry::KernelManager::start(
        cellhost::registry::ManagerOptions::new(dir.path().join("data"))
            .kernel(kernel)
            .warm_pool(0)
            .workspace_quota(Some(1024 * 1024)),
    )
    .await;
    let state = cellhost_server::AppState::new(manager, None, ServerOptions::default());
    let s = common::TestServer {
        router: cellhost_server::router(state.clone()),
        state,
        dir,
    };
    let (st, _) = put(&s, "/v1/sessions/q/files/a", vec![0; 700_000]).await;
    assert_eq!(st, StatusCode::CREATED);
    let (st, v) = put(&s, "/v1/sessions/q/files/b", vec![0; 700_000]).await;
    assert_eq!(
        (st, error_code(&v)),
        (StatusCode::INSUFFICIENT_STORAGE, "quota_exceeded"),
        "{v}"
    );
    s.shutdown().await;
}

#[tokio::test]
async fn a_childs_files_are_its_own() {
    let s = server().await;
    let (st, _) = put(
        &s,
        "/v1/sessions/p/children/c/files/c.txt",
        b"child".to_vec(),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED);
    put(&s, "/v1/sessions/p/files/p.txt", b"parent".to_vec()).await;
    let (st, _) = s.get("/v1/sessions/p/files/c.txt").await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    let (st, _) = s.get("/v1/sessions/p/children/c/files/p.txt").await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    let (_, _, body) = get_raw(&s, "/v1/sessions/p/children/c/files/c.txt", &[]).await;
    assert_eq!(body, b"child");
    let (st, v) = s.get("/v1/sessions/p/children/bad::id/files").await;
    assert_eq!(
        (st, error_code(&v)),
        (StatusCode::BAD_REQUEST, "invalid_session"),
        "{v}"
    );
    s.shutdown().await;
}

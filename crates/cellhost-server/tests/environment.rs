//! `GET /v1/environment`: what a new session's kernel runs in, found out
//! from the real interpreter.
mod common;

use axum::http::StatusCode;
use cellhost::registry::{KernelManager, ManagerOptions};
use cellhost::{KernelOptions, Sandbox};
use cellhost_server::{AppState, ServerOptions};
use common::*;

fn venv_python() -> std::path::PathBuf {
    let path = std::env::var_os("CELLHOST_TEST_VENV_PYTHON")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv-test/bin/python")
        });
    assert!(
        path.exists(),
        "the test venv is missing ({}); run scripts/test, which creates it",
        path.display()
    );
    path
}

#[tokio::test]
async fn the_environment_names_python_the_sandbox_and_the_dialect() {
    let s = server().await;
    let (st, v) = s.get("/v1/environment").await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["backend"], "local");
    assert_eq!(v["sandbox"], "none");
    assert_eq!(v["network"], "host");
    let version = v["python_version"].as_str().expect("a version");
    assert!(
        version.starts_with("3.") && version.split('.').count() == 3,
        "{v}"
    );
    let magics: Vec<&str> = v["magics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    for m in ["!cmd", "%pip install|uninstall|list|show", "%cd", "%%bash"] {
        assert!(magics.contains(&m), "{m} missing: {v}");
    }
    let summary = v["summary"].as_str().unwrap();
    assert!(summary.contains(&format!("Python {version}")), "{summary}");
    assert!(summary.contains("%pip install NAME"), "{summary}");
    let (_, doc) = s.get("/openapi.json").await;
    assert!(doc["paths"]["/v1/environment"].is_object());
    assert!(doc["components"]["schemas"]["Environment"].is_object());
    s.shutdown().await;
}

#[tokio::test]
async fn a_strict_daemon_says_network_off_workspace_and_its_packages() {
    let dir = tempfile::tempdir().unwrap();
    let kernel = KernelOptions::default()
        .runtime_dir(dir.path().join("run"))
        .python(venv_python())
        .sandbox(Sandbox::strict());
    let manager = KernelManager::start(
        ManagerOptions::new(dir.path().join("data"))
            .kernel(kernel)
            .warm_pool(0),
    )
    .await;
    let state = AppState::new(manager, None, ServerOptions::default());
    let router = cellhost_server::router(state.clone());
    let s = TestServer { state, router, dir };
    let (st, v) = s.get("/v1/environment").await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["sandbox"], "strict");
    assert_eq!(v["network"], "off");
    assert_eq!(v["cwd"], "/workspace");
    let packages: Vec<&str> = v["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    // The test venv has these; it has no torch.
    for p in ["numpy", "pandas", "matplotlib", "PIL"] {
        assert!(packages.contains(&p), "{p} missing: {v}");
    }
    assert!(!packages.contains(&"torch"), "{v}");
    let summary = v["summary"].as_str().unwrap();
    assert!(summary.contains("network off"), "{summary}");
    assert!(summary.contains("/workspace"), "{summary}");
    assert!(
        summary.contains("Importable: numpy, pandas, matplotlib"),
        "{summary}"
    );
    // Asked once: the second answer is the same, from the cache.
    let (_, again) = s.get("/v1/environment").await;
    assert_eq!(again, v);
    s.shutdown().await;
}

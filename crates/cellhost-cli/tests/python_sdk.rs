//! The Python client (`clients/python`, installed into the test venv from
//! its wheel by `scripts/test`) against a real daemon: every method, sync
//! and async, its rendering against the MCP server's, the execute_code
//! tool against the official OpenAI and Anthropic SDKs' types, a token,
//! and no daemon at all. The scenarios are `clients/python/tests/
//! scenarios.py`; each prints `OK <scenario>`.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::daemon::Daemon;

fn venv_python() -> PathBuf {
    common::python::test_venv()
}

fn scenario(args: &[&str]) {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../clients/python/tests/scenarios.py");
    common::python::scenario(&venv_python(), &script, args);
}

/// A daemon whose kernels run on the test venv (matplotlib for displays).
fn daemon(data: &Path, env: &[(&str, &str)]) -> Daemon {
    let python = venv_python();
    let python = python.to_str().unwrap();
    Daemon::start(data, &["--sandbox", "none", "--python", python], env)
}

#[test]
fn every_method_of_the_sync_client() {
    let data = tempfile::tempdir().unwrap();
    let d = daemon(data.path(), &[]);
    scenario(&["sync", &d.url]);
}

#[test]
fn every_method_of_the_async_client() {
    let data = tempfile::tempdir().unwrap();
    let d = daemon(data.path(), &[]);
    scenario(&["async", &d.url]);
}

#[test]
fn text_is_what_the_mcp_server_says() {
    let data = tempfile::tempdir().unwrap();
    let d = daemon(data.path(), &[]);
    scenario(&["render", &d.url]);
}

#[test]
fn the_execute_code_tool_fits_the_openai_and_anthropic_sdks() {
    let data = tempfile::tempdir().unwrap();
    let d = daemon(data.path(), &[]);
    scenario(&["tools", &d.url]);
}

#[test]
fn a_token_is_sent_and_a_missing_one_is_a_401() {
    let data = tempfile::tempdir().unwrap();
    let d = daemon(data.path(), &[("CELLHOST_TOKEN", "sdk-secret")]);
    scenario(&["token", &d.url, "sdk-secret"]);
}

#[test]
fn no_daemon_says_how_to_start_one() {
    scenario(&["nodaemon"]);
}

#[test]
fn the_example_agent_loop_keeps_state_across_tool_calls() {
    let data = tempfile::tempdir().unwrap();
    let d = daemon(data.path(), &[]);
    let example =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../clients/python/examples/agent_loop.py");
    let out = Command::new(venv_python())
        .arg(example)
        .arg(&d.url)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for api in ["anthropic", "openai"] {
        assert!(
            stdout.contains(&format!("{api}: Done: the area is 12.57")),
            "{stdout}"
        );
    }
}

//! `cellhost mcp` (stdio) and the daemon's `/mcp` (streamable HTTP),
//! driven by the official MCP Python SDK (PyPI `mcp`, in the test venv
//! `scripts/test` builds), and code mode against a real downstream server
//! built with the same SDK. The scenarios and their assertions are in
//! `tests/mcp/client.py`; each prints `OK <scenario>` when all held.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

mod common;

/// The test venv's interpreter (it has the `mcp` package).
fn venv_python() -> PathBuf {
    common::python::test_venv()
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/mcp")
        .join(name)
}

/// Run one scenario of client.py; it must exit 0 and print its OK line.
fn scenario(args: &[&str]) {
    common::python::scenario(&venv_python(), &script("client.py"), args);
}

#[test]
fn stdio_server_with_the_python_sdk() {
    let data = tempfile::tempdir().unwrap();
    scenario(&[
        "stdio",
        env!("CARGO_BIN_EXE_cellhost"),
        data.path().to_str().unwrap(),
    ]);
}

/// A temp dir holding a cellhost.toml whose `[[mcp_servers]]` is the
/// demo server (`tests/mcp/demo_server.py` on the test venv).
fn demo_config() -> (tempfile::TempDir, PathBuf) {
    let data = tempfile::tempdir().unwrap();
    let config = data.path().join("cellhost.toml");
    std::fs::write(
        &config,
        format!(
            "[[mcp_servers]]\nname = \"demo\"\ncommand = {:?}\nargs = [{:?}]\n",
            venv_python().display().to_string(),
            script("demo_server.py").display().to_string()
        ),
    )
    .unwrap();
    (data, config)
}

#[test]
fn code_mode_calls_a_downstream_mcp_server() {
    let (data, config) = demo_config();
    scenario(&[
        "codemode",
        env!("CARGO_BIN_EXE_cellhost"),
        data.path().join("data").to_str().unwrap(),
        config.to_str().unwrap(),
    ]);
}

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.0.wait();
    }
}

#[test]
fn streamable_http_endpoint_with_the_python_sdk() {
    let data = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_cellhost"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--sandbox",
            "none",
            "--data-dir",
        ])
        .arg(data.path())
        .env("CELLHOST_TOKEN", "mcp-test-token")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let daemon = Daemon(child);
    let url = loop {
        let mut line = String::new();
        assert!(out.read_line(&mut line).unwrap() > 0, "serve exited early");
        if let Some(rest) = line.split("listening on ").nth(1) {
            break rest.split_whitespace().next().unwrap().to_owned();
        }
    };
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    scenario(&["http", &format!("{url}/mcp"), "mcp-test-token"]);
    drop(daemon);
}

/// Alive and not a zombie.
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
        .unwrap_or(false)
}

/// Start `cellhost mcp` with the demo downstream server (the official
/// Rust SDK is the client) and run a cell that reports the kernel's pid,
/// the server's and a `sleep` the server started in its own process
/// group (it ignores stdin EOF, so only a group kill ends it).
async fn host_with_children() -> (
    rmcp::service::RunningService<rmcp::RoleClient, ()>,
    i32,
    Vec<i32>,
    tempfile::TempDir,
) {
    use rmcp::model::CallToolRequestParams;
    use rmcp::ServiceExt;
    let (data, config) = demo_config();
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_cellhost"));
    cmd.args(["mcp", "--sandbox", "none", "--config"])
        .arg(&config)
        .arg("--data-dir")
        .arg(data.path().join("data"));
    let transport = rmcp::transport::TokioChildProcess::new(cmd).unwrap();
    let host = transport.id().unwrap() as i32;
    let client = ().serve(transport).await.unwrap();
    let mut args = serde_json::Map::new();
    args.insert(
        "code".into(),
        "import os, tools\nf'{os.getpid()} {tools.demo.pid()} {tools.demo.spawn_child()}'".into(),
    );
    let r = client
        .call_tool(CallToolRequestParams::new("execute_code").with_arguments(args))
        .await
        .unwrap();
    let value = r.structured_content.unwrap()["value"]
        .as_str()
        .unwrap()
        .trim_matches('\'')
        .to_owned();
    let pids: Vec<i32> = value.split(' ').map(|p| p.parse().unwrap()).collect();
    assert_eq!(pids.len(), 3, "{value}");
    assert!(pids.iter().all(|&p| alive(p)), "{pids:?}");
    (client, host, pids, data)
}

fn all_gone_within(pids: &[i32], secs: u64, what: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while pids.iter().any(|&p| alive(p)) {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: still alive after {secs} s: {:?}",
            pids.iter().filter(|&&p| alive(p)).collect::<Vec<_>>()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// SIGKILL `cellhost mcp` mid-session: its kernel, its downstream server
/// and the server's own child die with it (death pipes).
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_host_leaves_no_kernel_or_downstream_server_behind() {
    let (_client, host, pids, _data) = host_with_children().await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(host),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    all_gone_within(&pids, 10, "after SIGKILL of the host");
}

/// The client hangs up (stdin closes): `cellhost mcp` exits and takes its
/// kernel, the downstream server and the server's group with it.
#[tokio::test(flavor = "multi_thread")]
async fn a_normal_exit_stops_the_downstream_group_too() {
    let (client, host, pids, _data) = host_with_children().await;
    drop(client);
    all_gone_within(&pids, 15, "after the client hung up");
    all_gone_within(&[host], 5, "cellhost mcp itself");
}

/// A downstream server that cannot start stops `cellhost mcp` at once
/// with a line naming it (exit 2), before any client talks to it.
#[test]
fn a_downstream_server_that_cannot_start_is_named() {
    let data = tempfile::tempdir().unwrap();
    let config = data.path().join("cellhost.toml");
    std::fs::write(
        &config,
        "[[mcp_servers]]\nname = \"ghost\"\ncommand = \"/nonexistent/mcp-server\"\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_cellhost"))
        .args(["mcp", "--sandbox", "none", "--config"])
        .arg(&config)
        .arg("--data-dir")
        .arg(data.path().join("data"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("[[mcp_servers]] \"ghost\"") && stderr.contains("cannot start"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "stdout is the protocol's only");
}

/// Start `cellhost serve` (token `mcp-test-token`) with `config`; returns
/// the daemon (SIGTERMed on drop) and its `/mcp` URL. `CELLHOST_OLD_BIN`
/// runs another binary instead (to check a test against old code).
fn serve_with(config: &Path, data: &Path) -> (Daemon, String) {
    let bin = std::env::var("CELLHOST_OLD_BIN").unwrap_or(env!("CARGO_BIN_EXE_cellhost").into());
    let mut child = Command::new(bin)
        .args(["serve", "--listen", "127.0.0.1:0", "--sandbox", "none"])
        .arg("--config")
        .arg(config)
        .arg("--data-dir")
        .arg(data)
        .env("CELLHOST_TOKEN", "mcp-test-token")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let daemon = Daemon(child);
    let url = loop {
        let mut line = String::new();
        assert!(out.read_line(&mut line).unwrap() > 0, "serve exited early");
        if let Some(rest) = line.split("listening on ").nth(1) {
            break rest.split_whitespace().next().unwrap().to_owned();
        }
    };
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    (daemon, format!("{url}/mcp"))
}

/// Session hygiene with the Python SDK: its clean close logs no warning,
/// a named session's result says its name, and with
/// `[mcp] idle_session_seconds = 2` an abandoned client's kernel goes
/// while a quiet 5 s cell in another session runs on undisturbed.
#[test]
fn mcp_sessions_close_cleanly_and_idle_ones_are_closed() {
    let data = tempfile::tempdir().unwrap();
    let config = data.path().join("cellhost.toml");
    let text = if std::env::var_os("CELLHOST_OLD_BIN").is_some() {
        "" // the old binary knows no [mcp] section
    } else {
        "[mcp]\nidle_session_seconds = 2\n"
    };
    std::fs::write(&config, text).unwrap();
    let (daemon, url) = serve_with(&config, &data.path().join("data"));
    scenario(&["hygiene", &url, "mcp-test-token"]);
    drop(daemon);
}

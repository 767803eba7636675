//! `cellhost mcp` (stdio) and the daemon's `/mcp` (streamable HTTP),
//! driven by the official MCP Python SDK (PyPI `mcp`, in the test venv
//! `scripts/test` builds), and code mode against a real downstream server
//! built with the same SDK. The scenarios and their assertions are in
//! `tests/mcp/client.py`; each prints `OK <scenario>` when all held.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The test venv's interpreter (it has the `mcp` package). Fails, never
/// skips, without it.
fn venv_python() -> PathBuf {
    let path = std::env::var_os("CELLHOST_TEST_VENV_PYTHON")
        .map(PathBuf::from)
        .expect(
            "CELLHOST_TEST_VENV_PYTHON is not set: run the tests with scripts/test, which builds \
         the test venv (with the MCP Python SDK)",
        );
    assert!(path.exists(), "{} does not exist", path.display());
    path
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/mcp")
        .join(name)
}

/// Run one scenario of client.py; it must exit 0 and print its OK line.
fn scenario(args: &[&str]) {
    let out = Command::new(venv_python())
        .arg(script("client.py"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains(&format!("OK {}", args[0])),
        "scenario {} failed ({}):\n{stdout}\n{stderr}",
        args[0],
        out.status
    );
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

#[test]
fn code_mode_calls_a_downstream_mcp_server() {
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

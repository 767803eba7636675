//! The Jupyter Kernel Gateway protocol (issue 21) against real clients
//! nobody here wrote: Jupyter Server as a gateway client, nbclient running
//! a notebook through Jupyter Server's gateway kernel manager, ag2's
//! `JupyterCodeExecutor`, JupyterLab in headless Chromium, and a raw
//! WebSocket client (`websocket-client`) for protocol edge cases. Each test starts a real `cellhost serve` and
//! runs one check of `tests/jupyter/clients.py` with the `.venv-jupyter`
//! interpreter (scripts/test creates it from scripts/jupyter-requirements.txt).

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

const TOKEN: &str = "jupyter-test-token";

fn venv_python() -> PathBuf {
    let path = match std::env::var_os("CELLHOST_JUPYTER_VENV_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv-jupyter/bin/python"),
    };
    assert!(
        path.exists(),
        "the Jupyter test venv is missing ({}); run scripts/test, which creates it",
        path.display()
    );
    path
}

/// The test venv's interpreter (pandas, matplotlib) for kernels that need it.
fn test_venv_python() -> PathBuf {
    let path = match std::env::var_os("CELLHOST_TEST_VENV_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv-test/bin/python"),
    };
    assert!(
        path.exists(),
        "the test venv is missing ({}); run scripts/test, which creates it",
        path.display()
    );
    path
}

struct Daemon {
    child: Child,
    url: String,
    _data: tempfile::TempDir,
}

impl Daemon {
    fn start(token: Option<&str>, python: Option<&Path>) -> Daemon {
        let data = tempfile::tempdir().unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_cellhost"));
        cmd.args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--sandbox",
            "none",
            "--data-dir",
        ])
        .arg(data.path())
        .env_remove("CELLHOST_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
        if let Some(t) = token {
            cmd.env("CELLHOST_TOKEN", t);
        }
        if let Some(p) = python {
            cmd.arg("--python").arg(p);
        }
        let mut child = cmd.spawn().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let url = loop {
            let mut line = String::new();
            assert!(
                out.read_line(&mut line).unwrap() > 0,
                "serve exited before listening"
            );
            if let Some(rest) = line.split("listening on ").nth(1) {
                break rest.split_whitespace().next().unwrap().to_owned();
            }
        };
        std::thread::spawn(move || {
            let mut sink = String::new();
            let _ = out.read_to_string(&mut sink);
        });
        Daemon {
            child,
            url,
            _data: data,
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.child.wait();
    }
}

/// Run `check` of clients.py against a fresh daemon; panics with its output.
fn check(name: &str, token: Option<&str>) {
    check_with(name, token, None, &[]);
}

/// [`check`], the daemon's kernels on `python`, `env` for clients.py.
fn check_with(name: &str, token: Option<&str>, python: Option<&Path>, env: &[(&str, &Path)]) {
    let daemon = Daemon::start(token, python);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/jupyter/clients.py");
    let out = Command::new(venv_python())
        .arg(&script)
        .args([name, &daemon.url, token.unwrap_or("none")])
        .envs(env.iter().copied())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "check {name} failed:\n{text}");
    assert!(
        text.contains(" ok"),
        "check {name} printed no verdict:\n{text}"
    );
}

#[test]
fn a_raw_websocket_client_gets_the_jupyter_message_sequence() {
    check("raw_protocol", Some(TOKEN));
}

/// Prints and displays leave the kernel on separate pipes; iopub still has
/// them in the order the cell made them.
#[test]
fn iopub_has_prints_and_displays_in_the_order_the_cell_made_them() {
    check("iopub_order", Some(TOKEN));
}

/// A DataFrame's HTML table and a custom class's `_repr_*_` forms come in
/// the `execute_result`, as ipykernel sends them.
#[test]
fn a_values_rich_reprs_are_its_execute_result() {
    check_with("rich_result", Some(TOKEN), Some(&test_venv_python()), &[]);
}

#[test]
fn two_sockets_share_iopub_and_a_malformed_frame_closes_nothing() {
    check("two_sockets_and_malformed", Some(TOKEN));
}

#[test]
fn interrupt_restart_and_a_lost_kernel_are_told_over_the_websocket() {
    check("interrupt_and_state_note", Some(TOKEN));
}

#[test]
fn a_jupyter_kernel_is_the_cellhost_session_of_the_same_id() {
    check("shared_session", Some(TOKEN));
}

#[test]
fn jupyter_server_runs_cells_on_cellhost_as_its_gateway() {
    check("jupyter_server", Some(TOKEN));
}

/// Jupyter Server's gateway kernel client opens its WebSocket without
/// the token (jupyter_server 2.x), so nbclient through it needs a
/// tokenless (loopback) daemon.
#[test]
fn nbclient_executes_a_notebook_through_the_gateway() {
    check("nbclient", None);
}

/// With a token on cellhost, nbclient reaches it through a loopback
/// Jupyter Server whose gateway client holds the token
/// (`--GatewayClient.auth_token`).
#[test]
fn nbclient_through_jupyter_server_reaches_a_daemon_with_a_token() {
    check("nbclient_token", Some(TOKEN));
}

/// `jupyter lab --gateway-url=cellhost` in headless Chromium (chromedriver,
/// as tests/dashboard.rs): a notebook opened, its cell run with
/// Shift+Enter, the output in the DOM, a screenshot checked as a PNG and
/// kept under target/tmp/.
#[test]
fn jupyterlab_in_chromium_runs_a_notebook_cell_on_cellhost() {
    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("jupyterlab.png");
    let _ = std::fs::remove_file(&shot);
    check_with(
        "jupyterlab",
        Some(TOKEN),
        None,
        &[("CELLHOST_SCREENSHOT", &shot)],
    );
    let png = std::fs::read(&shot).expect("the screenshot was saved");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG screenshot");
    eprintln!("JupyterLab screenshot: {}", shot.display());
}

#[test]
fn ag2_jupyter_code_executor_keeps_state_between_code_blocks() {
    check("ag2", Some(TOKEN));
}

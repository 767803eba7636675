//! Tenants on a real strict daemon: two tenants and the admin across
//! every route (HTTP, SSE, files, history, kernels, metrics, the
//! dashboard's cookie, Jupyter REST and WebSocket, `/mcp` through the
//! official MCP Python SDK), with same-named sessions; another tenant's
//! session answers exactly like one that does not exist; limits answer
//! 429 with Retry-After; workspaces and uids are distinct. The
//! assertions are in `tests/tenants/scenario.py`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

mod common;
use common::daemon::Daemon;

fn python(var: &str) -> PathBuf {
    common::python::venv(var)
}

const CONFIG: &str = r#"
[[tenants]]
name = "alice"
token = "alice-token"

[[tenants]]
name = "bob"
# sha256 of "bob-token": the file need not hold the secret.
token_sha256 = "SHA"

[[tenants]]
name = "capped"
token = "capped-token"
max_kernels = 2
max_sessions = 1

[[tenants]]
name = "slow"
token = "slow-token"
max_cells_per_minute = 3
"#;

fn sha256(s: &str) -> String {
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout)[..64].to_owned()
}

fn daemon(dir: &Path) -> Daemon {
    let config = dir.join("cellhost.toml");
    std::fs::write(&config, CONFIG.replace("SHA", &sha256("bob-token"))).unwrap();
    Daemon::start(
        &dir.join("data"),
        &["--config", config.to_str().unwrap()],
        &[("CELLHOST_TOKEN", "admin-token")],
    )
}

fn scenario(python: &Path, name: &str, url: &str) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tenants/scenario.py");
    common::python::scenario(python, &script, &[name, url]);
}

/// One daemon, the scenarios in order (later ones rely on the sessions
/// earlier ones made): HTTP routes, then Jupyter, then MCP.
#[test]
fn tenants_see_only_their_own_sessions_on_every_route() {
    let dir = tempfile::tempdir().unwrap();
    let d = daemon(dir.path());
    scenario(&python("CELLHOST_JUPYTER_VENV_PYTHON"), "http", &d.url);
    scenario(&python("CELLHOST_JUPYTER_VENV_PYTHON"), "jupyter", &d.url);
    scenario(&python("CELLHOST_TEST_VENV_PYTHON"), "mcp", &d.url);
    assert_eq!(d.stop(), Some(0));
}

/// Tenants need the admin token: without one `cellhost serve` refuses
/// to start and says why; a tenant with the admin's token is refused too.
#[test]
fn tenants_without_an_admin_token_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("cellhost.toml");
    std::fs::write(&config, "[[tenants]]\nname = \"a\"\ntoken = \"ta\"\n").unwrap();
    for (env, why) in [
        (None, "need an admin token"),
        (Some("ta"), "has the admin token"),
    ] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_cellhost"));
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--sandbox", "none"])
            .arg("--config")
            .arg(&config)
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .env_remove("CELLHOST_TOKEN")
            .stdin(Stdio::null());
        if let Some(t) = env {
            cmd.env("CELLHOST_TOKEN", t);
        }
        let out = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(why), "{stderr}");
    }
}

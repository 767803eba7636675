//! What a real `cellhost serve` redacts of its own secrets (the daemon's
//! token, `[[tools]]` header values, `[[mcp_servers]]` env values) and
//! what `cellhost exec` writes to a terminal (no C1 controls).

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

const DAEMON_TOKEN: &str = "daemon-token-Xy12-very-long";
const TOOL_CREDENTIAL: &str = "tool-credential-Ab12cd34";
const TOOL_KEY: &str = "plain-tool-key-9876";
const MCP_ENV_VALUE: &str = "mcp-env-value-Qq77rr88";

struct Daemon {
    child: Child,
    url: String,
}

impl Daemon {
    fn start(data: &Path, config: &Path) -> Daemon {
        let mut child = Command::new(env!("CARGO_BIN_EXE_cellhost"))
            .args(["serve", "--listen", "127.0.0.1:0", "--sandbox", "none"])
            .arg("--data-dir")
            .arg(data)
            .arg("--config")
            .arg(config)
            .env_remove("CELLHOST_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let url = loop {
            let mut line = String::new();
            if out.read_line(&mut line).unwrap() == 0 {
                panic!("serve exited before listening");
            }
            if let Some(rest) = line.split("listening on ").nth(1) {
                break rest.split_whitespace().next().unwrap().to_owned();
            }
        };
        std::thread::spawn(move || {
            let mut sink = String::new();
            let _ = out.read_to_string(&mut sink);
        });
        Daemon { child, url }
    }

    fn cli(&self, args: &[&str], token: Option<&str>) -> Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_cellhost"));
        cmd.args(args)
            .env("CELLHOST_URL", &self.url)
            .env_remove("CELLHOST_TOKEN")
            .stdin(Stdio::null());
        if let Some(t) = token {
            cmd.env("CELLHOST_TOKEN", t);
        }
        cmd.output().unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.child.wait();
    }
}

/// The test venv's interpreter (it has the `mcp` package).
fn venv_python() -> PathBuf {
    let path = std::env::var_os("CELLHOST_TEST_VENV_PYTHON")
        .map(PathBuf::from)
        .expect("CELLHOST_TEST_VENV_PYTHON is not set: run the tests with scripts/test");
    assert!(path.exists(), "{} does not exist", path.display());
    path
}

#[test]
fn the_daemons_token_tool_headers_and_mcp_env_values_are_redacted_from_cells() {
    let data = tempfile::tempdir().unwrap();
    let config = data.path().join("cellhost.toml");
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/demo_server.py");
    std::fs::write(
        &config,
        format!(
            "[server]\ntoken = {DAEMON_TOKEN:?}\n\
             [[tools]]\nname = \"lookup\"\nurl = \"http://127.0.0.1:9/lookup\"\n\
             headers = {{ Authorization = \"Token {TOOL_CREDENTIAL}\", \"X-Api-Key\" = {TOOL_KEY:?} }}\n\
             [[mcp_servers]]\nname = \"demo\"\ncommand = {:?}\nargs = [{:?}]\n\
             env = {{ DEMO_SETTING = {MCP_ENV_VALUE:?} }}\n",
            venv_python().display().to_string(),
            demo.display().to_string(),
        ),
    )
    .unwrap();
    let d = Daemon::start(&data.path().join("data"), &config);
    // The cell learns the values some other way (here: its code builds
    // them from pieces, so the code holds none of them whole).
    let split = |s: &str| {
        let (a, b) = s.split_at(s.len() / 2);
        format!("{a:?} + {b:?}")
    };
    let code = format!(
        "print({})\nprint({})\nprint({})\nprint({})",
        split(DAEMON_TOKEN),
        split(TOOL_CREDENTIAL),
        split(TOOL_KEY),
        split(MCP_ENV_VALUE)
    );
    let o = d.cli(&["exec", "-s", "r", &code], Some(DAEMON_TOKEN));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{out} {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(out, "[REDACTED:secret]\n".repeat(4), "{out}");
    // Code that holds them whole is redacted in the history too.
    let o = d.cli(
        &["exec", "-s", "r", &format!("x = {DAEMON_TOKEN:?}")],
        Some(DAEMON_TOKEN),
    );
    assert_eq!(o.status.code(), Some(0));
    let o = d.cli(&["history", "r"], Some(DAEMON_TOKEN));
    let history = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(history.contains("REDACTED"), "{history}");
    assert!(!history.contains(DAEMON_TOKEN), "{history}");
}

#[test]
fn exec_never_writes_c1_controls_to_the_terminal() {
    let data = tempfile::tempdir().unwrap();
    let config = data.path().join("cellhost.toml");
    std::fs::write(&config, "").unwrap();
    let d = Daemon::start(&data.path().join("data"), &config);
    let o = d.cli(
        &["exec", "print('A\\u009b2JB\\u009d0;pwned\\u0007C')"],
        None,
    );
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "ABC\n");
    assert!(!o
        .stdout
        .windows(2)
        .any(|w| w[0] == 0xc2 && (0x80..=0x9f).contains(&w[1])));
}

//! `cellhost serve` and its CLI clients, as real processes.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::daemon::Daemon;

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn exec_keeps_state_per_session_and_exits_like_run() {
    let data = tempfile::tempdir().unwrap();
    let d = Daemon::none(data.path());
    let o = d.cli(&["exec", "-s", "t", "x = 5; print('hi')"]);
    assert_eq!(o.status.code(), Some(0), "{:?}", text(&o));
    assert_eq!(text(&o).0, "hi\n");
    let o = d.cli(&["exec", "-s", "t", "x * 2"]);
    assert_eq!(text(&o).0, "Out[2]: 10\n");
    let o = d.cli(&["exec", "-s", "t", "1/0"]);
    let (out, _) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("ZeroDivisionError: division by zero") && out.contains("[error]"),
        "{out}"
    );
    let o = d.cli(&["exec", "-s", "t", "--json", "x + 1"]);
    let v: serde_json::Value = serde_json::from_str(&text(&o).0).unwrap();
    assert_eq!(v["value"], "6");
    let o = d.cli(&["exec", "-s", "other", "'x' in dir()"]);
    assert_eq!(text(&o).0, "Out[1]: False\n");
    let mut child = Command::new(env!("CARGO_BIN_EXE_cellhost"))
        .args(["exec", "-s", "t", "-"])
        .env("CELLHOST_URL", &d.url)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"print(x * 3)\n")
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(text(&o).0, "15\n");
    let o = d.cli(&["exec", "--timeout", "0", "1"]);
    assert_eq!(o.status.code(), Some(2), "a bad flag is a usage error");
}

#[test]
fn ctrl_c_on_exec_interrupts_the_cell_and_exits_130() {
    let data = tempfile::tempdir().unwrap();
    let d = Daemon::none(data.path());
    assert_eq!(d.cli(&["exec", "-s", "i", "x = 7"]).status.code(), Some(0));
    let mut child = Command::new(env!("CARGO_BIN_EXE_cellhost"))
        .args([
            "exec",
            "-s",
            "i",
            "import time\nprint('start', flush=True)\ntime.sleep(120)",
        ])
        .env("CELLHOST_URL", &d.url)
        .env_remove("CELLHOST_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The cell is running once its first line arrives.
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    assert_eq!(first, "start\n");
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let code = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st.code();
        }
        assert!(Instant::now() < deadline, "exec did not exit on SIGINT");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(code, Some(130));
    // The server's cell was interrupted (not left sleeping): the session
    // answers at once, its state kept.
    let started = Instant::now();
    let o = d.cli(&["exec", "-s", "i", "x"]);
    assert_eq!(text(&o).0, "Out[3]: 7\n");
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[test]
fn the_data_dir_and_history_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let data = tempfile::tempdir().unwrap();
    std::fs::set_permissions(data.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let d = Daemon::none(data.path());
    assert_eq!(d.cli(&["exec", "-s", "p", "1"]).status.code(), Some(0));
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(data.path()), 0o700);
    assert_eq!(mode(&data.path().join("history.sqlite")), 0o600);
}

#[test]
fn exec_prints_the_results_tail_when_streaming_stopped_at_the_cap() {
    let data = tempfile::tempdir().unwrap();
    let d = Daemon::none(data.path());
    let code = "for i in range(3000): print('line', i, 'x' * 60)\nprint('THE-END')";
    let o = d.cli(&["exec", "-s", "big", code]);
    let (out, _) = text(&o);
    assert_eq!(o.status.code(), Some(0));
    assert!(
        out.contains("streaming of stdout stopped"),
        "{}",
        &out[..200]
    );
    let tail = &out[out.len().saturating_sub(2000)..];
    assert!(
        out.contains("[cellhost: the cell result's stdout (head and tail) follows]")
            && tail.contains("THE-END"),
        "{tail}"
    );
}

#[test]
fn a_line_that_only_looks_like_the_stop_line_is_printed_once() {
    // The cut is a typed `stream_stopped` event, not text: a cell that
    // prints the stop line's words has not been cut.
    let data = tempfile::tempdir().unwrap();
    let d = Daemon::none(data.path());
    let line = "[cellhost: streaming of stdout stopped after 1 bytes; fake]";
    let o = d.cli(&["exec", "-s", "look", &format!("print({line:?})")]);
    let (out, _) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert_eq!(out, format!("{line}\n"));
}

/// Run `cellhost` with its stdout on a pseudo-terminal; what it printed.
fn on_a_terminal(d: &Daemon, args: &[&str]) -> String {
    use std::os::fd::{FromRawFd, OwnedFd};
    let (mut primary, mut secondary) = (-1, -1);
    // SAFETY: openpty writes two new descriptors; the null pointers ask
    // for no name, termios or window size.
    let rc = unsafe {
        libc::openpty(
            &mut primary,
            &mut secondary,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors are new and owned here only.
    let (primary, secondary) = unsafe {
        (
            OwnedFd::from_raw_fd(primary),
            OwnedFd::from_raw_fd(secondary),
        )
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_cellhost"))
        .args(args)
        .env("CELLHOST_URL", &d.url)
        .env_remove("CELLHOST_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::from(secondary))
        .spawn()
        .unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    // The secondary end is closed (the child exited, ours moved): read
    // until the terminal says so (EIO).
    let mut out = Vec::new();
    let _ = std::fs::File::from(primary).read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn history_on_a_terminal_shows_control_characters_in_stored_code_escaped() {
    let data = tempfile::tempdir().unwrap();
    let d = Daemon::none(data.path());
    // Code that holds ESC and C1 control characters (a retitle, a CSI
    // clear screen) in a comment: stored as sent.
    let code = "x = 1  # \u{1b}]0;pwned\u{7}\u{1b}[2J\u{9b}2J";
    assert_eq!(d.cli(&["exec", "-s", "esc", code]).status.code(), Some(0));
    let shown = on_a_terminal(&d, &["history", "esc"]);
    assert!(shown.contains(">>> x = 1  #"), "{shown:?}");
    assert!(
        !shown.contains('\u{1b}') && !shown.contains('\u{9b}') && !shown.contains('\u{7}'),
        "{shown:?}"
    );
    assert!(
        shown.contains("\\x1b]0;pwned\\x07\\x1b[2J\\u{9b}2J"),
        "{shown:?}"
    );
    // A pipe gets the code as stored.
    let piped = text(&d.cli(&["history", "esc"])).0;
    assert!(piped.contains(code), "{piped:?}");
}

#[test]
fn sessions_history_reset_and_interrupt_manage_a_real_daemon() {
    let data = tempfile::tempdir().unwrap();
    let d = Daemon::none(data.path());
    assert_eq!(
        d.cli(&["exec", "-s", "m", "y = 'kept'; print(y)"])
            .status
            .code(),
        Some(0)
    );
    let o = d.cli(&["sessions"]);
    let (out, _) = text(&o);
    assert!(
        out.lines()
            .any(|l| l.starts_with("m ") && l.contains("idle")),
        "{out}"
    );
    let o = d.cli(&["history", "m"]);
    let (out, _) = text(&o);
    assert!(out.contains(">>> y = 'kept'; print(y)\nkept\n"), "{out}");
    let o = d.cli(&["reset", "m"]);
    assert_eq!(o.status.code(), Some(0), "{:?}", text(&o));
    let o = d.cli(&["exec", "-s", "m", "y"]);
    let (out, _) = text(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(out.contains("NameError") && out.contains("note:"), "{out}");
    let o = d.cli(&["reset", "nobody"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2));
    assert!(err.contains("no session \"nobody\""), "{err}");
    // Interrupt a running cell from another process.
    let mut running = Command::new(env!("CARGO_BIN_EXE_cellhost"))
        .args([
            "exec",
            "-s",
            "m",
            "import time\nprint('start', flush=True)\ntime.sleep(60)",
        ])
        .env("CELLHOST_URL", &d.url)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(running.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    assert_eq!(first, "start\n", "output streams while the cell runs");
    assert!(
        running.try_wait().unwrap().is_none(),
        "the cell is still running"
    );
    let o = d.cli(&["interrupt", "m"]);
    assert_eq!(o.status.code(), Some(0), "{:?}", text(&o));
    assert!(text(&o).0.contains("interrupted 1"), "{:?}", text(&o));
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let st = running.wait().unwrap();
    assert_eq!(st.code(), Some(1), "{rest}");
    assert!(
        rest.contains("KeyboardInterrupt") && rest.contains("[interrupted]"),
        "{rest}"
    );
}

#[test]
fn with_no_server_the_clients_print_one_clear_line() {
    for args in [
        vec!["exec", "1"],
        vec!["sessions"],
        vec!["reset", "a"],
        vec!["interrupt", "a"],
        vec!["history", "a"],
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_cellhost"))
            .args(&args)
            .args(["--server", "http://127.0.0.1:9"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        assert!(out.is_empty());
        assert_eq!(
            err,
            "cellhost: no cellhost server at http://127.0.0.1:9; start one with `cellhost serve`\n",
            "{args:?}"
        );
    }
}

#[test]
fn a_token_is_required_once_set_and_clients_send_it() {
    let data = tempfile::tempdir().unwrap();
    let d = Daemon::start(
        data.path(),
        &["--sandbox", "none"],
        &[("CELLHOST_TOKEN", "tkn-42")],
    );
    assert!(
        !d.banner.contains("tkn-42"),
        "the token is never printed: {}",
        d.banner
    );
    assert!(d.banner.contains("/?token=$CELLHOST_TOKEN"), "{}", d.banner);
    let o = d.cli(&["exec", "1"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2));
    assert!(err.contains("CELLHOST_TOKEN"), "{err}");
    let o = d.cli_env(&["exec", "1 + 1"], &[("CELLHOST_TOKEN", "tkn-42")]);
    assert_eq!(text(&o).0, "Out[1]: 2\n");
}

#[test]
fn history_survives_a_daemon_restart() {
    let data = tempfile::tempdir().unwrap();
    let d = Daemon::none(data.path());
    assert_eq!(
        d.cli(&["exec", "-s", "r", "print('before restart')"])
            .status
            .code(),
        Some(0)
    );
    assert_eq!(d.stop(), Some(0));
    let d = Daemon::none(data.path());
    let o = d.cli(&["history", "r"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(out.contains("before restart"), "{out}");
    let o = d.cli(&["history", "r", "--json"]);
    let rows: serde_json::Value = serde_json::from_str(&text(&o).0).unwrap();
    assert_eq!(rows[0]["status"], "success");
    assert_eq!(rows[0]["execution_count"], 1);
}

#[test]
fn sigterm_lets_a_running_cell_finish_before_the_daemon_exits() {
    let data = tempfile::tempdir().unwrap();
    let d = Daemon::none(data.path());
    let mut running = Command::new(env!("CARGO_BIN_EXE_cellhost"))
        .args([
            "exec",
            "-s",
            "g",
            "import time\nprint('go', flush=True)\ntime.sleep(1)\nprint('done')",
        ])
        .env("CELLHOST_URL", &d.url)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(running.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    assert_eq!(first, "go\n");
    assert_eq!(d.stop(), Some(0));
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    assert_eq!(running.wait().unwrap().code(), Some(0), "{rest}");
    assert_eq!(rest, "done\n");
}

#[test]
fn the_daemon_defaults_to_the_strict_sandbox() {
    let data = tempfile::tempdir().unwrap();
    let d = Daemon::start(data.path(), &[], &[]);
    assert!(d.banner.contains("sandbox strict"), "{}", d.banner);
    let o = d.cli(&["exec", "import os; print(os.getcwd())"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    assert_eq!(out, "/workspace\n");
}

#[test]
fn a_public_address_without_a_token_is_refused() {
    let data = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_cellhost"))
        .args(["serve", "--listen", "0.0.0.0:0", "--data-dir"])
        .arg(data.path())
        .env_remove("CELLHOST_TOKEN")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        err.contains("refusing to listen on 0.0.0.0:0 without a token"),
        "{err}"
    );
}

#[test]
fn a_strict_daemon_without_bubblewrap_says_so_at_start() {
    let data = tempfile::tempdir().unwrap();
    let empty = tempfile::tempdir().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_cellhost"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--python",
            "/usr/bin/python3",
            "--data-dir",
        ])
        .arg(data.path())
        .env("PATH", empty.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{out}{err}");
    assert!(
        err.contains("bwrap") && err.contains("--sandbox none"),
        "{err}"
    );
    assert!(!out.contains("listening"), "{out}");
}

#[test]
fn the_config_file_feeds_serve_and_a_typo_in_it_is_refused() {
    let data = tempfile::tempdir().unwrap();
    let conf = data.path().join("cellhost.toml");
    std::fs::write(
        &conf,
        "[sandbox]\nprofile = \"none\"\n[history]\nenabled = false\n[server]\nmax_body_bytes = 2048\n",
    )
    .unwrap();
    let d = Daemon::start(data.path(), &["--config", conf.to_str().unwrap()], &[]);
    assert!(d.banner.contains("sandbox none"), "{}", d.banner);
    assert_eq!(d.cli(&["exec", "-s", "c", "1"]).status.code(), Some(0));
    let o = d.cli(&["history", "c"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).1.contains("keeps no history"), "{:?}", text(&o));
    let o = d.cli(&["exec", "-s", "c", &"x".repeat(4096)]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).1.contains("2048-byte limit"), "{:?}", text(&o));
    drop(d);
    std::fs::write(&conf, "[server]\nlisten_on = \"127.0.0.1:1\"\n").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_cellhost"))
        .args(["serve", "--config", conf.to_str().unwrap()])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).1.contains("listen_on"), "{:?}", text(&o));
}

/// A real HTTP tool endpoint (Python's http.server) that answers
/// `{"result": {"got": args}}`; returns the process and its URL.
fn tool_endpoint() -> (Child, String) {
    let script = r#"
import http.server, json, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers['Content-Length'])))
        out = json.dumps({"result": {"got": body["args"], "tool": body["tool"]}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)
    def log_message(self, *a):
        pass
s = http.server.HTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"#;
    let mut child = Command::new("/usr/bin/python3")
        .args(["-c", script])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut port = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut port)
        .unwrap();
    (child, format!("http://127.0.0.1:{}/tool", port.trim()))
}

#[test]
fn tools_in_the_config_are_callable_from_cells_through_the_daemon() {
    let (mut endpoint, url) = tool_endpoint();
    let data = tempfile::tempdir().unwrap();
    let conf = data.path().join("cellhost.toml");
    std::fs::write(
        &conf,
        format!(
            "[sandbox]\nprofile = \"none\"\n[[tools]]\nname = \"lookup\"\ndescription = \"Look up.\"\nurl = \"{url}\"\nparameters = {{ type = \"object\", properties = {{ q = {{ type = \"string\" }} }}, required = [\"q\"] }}\n"
        ),
    )
    .unwrap();
    let d = Daemon::start(data.path(), &["--config", conf.to_str().unwrap()], &[]);
    let o = d.cli(&[
        "exec",
        "-s",
        "t",
        "import tools\nprint(tools.lookup.__doc__.splitlines()[0])\ntools.lookup(q='x')",
    ]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out} {err}");
    assert!(out.contains("Look up."), "{out}");
    assert!(
        out.contains("{'got': {'q': 'x'}, 'tool': 'lookup'}"),
        "{out}"
    );
    drop(d);
    let _ = endpoint.kill();
    let _ = endpoint.wait();
}

#[test]
fn host_network_is_refused_at_start_without_a_token_or_with_tool_endpoints() {
    let dir = tempfile::tempdir().unwrap();
    let serve = |config: &str, token: Option<&str>| {
        let path = dir.path().join("c.toml");
        std::fs::write(&path, config).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_cellhost"));
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.path().join("data"))
            .arg("--config")
            .arg(&path)
            .env_remove("CELLHOST_TOKEN")
            .stdin(Stdio::null());
        if let Some(t) = token {
            cmd.env("CELLHOST_TOKEN", t);
        }
        cmd.output().unwrap()
    };
    let o = serve("[sandbox]\nnetwork = \"host\"\n", None);
    assert_eq!(o.status.code(), Some(2), "{:?}", text(&o));
    assert!(text(&o).1.contains("set [server] token"), "{:?}", text(&o));
    let o = serve(
        "[sandbox]\nnetwork = true\n[[tools]]\nname = \"t\"\ndescription = \"T.\"\nurl = \"http://127.0.0.1:9/x\"\n",
        Some("s3cret"),
    );
    assert_eq!(o.status.code(), Some(2), "{:?}", text(&o));
    assert!(
        text(&o).1.contains("[[tools]] endpoints (127.0.0.1)"),
        "{:?}",
        text(&o)
    );
}

#[test]
fn a_daemon_restarted_with_sigterm_gives_sessions_their_state_back() {
    let data = tempfile::tempdir().unwrap();
    let d = Daemon::none(data.path());
    let o = d.cli(&[
        "exec",
        "-s",
        "r",
        "import socket\nrows = [1, 2]\nsock = socket.socket()",
    ]);
    assert_eq!(o.status.code(), Some(0), "{:?}", text(&o));
    let o = d.cli(&["snapshot", "-s", "r"]);
    let (out, _) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(
        out.contains("snapshot of 2 name(s)") && out.contains("not kept: sock (socket.socket)"),
        "{out}"
    );
    let o = d.cli(&["snapshot", "-s", "nobody"]);
    assert_eq!(o.status.code(), Some(2), "{:?}", text(&o));
    assert!(
        text(&o).1.contains("no session \"nobody\""),
        "{:?}",
        text(&o)
    );
    // A fork before the restart: its copy waits for its first cell, and
    // the restart keeps it waiting.
    let o = d.cli(&["fork", "-s", "r", "--into", "f1", "--into", "f2"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out} {err}");
    assert!(
        out.contains("session r forked into f1 (snapshot and restore")
            && out.contains("forked into f2"),
        "{out}"
    );
    let o = d.cli(&["exec", "-s", "f1", "--json", "rows.append(3)\nrows"]);
    let v: serde_json::Value = serde_json::from_str(&text(&o).0).unwrap();
    assert_eq!(v["value"], "[1, 2, 3]", "{v}");
    assert_eq!(v["kernel"]["forked_from"], "r", "{v}");
    let o = d.cli(&["fork", "-s", "r", "--into", "f1"]);
    assert_ne!(o.status.code(), Some(0));
    assert!(text(&o).1.contains("dispose"), "{:?}", text(&o));
    assert_eq!(d.stop(), Some(0));

    let d = Daemon::none(data.path());
    let o = d.cli(&["exec", "-s", "r", "--json", "sum(rows)"]);
    let (out, _) = text(&o);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["value"], "3", "{v}");
    assert_eq!(v["kernel"]["restored"]["from"], "restart", "{v}");
    assert_eq!(
        v["kernel"]["state_lost"], true,
        "the socket was not kept: {v}"
    );
    let note = v["kernel"]["note"].as_str().unwrap();
    assert!(
        note.contains("daemon restarted") && note.contains("Not restored: sock"),
        "{note}"
    );
    // f2 never ran before the restart: it still starts as r's fork.
    let o = d.cli(&["exec", "-s", "f2", "--json", "rows"]);
    let v: serde_json::Value = serde_json::from_str(&text(&o).0).unwrap();
    assert_eq!(v["value"], "[1, 2]", "{v}");
    assert_eq!(v["kernel"]["restored"]["from"], "fork", "{v}");
    assert_eq!(v["kernel"]["forked_from"], "r", "{v}");
}

#[test]
fn every_answered_cell_is_in_the_history_after_the_daemon_is_sigkilled() {
    let data = tempfile::tempdir().unwrap();
    let mut d = Daemon::none(data.path());
    // Concurrent sessions, so rows share commits (group commit) too.
    std::thread::scope(|s| {
        for t in 0..4 {
            let d = &d;
            s.spawn(move || {
                for i in 0..6 {
                    let session = format!("k{t}");
                    let o = d.cli(&["exec", "-s", &session, &format!("print('cell {t}-{i}')")]);
                    assert_eq!(text(&o).0, format!("cell {t}-{i}\n"), "{}", text(&o).1);
                }
            });
        }
    });
    // Answered, then SIGKILLed at once: no shutdown, no flush.
    d.child.kill().unwrap();
    d.child.wait().unwrap();
    std::mem::forget(d);
    let d = Daemon::none(data.path());
    for t in 0..4 {
        let o = d.cli(&["history", &format!("k{t}"), "--json"]);
        let rows: serde_json::Value = serde_json::from_str(&text(&o).0).unwrap();
        let outs: Vec<&str> = rows
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["stdout"].as_str().unwrap())
            .collect();
        let want: Vec<String> = (0..6).map(|i| format!("cell {t}-{i}\n")).collect();
        assert_eq!(outs, want, "session k{t}");
    }
    assert_eq!(d.stop(), Some(0));
}

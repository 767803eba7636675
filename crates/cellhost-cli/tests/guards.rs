//! The daemon's HTTP guards, against a real `cellhost serve`: connection
//! floods, slow headers and bodies, queued cells past their bound,
//! bounded history rows and pages, and a full disk under the history.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TOKEN: &str = "guards-test-token";

struct Daemon {
    child: Child,
    addr: SocketAddr,
}

impl Daemon {
    /// `cellhost serve` with `config` as its cellhost.toml, the token set,
    /// the open-file limit at `nofile` when given.
    fn start(data: &Path, config: &str, sandbox: &str, nofile: Option<u32>) -> Daemon {
        let conf = data.with_extension("toml");
        std::fs::write(&conf, config).unwrap();
        let exe = env!("CARGO_BIN_EXE_cellhost");
        let mut cmd = Command::new("/bin/sh");
        let limit = nofile.map_or(String::new(), |n| format!("ulimit -n {n} && "));
        cmd.arg("-c")
            .arg(format!("{limit}exec \"$0\" \"$@\""))
            .arg(exe)
            .args(["serve", "--listen", "127.0.0.1:0", "--sandbox", sandbox])
            .arg("--data-dir")
            .arg(data)
            .arg("--config")
            .arg(&conf)
            .env("CELLHOST_TOKEN", TOKEN)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd.spawn().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut banner = String::new();
        let url = loop {
            let mut line = String::new();
            if out.read_line(&mut line).unwrap() == 0 {
                panic!("serve exited before listening: {banner}");
            }
            banner.push_str(&line);
            if let Some(rest) = line.split("listening on http://").nth(1) {
                break rest.split_whitespace().next().unwrap().to_owned();
            }
        };
        std::thread::spawn(move || {
            let mut sink = String::new();
            let _ = out.read_to_string(&mut sink);
        });
        Daemon {
            child,
            addr: url.parse().unwrap(),
        }
    }

    fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(90))).unwrap();
        s
    }

    /// One request on a new connection.
    fn call(&self, method: &str, path: &str, body: &str) -> Response {
        let mut s = self.connect();
        send(&mut s, method, path, body);
        read_response(&mut s).unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    fn exec(&self, session: &str, code: &str) -> Response {
        let body = serde_json::json!({ "code": code }).to_string();
        self.call("POST", &format!("/v1/sessions/{session}/execute"), &body)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let end = Instant::now() + Duration::from_secs(20);
        while Instant::now() < end && matches!(self.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug)]
struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

fn send(s: &mut TcpStream, method: &str, path: &str, body: &str) {
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
}

/// A response with a Content-Length body (every JSON answer here).
fn read_response(s: &mut TcpStream) -> Result<Response, String> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(0) => return Err(format!("closed after {} bytes", buf.len())),
            Ok(_) => buf.push(byte[0]),
            Err(e) => return Err(format!("read failed after {} bytes: {e}", buf.len())),
        }
    }
    let head = String::from_utf8_lossy(&buf).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("bad status line: {head}"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let len: usize = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse().ok())
        .ok_or_else(|| format!("no content-length: {head}"))?;
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).map_err(|e| e.to_string())?;
    Ok(Response {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// The server closed `s` (EOF or reset), possibly after a short answer.
fn closed(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 512];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return false,
            Err(_) => return true,
        }
    }
}

fn metric(d: &Daemon, name: &str) -> f64 {
    let r = d.call("GET", "/metrics", "");
    r.body
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
}

#[test]
fn a_connection_flood_is_refused_past_the_cap_and_reaped_while_kept_alive_clients_are_served() {
    let dir = tempfile::tempdir().unwrap();
    // With 512 open files the daemon caps connections at 256.
    let d = Daemon::start(
        &dir.path().join("data"),
        "[server]\nheader_timeout_seconds = 2\nidle_timeout_seconds = 60\n",
        "none",
        Some(512),
    );
    let mut kept = d.connect();
    send(&mut kept, "GET", "/v1/kernels", "");
    assert_eq!(read_response(&mut kept).unwrap().status, 200);

    let flood: Vec<TcpStream> = (0..600)
        .map(|_| TcpStream::connect(d.addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(800));
    let mut open = 0;
    for s in &flood {
        s.set_nonblocking(true).unwrap();
        let mut s = s.try_clone().unwrap();
        if !closed(&mut s) {
            open += 1;
        }
    }
    assert!(
        open <= 256,
        "{open} of 600 idle connections are still open past the cap of 256"
    );

    // A client on a connection opened before the flood is served at once.
    let t = Instant::now();
    send(&mut kept, "GET", "/v1/kernels", "");
    assert_eq!(read_response(&mut kept).unwrap().status, 200);
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());

    // The idle ones never sent a request: gone after the header timeout,
    // and a new client gets in.
    let end = Instant::now() + Duration::from_secs(8);
    loop {
        let open = flood
            .iter()
            .filter(|s| !closed(&mut s.try_clone().unwrap()))
            .count();
        if open == 0 {
            break;
        }
        assert!(
            Instant::now() < end,
            "{open} idle connections still open 8 s after a 2 s header timeout"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let t = Instant::now();
    let r = d.call("GET", "/v1/kernels", "");
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    // Every flood connection was closed by the daemon, each for a counted
    // reason: refused past the cap, or the header timeout. (How many of
    // each depends on how fast the daemon accepted while the flood
    // arrived: one accepted after an idle one was reaped is timed out,
    // not refused.)
    let refused = metric(&d, "cellhost_connections_refused_total");
    let timed_out = metric(&d, "cellhost_connections_header_timeouts_total");
    assert!(
        refused >= 1.0 && refused + timed_out >= 600.0,
        "{refused} refused, {timed_out} timed out of 600"
    );
    drop(flood);
}

#[test]
fn a_slow_header_or_body_is_cut_off_after_its_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(
        &dir.path().join("data"),
        "[server]\nheader_timeout_seconds = 2\nbody_timeout_seconds = 2\n",
        "none",
        None,
    );
    // Slowloris: a header line that never ends, a byte every 300 ms.
    let mut s = d.connect();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        .unwrap();
    s.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let t = Instant::now();
    loop {
        if s.write_all(b"a").is_err() || closed(&mut s) {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "a partial header is still held after 10 s (header timeout 2 s)"
        );
    }
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());

    // A body that stops after 20 of its 100000 bytes.
    let mut s = d.connect();
    s.write_all(
        format!(
            "POST /v1/sessions/slow/execute HTTP/1.1\r\nHost: 127.0.0.1\r\n\
             Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n\
             Content-Length: 100000\r\n\r\n{{\"code\": \"1 + 1 #"
        )
        .as_bytes(),
    )
    .unwrap();
    let t = Instant::now();
    match read_response(&mut s) {
        Ok(r) => {
            assert_eq!(r.status, 400, "{}", r.body);
            assert!(r.body.contains("too slowly"), "{}", r.body);
        }
        Err(e) => assert!(t.elapsed() < Duration::from_secs(9), "{e}"),
    }
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}

#[test]
fn cells_past_the_queue_bounds_get_429_with_retry_after() {
    let dir = tempfile::tempdir().unwrap();
    let d = std::sync::Arc::new(Daemon::start(
        &dir.path().join("data"),
        "[server]\nmax_body_bytes = 1048576\nmax_queued_cells_per_session = 3\n\
         max_queued_bytes_per_session = 2097152\n",
        "none",
        None,
    ));
    let spawn = |code: String| {
        let d = d.clone();
        std::thread::spawn(move || d.exec("q", &code))
    };
    let running = spawn("import time; time.sleep(60)".into());
    let end = Instant::now() + Duration::from_secs(30);
    while !d.call("GET", "/v1/kernels", "").body.contains("\"busy\"") {
        assert!(Instant::now() < end, "the first cell never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    let big = |n: u8| format!("x = {n}  # {}", "a".repeat(900_000));
    let mut waiting = vec![spawn(big(1)), spawn(big(2))];
    std::thread::sleep(Duration::from_millis(500));
    // A third 900 KB cell would hold over 2 MiB of this session's code.
    let t = Instant::now();
    let r = d.exec("q", &big(3));
    assert_eq!(r.status, 429, "{}", r.body);
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    assert_eq!(r.header("retry-after"), Some("2"));
    assert_eq!(r.json()["error"]["code"], "too_many_queued");
    assert!(
        r.body.contains("max_queued_bytes_per_session"),
        "{}",
        r.body
    );
    // A small one still fits (three waiting), a fourth waiting does not.
    waiting.push(spawn("'small'".into()));
    std::thread::sleep(Duration::from_millis(500));
    let r = d.exec("q", "'one too many'");
    assert_eq!(r.status, 429, "{}", r.body);
    assert!(
        r.body.contains("max_queued_cells_per_session"),
        "{}",
        r.body
    );
    // Another session is not held back by this one.
    let r = d.exec("other", "1 + 1");
    assert_eq!(r.status, 200, "{}", r.body);

    assert_eq!(d.call("POST", "/v1/sessions/q/interrupt", "").status, 200);
    assert_eq!(running.join().unwrap().json()["status"], "interrupted");
    for w in waiting {
        let r = w.join().unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.json()["status"], "success", "{}", r.body);
    }
    // Their places came back.
    assert_eq!(d.exec("q", "2").status, 200);
}

#[test]
fn history_rows_keep_head_tail_and_hash_and_pages_are_bounded_by_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(
        &dir.path().join("data"),
        "[history]\nmax_field_bytes = 4096\n",
        "none",
        None,
    );
    let code = format!("x = 1\n# {}\nprint('tail')", "a".repeat(100_000));
    assert_eq!(d.exec("h", &code).status, 200);
    let rows = d.call("GET", "/v1/sessions/h/history", "").json();
    let stored = rows[0]["code"].as_str().unwrap();
    assert!(stored.len() <= 4096, "{} bytes stored", stored.len());
    assert!(stored.starts_with("x = 1\n") && stored.ends_with("print('tail')"));
    let hash = sha256(code.as_bytes());
    assert!(stored.contains(&format!("sha256 {hash}")), "{stored}");

    for i in 0..5 {
        let r = d.exec("p", &format!("print('{i}' * 3000)"));
        assert_eq!(r.status, 200);
    }
    let mut ids = Vec::new();
    let mut path = "/v1/history?max_bytes=8000".to_owned();
    let mut pages = 0;
    loop {
        let r = d.call("GET", &path, "");
        assert_eq!(r.status, 200, "{}", r.body);
        assert!(
            r.body.len() < 8000 + 4096 + 2000,
            "page of {} bytes",
            r.body.len()
        );
        let page: Vec<i64> = r
            .json()
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["id"].as_i64().unwrap())
            .collect();
        assert!(!page.is_empty());
        ids.splice(0..0, page);
        pages += 1;
        match r.header("cellhost-next-before") {
            Some(id) => path = format!("/v1/history?max_bytes=8000&before={id}"),
            None => break,
        }
    }
    assert!(
        pages >= 2,
        "one page held six cells of 3000+ bytes under 8000"
    );
    let mut sorted = ids.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(ids, sorted, "pages overlap or are out of order");
    assert_eq!(ids.len(), 6, "{ids:?}");
}

fn sha256(bytes: &[u8]) -> String {
    let mut c = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(bytes).unwrap();
    let out = c.wait_with_output().unwrap();
    String::from_utf8(out.stdout).unwrap()[..64].to_owned()
}

/// A tmpfs mounted for the test, unmounted even when it fails.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(at).unwrap();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700")])
            .arg("tmpfs")
            .arg(at)
            .status()
            .unwrap();
        assert!(st.success(), "mount tmpfs on {}", at.display());
        Tmpfs(at.to_owned())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(&self.0)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

#[test]
fn a_workspace_on_its_own_filesystem_cannot_fill_the_data_dir() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "loop-mounted workspaces need root"
    );
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let _fs = Tmpfs::mount(&data, "48m");
    let d = Daemon::start(&data, "[limits]\nworkspace_mib = 8\n", "strict", None);
    let fill = "n = 0\ntry:\n    with open('/workspace/fill', 'wb') as f:\n        while True:\n            \
                f.write(b'\\0' * (1 << 20)); f.flush(); n += 1\nexcept OSError as e:\n    print('full', e.errno, n <= 8)";
    let r = d.exec("disk", fill);
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        r.json()["stdout"]
            .as_str()
            .unwrap()
            .contains("full 28 True"),
        "{}",
        r.body
    );
    // The data dir kept room: the history records the next cell.
    let r = d.exec("disk", "print('z' * 40000)");
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.json().get("history").is_none(), "{}", r.body);
    assert_eq!(d.call("GET", "/healthz", "").json()["status"], "ok");
    drop(d);
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let data = data.to_string_lossy().into_owned();
    let nested: Vec<&str> = mounts
        .lines()
        .filter(|l| {
            l.split(' ')
                .nth(4)
                .is_some_and(|m| m.starts_with(&format!("{data}/")))
        })
        .collect();
    assert!(nested.is_empty(), "the daemon left mounts: {nested:?}");
}

#[test]
fn a_full_disk_under_the_history_is_said_in_the_answer_healthz_and_metrics() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: mounting a small tmpfs needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let _fs = Tmpfs::mount(&data, "24m");
    // A workspace not on a filesystem of its own (the upload-only
    // fallback): a cell can fill the data dir's filesystem.
    let d = Daemon::start(&data, "[limits]\nworkspace_fs = false\n", "strict", None);
    let fill = "n = 0\ntry:\n    with open('/workspace/fill', 'wb') as f:\n        while True:\n            \
                f.write(b'\\0' * (1 << 20)); f.flush(); n += 1\nexcept OSError as e:\n    print('full', e.errno, n)";
    let r = d.exec("disk", fill);
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        r.json()["stdout"].as_str().unwrap().contains("full 28"),
        "{}",
        r.body
    );
    let r = d.exec("disk", "print('z' * 40000)");
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["status"], "success");
    let said = format!("history: {}, note: {}", v["history"], v["kernel"]["note"]);
    assert_eq!(v["history"]["recorded"], false, "{said}");
    assert!(
        v["history"]["error"].as_str().unwrap().contains("full"),
        "{said}"
    );
    assert!(v["kernel"]["note"]
        .as_str()
        .unwrap()
        .contains("not in the daemon's history"));
    let h = d.call("GET", "/healthz", "").json();
    assert_eq!(h["status"], "degraded", "{h}");
    assert!(metric(&d, "cellhost_history_write_failures_total") >= 1.0);
    assert_eq!(metric(&d, "cellhost_history_degraded"), 1.0);
    // Freeing the space heals it: the next row commits, health is ok.
    let r = d.exec("disk", "import os; os.remove('/workspace/fill')");
    assert_eq!(r.status, 200, "{}", r.body);
    let r = d.exec("disk", "1");
    assert!(r.json().get("history").is_none(), "{}", r.body);
    assert_eq!(d.call("GET", "/healthz", "").json()["status"], "ok");
    drop(d);
}

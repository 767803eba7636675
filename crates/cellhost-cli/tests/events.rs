//! Live attach: `GET /v1/sessions/{session}/events` of a real `cellhost
//! serve`, read by raw HTTP clients (one never reads), and `cellhost
//! attach` in a real terminal (a pty).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod common;
use common::daemon::Daemon;

const WAIT: Duration = Duration::from_secs(60);

/// One SSE event as it came over the wire.
#[derive(Debug, Clone)]
struct Ev {
    name: String,
    id: Option<u64>,
    data: Value,
}

fn addr(url: &str) -> String {
    url.trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned()
}

fn auth(token: Option<&str>) -> String {
    token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default()
}

/// A watcher: a thread reads the stream and sends each event.
struct Watch {
    rx: mpsc::Receiver<Ev>,
    seen: Vec<Ev>,
}

impl Watch {
    fn open(d: &Daemon, path: &str, token: Option<&str>) -> Watch {
        let mut s = TcpStream::connect(addr(&d.url)).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.0\r\nHost: {}\r\nAccept: text/event-stream\r\n{}\r\n",
            addr(&d.url),
            auth(token)
        )
        .unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(s);
            let mut status = String::new();
            r.read_line(&mut status).unwrap();
            assert!(status.contains(" 200 "), "{status}");
            loop {
                let mut l = String::new();
                if r.read_line(&mut l).unwrap_or(0) == 0 || l == "\r\n" {
                    break;
                }
            }
            let (mut name, mut id, mut data) = (String::new(), None, String::new());
            loop {
                let mut l = String::new();
                if r.read_line(&mut l).unwrap_or(0) == 0 {
                    return;
                }
                let l = l.trim_end_matches(['\r', '\n']);
                if l.is_empty() {
                    if !name.is_empty() {
                        let ev = Ev {
                            name: std::mem::take(&mut name),
                            id: id.take(),
                            data: serde_json::from_str(&data).unwrap(),
                        };
                        if tx.send(ev).is_err() {
                            return;
                        }
                    }
                    data.clear();
                } else if let Some(v) = l.strip_prefix("event: ") {
                    name = v.to_owned();
                } else if let Some(v) = l.strip_prefix("id: ") {
                    id = v.parse().ok();
                } else if let Some(v) = l.strip_prefix("data: ") {
                    data.push_str(v);
                }
            }
        });
        Watch {
            rx,
            seen: Vec::new(),
        }
    }

    /// Events until (and with) the first that `stop` accepts.
    fn until(&mut self, stop: impl Fn(&Ev) -> bool) -> Vec<Ev> {
        let end = Instant::now() + WAIT;
        let mut got = Vec::new();
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let e = self
                .rx
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no such event; got {got:#?}"));
            self.seen.push(e.clone());
            got.push(e.clone());
            if stop(&e) {
                return got;
            }
        }
    }

    fn finished(&mut self) -> Vec<Ev> {
        self.until(|e| e.name == "cell_finished")
    }
}

/// A plain HTTP/1.0 request; the status and the body as JSON.
fn request(
    d: &Daemon,
    method: &str,
    path: &str,
    body: Option<Value>,
    token: Option<&str>,
) -> (u16, Value) {
    let mut s = TcpStream::connect(addr(&d.url)).unwrap();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.0\r\nHost: {}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n{}\r\n{body}",
        addr(&d.url),
        body.len(),
        auth(token)
    )
    .unwrap();
    let mut all = Vec::new();
    s.read_to_end(&mut all).unwrap();
    let text = String::from_utf8_lossy(&all);
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

fn execute(d: &Daemon, session: &str, body: Value) -> Value {
    let (status, v) = request(
        d,
        "POST",
        &format!("/v1/sessions/{session}/execute"),
        Some(body),
        None,
    );
    assert_eq!(status, 200, "{v}");
    v
}

fn names(evs: &[Ev]) -> Vec<&str> {
    evs.iter().map(|e| e.name.as_str()).collect()
}

#[test]
fn a_watcher_of_a_session_not_started_yet_sees_its_cell_start_stream_and_finish_in_order() {
    let data = tempfile::tempdir().unwrap();
    let d = Daemon::none(data.path());
    let mut w = Watch::open(&d, "/v1/sessions/fresh/events", None);
    // Pauses between the outputs: stdout, displays and stderr travel on
    // different pipes, so only outputs apart in time have one order.
    let code = "import sys, time\nprint('one', flush=True)\ntime.sleep(0.3)\ndisplay('shown')\ntime.sleep(0.3)\nprint('warn', file=sys.stderr)\n1/0";
    let answer = execute(&d, "fresh", json!({ "code": code }));
    let mut evs = w.finished();
    assert_eq!(evs.len(), 6, "{evs:#?}");
    assert_eq!(names(&evs[..2]), ["kernel", "cell_started"]);
    assert_eq!(evs[5].name, "cell_finished");
    // stdout, displays and stderr come on different pipes: on a loaded
    // machine the host may read them in another order than written.
    evs[2..5].sort_by_key(|e| {
        ["stdout", "display", "stderr"]
            .iter()
            .position(|n| *n == e.name)
    });
    assert_eq!(
        names(&evs[2..5]),
        ["stdout", "display", "stderr"],
        "{evs:#?}"
    );
    assert_eq!(evs[0].data["change"], "spawned");
    let started = &evs[1].data;
    assert_eq!(started["session"], "fresh");
    assert_eq!(started["execution_count"], 1);
    assert_eq!(started["code"], code);
    assert_eq!(started["front_end"], "http");
    assert!(started["started_at"].as_f64().unwrap() > 1e9);
    assert_eq!(evs[2].data, json!({"execution_count": 1, "text": "one\n"}));
    assert_eq!(evs[3].data["execution_count"], 1);
    assert_eq!(evs[3].data["display"], answer["displays"][0]);
    assert_eq!(evs[3].data["display"]["mime"], "text/plain");
    assert_eq!(evs[4].data, json!({"execution_count": 1, "text": "warn\n"}));
    // The result is the execute route's answer, whole.
    assert_eq!(evs[5].data["result"], answer);
    assert_eq!(evs[5].data["result"]["status"], "error");
    assert!(answer["error"]
        .as_str()
        .unwrap()
        .contains("ZeroDivisionError"));
    // Ids count the session's events one by one.
    let mut ids: Vec<u64> = evs.iter().map(|e| e.id.unwrap()).collect();
    ids.sort_unstable();
    assert_eq!(ids, (1..=6).collect::<Vec<u64>>());
}

#[test]
fn two_watchers_see_the_same_events_and_a_child_has_its_own_stream() {
    let data = tempfile::tempdir().unwrap();
    let d = Daemon::none(data.path());
    let mut a = Watch::open(&d, "/v1/sessions/two/events", None);
    let mut b = Watch::open(&d, "/v1/sessions/two/events", None);
    let mut child = Watch::open(&d, "/v1/sessions/two/children/c1/events", None);
    execute(&d, "two", json!({"code": "print('kid')", "child": "c1"}));
    let c = child.finished();
    assert_eq!(c.last().unwrap().data["result"]["stdout"], "kid\n");
    execute(
        &d,
        "two",
        json!({"code": "for i in range(3): print(i, flush=True)"}),
    );
    let (ea, eb) = (a.finished(), b.finished());
    let key = |evs: &[Ev]| -> Vec<(Option<u64>, String, String)> {
        evs.iter()
            .map(|e| (e.id, e.name.clone(), e.data.to_string()))
            .collect()
    };
    assert_eq!(key(&ea), key(&eb));
    // The parent's watchers never saw the child's cell.
    assert!(
        ea.iter().all(|e| !e.data.to_string().contains("kid")),
        "{ea:#?}"
    );
    let out: String = ea
        .iter()
        .filter(|e| e.name == "stdout")
        .map(|e| e.data["text"].as_str().unwrap())
        .collect();
    assert_eq!(out, "0\n1\n2\n");
}

#[test]
fn a_watcher_that_never_reads_is_dropped_and_the_cell_goes_on() {
    let data = tempfile::tempdir().unwrap();
    let config = data.path().join("cellhost.toml");
    std::fs::write(&config, "[server]\nevents_buffer = 64\n").unwrap();
    let d = Daemon::start(
        &data.path().join("data"),
        &["--sandbox", "none", "--config", config.to_str().unwrap()],
        &[],
    );
    // About 6 MB of events: far more than a socket and a watcher's
    // buffer of 64 hold.
    let code = "for i in range(300): display('x' * 20000)";
    execute(&d, "slow", json!({"code": "x = 1"}));
    let t = Instant::now();
    execute(&d, "slow", json!({ "code": code }));
    let alone = t.elapsed();

    let stalled = TcpStream::connect(addr(&d.url)).unwrap();
    let mut stalled_w = &stalled;
    write!(
        stalled_w,
        "GET /v1/sessions/slow/events HTTP/1.0\r\nHost: {}\r\nAccept: text/event-stream\r\n\r\n",
        addr(&d.url)
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    let answer = execute(&d, "slow", json!({ "code": code }));
    let watched = t.elapsed();
    // Printed, not asserted: timings are noise on a loaded machine.
    eprintln!("cell alone {alone:?}, with a stalled watcher {watched:?}");
    assert_eq!(answer["status"], "success");
    assert_eq!(answer["displays"].as_array().unwrap().len(), 300);

    // Now read what the stalled watcher was sent: the start of the cell,
    // then `dropped`, then the end of the stream.
    let mut all = String::new();
    BufReader::new(&stalled).read_to_string(&mut all).unwrap();
    let last = all
        .split("\n\n")
        .filter(|e| e.contains("event: "))
        .last()
        .unwrap();
    assert!(last.starts_with("event: dropped\n"), "{last}");
    assert!(!last.contains("\nid:"), "{last}");
    let data: Value = serde_json::from_str(last.split("data: ").nth(1).unwrap().trim()).unwrap();
    assert!(data["missed"].as_u64().unwrap() > 0, "{data}");
    assert!(data["reason"].as_str().unwrap().contains("fell behind"));
    assert!(all.contains("event: cell_started"));
    assert!(!all.contains("event: cell_finished"));
    // The session is watched as before by whoever comes next.
    let mut next = Watch::open(&d, "/v1/sessions/slow/events", None);
    execute(&d, "slow", json!({"code": "x + 1"}));
    assert_eq!(next.finished().last().unwrap().data["result"]["value"], "2");
}

#[test]
fn since_replays_the_recorded_cells_then_goes_live() {
    let data = tempfile::tempdir().unwrap();
    let d = Daemon::none(data.path());
    for code in ["x = 1", "x += 1", "print(x)"] {
        execute(&d, "re", json!({ "code": code }));
    }
    let mut w = Watch::open(&d, "/v1/sessions/re/events?since=1", None);
    let replay = w.until(|e| e.name == "cell_finished" && e.data["execution_count"] == 3);
    assert_eq!(
        names(&replay),
        [
            "cell_started",
            "cell_finished",
            "cell_started",
            "cell_finished"
        ]
    );
    assert!(replay
        .iter()
        .all(|e| e.data["replayed"] == true && e.id.is_none()));
    assert_eq!(replay[0].data["code"], "x += 1");
    assert_eq!(replay[0].data["execution_count"], 2);
    assert_eq!(replay[3].data["result"]["stdout"], "2\n");
    assert_eq!(replay[3].data["result"]["status"], "success");
    execute(&d, "re", json!({"code": "x * 10"}));
    let live = w.finished();
    assert_eq!(names(&live), ["cell_started", "cell_finished"]);
    assert_eq!(live[0].data["execution_count"], 4);
    assert!(live[0].data.get("replayed").is_none());
    assert_eq!(live[1].data["result"]["value"], "20");
}

#[test]
fn a_secret_never_reaches_a_watcher_in_code_or_output() {
    const TOKEN: &str = "events-test-token-7f3a9c2e51d84b6a";
    let data = tempfile::tempdir().unwrap();
    let d = Daemon::start(
        data.path(),
        &["--sandbox", "none"],
        &[("CELLHOST_TOKEN", TOKEN)],
    );
    let mut w = Watch::open(&d, "/v1/sessions/sec/events", Some(TOKEN));
    let (a, b) = TOKEN.split_at(10);
    let code = format!("t = {TOKEN:?}\nprint({a:?} + {b:?}, flush=True)");
    let (status, _) = request(
        &d,
        "POST",
        "/v1/sessions/sec/execute",
        Some(json!({ "code": code })),
        Some(TOKEN),
    );
    assert_eq!(status, 200);
    let evs = w.finished();
    let all = format!("{evs:?}");
    assert!(!all.contains(TOKEN), "{all}");
    let started = evs.iter().find(|e| e.name == "cell_started").unwrap();
    assert!(started.data["code"].as_str().unwrap().contains("[REDACTED"));
    let out = evs.iter().find(|e| e.name == "stdout").unwrap();
    assert_eq!(out.data["text"], "[REDACTED:secret]\n");
    // And without the token nobody watches.
    let (status, _) = request(&d, "GET", "/v1/sessions/sec/events", None, None);
    assert_eq!(status, 401);
}

#[test]
fn a_reset_and_a_disposal_are_told_as_kernel_events() {
    let data = tempfile::tempdir().unwrap();
    let d = Daemon::none(data.path());
    let mut w = Watch::open(&d, "/v1/sessions/k/events", None);
    execute(&d, "k", json!({"code": "x = 1"}));
    w.finished();
    execute(&d, "k", json!({"code": "x = 2", "reset": true}));
    let evs = w.finished();
    assert_eq!(names(&evs), ["kernel", "cell_started", "cell_finished"]);
    assert_eq!(evs[0].data["change"], "reset");
    assert!(evs[0].data["note"].as_str().unwrap().contains("reset"));
    assert_eq!(evs[1].data["execution_count"], 1);
    assert_eq!(evs[2].data["result"]["kernel"]["state_reset"], true);
    let (status, _) = request(&d, "DELETE", "/v1/sessions/k", None, None);
    assert_eq!(status, 200);
    let evs = w.until(|e| e.name == "kernel");
    assert_eq!(evs.len(), 1);
    assert_eq!(evs[0].data["change"], "disposed");
    // A cell that ends its kernel is told as `died`, before its result.
    execute(&d, "k", json!({"code": "import sys; sys.exit(3)"}));
    let evs = w.finished();
    let died = evs
        .iter()
        .position(|e| e.name == "kernel" && e.data["change"] == "died");
    assert!(died.is_some(), "{evs:#?}");
}

/// A pty whose slave is the controlling terminal of `cellhost attach`.
struct Pty {
    master: std::fs::File,
    child: std::process::Child,
}

impl Pty {
    fn attach(d: &Daemon, session: &str) -> (Pty, mpsc::Receiver<u8>) {
        use std::os::fd::FromRawFd;
        use std::os::unix::process::CommandExt;
        let (mut m, mut s) = (0, 0);
        // SAFETY: openpty writes two fds into the given ints.
        let rc = unsafe {
            libc::openpty(
                &mut m,
                &mut s,
                std::ptr::null_mut(),
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        assert_eq!(rc, 0);
        // SAFETY: fresh fds owned by nobody else.
        let (master, slave) =
            unsafe { (std::fs::File::from_raw_fd(m), std::fs::File::from_raw_fd(s)) };
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_cellhost"));
        cmd.args(["attach", "-s", session])
            .env("CELLHOST_URL", &d.url)
            .env_remove("CELLHOST_TOKEN")
            .stdin(slave.try_clone().unwrap())
            .stdout(slave.try_clone().unwrap())
            .stderr(slave);
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().unwrap();
        let (tx, rx) = mpsc::channel();
        let mut reader = master.try_clone().unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                for b in &buf[..n] {
                    if tx.send(*b).is_err() {
                        return;
                    }
                }
            }
        });
        (Pty { master, child }, rx)
    }
}

/// Terminal text until it contains `want`.
fn read_until(rx: &mpsc::Receiver<u8>, screen: &mut String, want: &str) {
    let end = Instant::now() + WAIT;
    let mut bytes = Vec::new();
    while !screen.contains(want) {
        let left = end.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(b) => {
                bytes.push(b);
                if let Ok(t) = std::str::from_utf8(&bytes) {
                    screen.push_str(t);
                    bytes.clear();
                }
            }
            Err(_) => panic!("no {want:?} on the terminal; it shows:\n{screen}"),
        }
    }
}

#[test]
fn attach_in_a_terminal_shows_cells_live_and_ctrl_c_detaches_without_interrupting() {
    let data = tempfile::tempdir().unwrap();
    let d = Daemon::none(data.path());
    let (mut pty, rx) = Pty::attach(&d, "tty");
    let mut screen = String::new();
    read_until(&rx, &mut screen, "attached to session tty");
    execute(&d, "tty", json!({"code": "y = 6\ny * 7"}));
    read_until(&rx, &mut screen, "Out[1]: 42");
    assert!(
        screen.contains("In [1]: y = 6\r\n   ...: y * 7\r\n"),
        "{screen}"
    );
    execute(&d, "tty", json!({"code": "1/0"}));
    read_until(&rx, &mut screen, "[error]");
    assert!(
        screen.contains("ZeroDivisionError: division by zero"),
        "{screen}"
    );

    // A long cell from another client: its first line appears while it
    // runs; Ctrl-C on the terminal detaches and the cell runs on.
    let url = d.url.clone();
    let long = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr(&url)).unwrap();
        let body = json!({"code": "import time\nprint('begun', flush=True)\ntime.sleep(2)\nprint('done')"}).to_string();
        write!(
            s,
            "POST /v1/sessions/tty/execute HTTP/1.0\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            addr(&url),
            body.len()
        )
        .unwrap();
        let mut all = String::new();
        s.read_to_string(&mut all).unwrap();
        serde_json::from_str::<Value>(all.split_once("\r\n\r\n").unwrap().1).unwrap()
    });
    read_until(&rx, &mut screen, "begun");
    pty.master.write_all(b"\x03").unwrap();
    read_until(&rx, &mut screen, "detached from session tty");
    let status = pty.child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{screen}");
    let r = long.join().unwrap();
    assert_eq!(r["status"], "success", "{r}");
    assert_eq!(r["stdout"], "begun\ndone\n");
}

//! The dashboard in headless Chromium (through chromedriver's WebDriver
//! HTTP API) against a real daemon: the page loads offline from the
//! binary, a cell run through the API shows up without a reload, and a
//! screenshot is saved under target/tmp/.
//!
//! Needs Debian's `chromium` and `chromium-driver` (scripts/test installs
//! them). Without them the test fails and says so: it is never skipped.

use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};

const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let end = Instant::now() + Duration::from_secs(20);
        while Instant::now() < end && matches!(self.0.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A child leading its own process group: the group dies with it.
struct Group(Child);

impl Drop for Group {
    fn drop(&mut self) {
        let group = nix::unistd::Pid::from_raw(-(self.0.id() as i32));
        let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL);
        let _ = self.0.wait();
    }
}

fn start_daemon(data: &std::path::Path) -> (Killed, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_cellhost"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--sandbox",
            "none",
            "--data-dir",
        ])
        .arg(data)
        .env_remove("CELLHOST_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let url = loop {
        let mut line = String::new();
        assert!(out.read_line(&mut line).unwrap() > 0, "serve exited early");
        if let Some(rest) = line.split("listening on ").nth(1) {
            break rest.split_whitespace().next().unwrap().to_owned();
        }
    };
    std::thread::spawn(move || {
        let mut sink = String::new();
        let _ = out.read_to_string(&mut sink);
    });
    (Killed(child), url)
}

struct Driver {
    client: Client<HttpConnector, Full<Bytes>>,
    base: String,
    session: String,
}

impl Driver {
    async fn call(&self, method: &str, path: &str, body: Value) -> Value {
        let req = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(Full::new(if body.is_null() {
                Bytes::new()
            } else {
                Bytes::from(body.to_string())
            }))
            .unwrap();
        let resp = self.client.request(req).await.unwrap();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        if let Some(err) = v["value"].get("error") {
            panic!("webdriver {path}: {err}: {}", v["value"]["message"]);
        }
        v["value"].clone()
    }

    async fn script(&self, js: &str) -> Value {
        let path = format!("/session/{}/execute/sync", self.session);
        self.call("POST", &path, json!({"script": js, "args": []}))
            .await
    }

    async fn page_text(&self) -> String {
        self.script("return document.body.innerText")
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// Wait (up to a generous deadline) until the page text satisfies `ok`.
    async fn wait_for(&self, what: &str, ok: impl Fn(&str) -> bool) -> String {
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            let text = self.page_text().await;
            if ok(&text) {
                return text;
            }
            assert!(
                Instant::now() < end,
                "the page never showed {what}:\n{text}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn the_dashboard_shows_a_cell_run_through_the_api_live_in_headless_chromium() {
    for (bin, pkg) in [(CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")] {
        assert!(
            std::path::Path::new(bin).exists(),
            "{bin} is missing: install it (apt-get install -y {pkg}; scripts/test does this) to run the dashboard browser test"
        );
    }
    let data = tempfile::tempdir().unwrap();
    let (_daemon, url) = start_daemon(data.path());
    let port = free_port();
    // chromedriver and the browser it starts share a new process group,
    // killed whole when the test ends, even by a panic.
    let _driver = Group(
        Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let client = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let mut d = Driver {
        client,
        base: format!("http://127.0.0.1:{port}"),
        session: String::new(),
    };
    // chromedriver takes a moment to listen.
    let end = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < end, "chromedriver did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let profile = tempfile::tempdir().unwrap();
    let caps = json!({"capabilities": {"alwaysMatch": {
        "browserName": "chrome",
        "goog:chromeOptions": {
            "binary": CHROMIUM,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,900", format!("--user-data-dir={}", profile.path().display())]
        }
    }}});
    let created = d.call("POST", "/session", caps).await;
    d.session = created["sessionId"].as_str().unwrap().to_owned();

    d.call(
        "POST",
        &format!("/session/{}/url", d.session),
        json!({"url": format!("{url}/")}),
    )
    .await;
    d.wait_for("the empty state", |t| {
        t.contains("No live kernels") && t.contains("live · updated")
    })
    .await;

    // A cell through the API; the open page picks it up on its own.
    let o = Command::new(env!("CARGO_BIN_EXE_cellhost"))
        .args([
            "exec",
            "-s",
            "dash-session",
            "greeting = 'hello from the browser test'\nprint(greeting)",
        ])
        .env("CELLHOST_URL", &url)
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let text = d
        .wait_for("the cell", |t| {
            t.contains("hello from the browser test") && t.contains("dash-session")
        })
        .await;
    assert!(
        text.contains("greeting = 'hello from the browser test'"),
        "{text}"
    );
    let rows = d
        .script(
            "return [...document.querySelectorAll('#kernels tbody tr')].map(r => r.dataset.owner)",
        )
        .await;
    assert_eq!(rows, json!(["dash-session"]));
    let state = d
        .script("return document.querySelector('#kernels tbody tr td:nth-child(2)').innerText")
        .await;
    assert_eq!(state, json!("idle"));

    let png = d
        .call(
            "GET",
            &format!("/session/{}/screenshot", d.session),
            Value::Null,
        )
        .await;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(png.as_str().unwrap())
        .unwrap();
    assert!(bytes.starts_with(b"\x89PNG"), "a PNG screenshot");
    let shot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard.png");
    std::fs::write(&shot, &bytes).unwrap();
    eprintln!("dashboard screenshot: {}", shot.display());
    d.call("DELETE", &format!("/session/{}", d.session), Value::Null)
        .await;
}

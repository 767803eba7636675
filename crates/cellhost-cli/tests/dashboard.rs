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

impl Driver {
    /// Wait until the script `js` (a function body) returns something
    /// truthy; that value.
    async fn wait_js(&self, what: &str, js: &str) -> Value {
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            let v = self.script(js).await;
            if !(v.is_null() || v == json!(false) || v == json!(0) || v == json!("")) {
                return v;
            }
            assert!(
                Instant::now() < end,
                "the page never showed {what}:\n{}",
                self.page_text().await
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn open(&self, url: &str) {
        self.call(
            "POST",
            &format!("/session/{}/url", self.session),
            json!({ "url": url }),
        )
        .await;
    }

    /// A screenshot, checked to be a PNG and saved under target/tmp/.
    async fn screenshot(&self, name: &str) -> std::path::PathBuf {
        let png = self
            .call(
                "GET",
                &format!("/session/{}/screenshot", self.session),
                Value::Null,
            )
            .await;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().unwrap())
            .unwrap();
        assert!(
            bytes.starts_with(b"\x89PNG") && bytes.len() > 1000,
            "a PNG screenshot"
        );
        let shot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
        std::fs::write(&shot, &bytes).unwrap();
        assert!(std::fs::metadata(&shot).unwrap().len() > 1000);
        eprintln!("dashboard screenshot: {}", shot.display());
        shot
    }
}

/// One request to the daemon: status, headers, body.
async fn http(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, hyper::HeaderMap, Vec<u8>) {
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let mut req = hyper::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = client
        .request(req.body(Full::new(Bytes::from(body.to_owned()))).unwrap())
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    (status, headers, bytes)
}

/// Run a cell through the API (JSON), its result.
async fn execute(url: &str, session: &str, code: &str) -> Value {
    let (status, _, body) = http(
        "POST",
        &format!("{url}/v1/sessions/{session}/execute"),
        &[("content-type", "application/json")],
        &json!({ "code": code }).to_string(),
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    serde_json::from_slice(&body).unwrap()
}

/// The JSON-RPC answer in an MCP response (plain JSON or SSE `data:`).
fn mcp_answer(body: &[u8]) -> Value {
    let text = String::from_utf8_lossy(body);
    if let Ok(v) = serde_json::from_str::<Value>(&text) {
        return v;
    }
    text.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .find(|v| v.get("id").is_some())
        .unwrap_or_else(|| panic!("no JSON-RPC answer in {text}"))
}

/// A cell run over `/mcp` by a client that calls itself `client`: its
/// MCP session id.
async fn mcp_cell(url: &str, client: &str, code: &str) -> String {
    let mcp = format!("{url}/mcp");
    let accept = ("accept", "application/json, text/event-stream");
    let json_ct = ("content-type", "application/json");
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-03-26", "capabilities": {},
        "clientInfo": {"name": client, "version": "1.0"}}});
    let (status, headers, body) = http("POST", &mcp, &[accept, json_ct], &init.to_string()).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let sid = headers["mcp-session-id"].to_str().unwrap().to_owned();
    let proto = mcp_answer(&body)["result"]["protocolVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    let h = [
        accept,
        json_ct,
        ("mcp-session-id", sid.as_str()),
        ("mcp-protocol-version", proto.as_str()),
    ];
    let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let (status, _, _) = http("POST", &mcp, &h, &note.to_string()).await;
    assert!(status < 300, "initialized: {status}");
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "execute_code", "arguments": {"code": code}}});
    let (status, _, body) = http("POST", &mcp, &h, &call.to_string()).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let answer = mcp_answer(&body);
    assert_eq!(answer["result"]["isError"], json!(false), "{answer}");
    sid
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// chromedriver (and the headless Chromium it starts, one process group
/// killed whole when the test ends, even by a panic) with a WebDriver
/// session open.
async fn browser() -> (Group, Driver, tempfile::TempDir) {
    for (bin, pkg) in [(CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")] {
        assert!(
            std::path::Path::new(bin).exists(),
            "{bin} is missing: install it (apt-get install -y {pkg}; scripts/test does this) to run the dashboard browser test"
        );
    }
    let port = free_port();
    let driver = Group(
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
    (driver, d, profile)
}

#[tokio::test]
async fn the_dashboard_shows_a_cell_run_through_the_api_live_in_headless_chromium() {
    let data = tempfile::tempdir().unwrap();
    let (_daemon, url) = start_daemon(data.path());
    let (_driver, d, _profile) = browser().await;

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

/// A 1×1 PNG.
const PNG_B64: &str =
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";

/// Markup a cell could plant anywhere the page shows its bytes: each sets
/// `window.__xss` (or the parent's) if it ever runs.
const XSS: &str =
    "<img src=x onerror=\"window.__xss='img'\"><script>window.__xss='script'</script>";

#[tokio::test]
async fn a_session_page_shows_its_timeline_files_and_live_output_inertly_in_headless_chromium() {
    let data = tempfile::tempdir().unwrap();
    let (_daemon, url) = start_daemon(data.path());
    let s = "dash-s";

    // Every answer refuses to be framed: the page, its assets, the API,
    // an error, a file.
    for path in ["/", "/assets/app.js", "/v1/kernels", "/v1/nothing-here"] {
        let (_, h, _) = http("GET", &format!("{url}{path}"), &[], "").await;
        assert_eq!(h["x-frame-options"], "DENY", "{path}");
        let csp = h["content-security-policy"].to_str().unwrap();
        assert!(csp.contains("frame-ancestors 'none'"), "{path}: {csp}");
    }
    let (_, h, _) = http("GET", &format!("{url}/"), &[], "").await;
    let csp = h["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe-eval"),
        "{csp}"
    );

    // The cells: a long output, an image display, an HTML display and
    // output, code and a file name that try to run script, an error.
    execute(&url, s, "for i in range(100):\n    print(f'line {i}')").await;
    execute(
        &url,
        s,
        &format!("display({{'image/png': '{PNG_B64}', 'text/plain': '<Figure 1x1>'}}, raw=True)"),
    )
    .await;
    let html = "<b id='in-frame'>bold html</b><script>parent.__xss='frame'</script>\
                <img src=x onerror=\"parent.__xss='frame-img'\">";
    execute(
        &url,
        s,
        &format!("display({{'text/html': {html:?}}}, raw=True)"),
    )
    .await;
    execute(&url, s, &format!("# {XSS}\nprint({XSS:?})")).await;
    execute(
        &url,
        s,
        &format!(
            "import base64\nopen('chart.png', 'wb').write(base64.b64decode('{PNG_B64}'))\n\
             open({name:?}, 'w').write('planted')\nopen('report.csv', 'w').write('a,b\\n1,2\\n')",
            name = format!("{XSS}.txt").replace('/', "")
        ),
    )
    .await;
    let failed = execute(&url, s, "1/0").await;
    assert_eq!(failed["status"], "error");
    // Another session, for the search box.
    execute(&url, "other-session", "x = 1").await;
    // An MCP client's session, named by its clientInfo.
    let sid = mcp_cell(&url, "inspector-test", "print('from mcp')").await;
    let (_, _, kernels) = http("GET", &format!("{url}/v1/kernels"), &[], "").await;
    let kernels: Value = serde_json::from_slice(&kernels).unwrap();
    let mcp_kernel = kernels
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["owner"] == json!(sid))
        .unwrap_or_else(|| panic!("no kernel of {sid}: {kernels}"));
    assert_eq!(mcp_kernel["client"], "inspector-test");
    let (_, _, rows) = http("GET", &format!("{url}/v1/sessions/{sid}/history"), &[], "").await;
    let rows: Value = serde_json::from_slice(&rows).unwrap();
    assert_eq!(rows[0]["client"], "inspector-test", "{rows}");
    let (_, _, rows) = http("GET", &format!("{url}/v1/sessions/{s}/history"), &[], "").await;
    let rows: Value = serde_json::from_slice(&rows).unwrap();
    assert_eq!(rows[1]["displays"][0]["mime"], "image/png", "{rows}");
    assert!(
        rows[1].get("client").is_none(),
        "an HTTP cell names no client"
    );

    let (_driver, d, _profile) = browser().await;

    // The overview: sessions by name, the MCP one by its client; the
    // search box narrows them.
    d.open(&format!("{url}/")).await;
    let short = &sid[..8];
    d.wait_for("the MCP session by its client's name", |t| {
        t.contains(&format!("inspector-test · {short}")) && t.contains("other-session")
    })
    .await;
    d.script(
        "const i = document.querySelector('#search'); i.value = 'dash';\
         i.dispatchEvent(new Event('input')); return 1",
    )
    .await;
    d.wait_js(
        "only the matching session",
        "const owners = [...document.querySelectorAll('#kernels tbody tr')].map(r => r.dataset.owner);\
         return owners.length === 1 && owners[0] === 'dash-s'",
    )
    .await;
    let groups = d
        .script("return [...document.querySelectorAll('#sessions .session')].map(g => g.dataset.session)")
        .await;
    assert_eq!(groups, json!(["dash-s"]));

    // The session's page.
    d.open(&format!("{url}/#/session/{s}")).await;
    d.wait_js(
        "the timeline and the files",
        "return document.querySelectorAll('#timeline .cell').length >= 6 && \
         document.querySelectorAll('#files tbody tr').length >= 3",
    )
    .await;

    // A long output is collapsed to 40 lines until "show all".
    let collapsed = d
        .script(
            "const p = document.querySelector('#timeline pre[data-collapsed=\"true\"]');\
             return p ? p.textContent.split('\\n').length : null",
        )
        .await;
    assert_eq!(collapsed, json!(40));
    let shown = d
        .script(
            "const b = document.querySelector('#timeline .show-all');\
             const p = b.parentElement.querySelector('pre'); b.click();\
             return [p.dataset.collapsed, p.textContent.split('\\n').length,\
                     p.textContent.includes('line 99'), !!document.querySelector('#timeline .show-all')]",
        )
        .await;
    assert_eq!(shown, json!(["false", 101, true, false]));

    // The image display, drawn.
    d.wait_js(
        "the image display decoded",
        "const i = document.querySelector('#timeline img.display-image');\
         return i && i.complete && i.naturalWidth === 1 && i.src.startsWith('data:image/png;base64,')",
    )
    .await;

    // The HTML display in an iframe sandboxed without scripts or
    // same-origin: drawn, but the page cannot reach into it nor it out.
    let frame = d
        .script(
            "const f = document.querySelector('#timeline iframe.display-html');\
             return f && [f.getAttribute('sandbox'), f.contentDocument === null, f.srcdoc.includes('bold html')]",
        )
        .await;
    assert_eq!(frame, json!(["", true, true]));

    // Every XSS attempt is text on the page, never markup that ran.
    let text = d.page_text().await;
    assert!(
        text.contains(XSS),
        "the output and code shown as text:\n{text}"
    );
    assert!(text.contains("ZeroDivisionError"), "{text}");
    let inert = d
        .script(
            "return [typeof window.__xss, document.querySelectorAll('img[src=\"x\"]').length,\
                     document.querySelectorAll('script').length]",
        )
        .await;
    assert_eq!(inert, json!(["undefined", 0, 1]), "nothing a cell sent ran");

    // The files: listed, downloadable byte for byte, the image inline.
    let files = d
        .script("return [...document.querySelectorAll('#files tbody tr')].map(r => r.dataset.path).sort()")
        .await;
    let planted = format!("{XSS}.txt").replace('/', "");
    let mut want = vec![
        "chart.png".to_owned(),
        "report.csv".to_owned(),
        planted.clone(),
    ];
    want.sort();
    let files: Vec<String> = serde_json::from_value(files).unwrap();
    assert!(
        want.iter().all(|w| files.contains(w)),
        "{files:?} has {want:?}"
    );
    let link = d
        .script(
            "const a = [...document.querySelectorAll('#files a.file-link')].find(a => a.textContent === 'report.csv');\
             return [a.getAttribute('download'), a.getAttribute('href')]",
        )
        .await;
    assert_eq!(link[0], "report.csv");
    let (status, _, body) = http(
        "GET",
        &format!("{url}{}", link[1].as_str().unwrap()),
        &[],
        "",
    )
    .await;
    assert_eq!((status, body.as_slice()), (200, b"a,b\n1,2\n".as_slice()));
    let fetched = d
        .wait_js(
            "the download link fetched by the page",
            "const a = [...document.querySelectorAll('#files a.file-link')].find(a => a.textContent === 'report.csv');\
             if (!window.__got) { window.__got = 'pending';\
               fetch(a.href).then(r => r.text()).then(t => { window.__got = t; }); }\
             return window.__got !== 'pending' && window.__got",
        )
        .await;
    assert_eq!(fetched, json!("a,b\n1,2\n"));
    d.wait_js(
        "the image file inline",
        "const i = [...document.querySelectorAll('#file-images img')].find(i => i.alt === 'chart.png');\
         return i && i.complete && i.naturalWidth === 1",
    )
    .await;
    let inert = d
        .script("return [typeof window.__xss, document.querySelectorAll('img[src=\"x\"]').length]")
        .await;
    assert_eq!(
        inert,
        json!(["undefined", 0]),
        "the planted file name is text"
    );

    // Live: a cell's output appears while it runs, from the events stream.
    d.wait_for("the events stream", |t| t.contains("live"))
        .await;
    let live_url = url.clone();
    let running = tokio::spawn(async move {
        execute(
            &live_url,
            "dash-s",
            "import time\nfor i in range(40):\n    print('tick', i, flush=True)\n    time.sleep(0.25)",
        )
        .await
    });
    let seen = d
        .wait_js(
            "the running cell's output",
            "const r = document.querySelector('#timeline .cell.running');\
             return r && r.textContent.includes('tick 3') && r.textContent",
        )
        .await;
    assert!(
        !running.is_finished(),
        "the output showed while the cell ran: {seen}"
    );
    assert!(
        seen.as_str().unwrap().contains("for i in range(40)"),
        "{seen}"
    );
    d.screenshot("dashboard-session.png").await;

    // Interrupt from the page: the running cell stops as interrupted.
    d.wait_js(
        "the interrupt button enabled",
        "return !document.querySelector('#interrupt').disabled",
    )
    .await;
    d.script("document.querySelector('#interrupt').click(); return 1")
        .await;
    let result = tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .expect("the interrupt ended the cell")
        .unwrap();
    assert_eq!(result["status"], "interrupted", "{result}");
    d.wait_js(
        "the interrupted cell in the timeline",
        "return !document.querySelector('#timeline .cell.running') && \
         !!document.querySelector('#timeline .cell.interrupted')",
    )
    .await;

    // Reset from the page: the kernel goes.
    d.script("document.querySelector('#reset').click(); return 1")
        .await;
    d.wait_js(
        "no live kernel",
        "return document.querySelector('#session-state').textContent.includes('no live kernel')",
    )
    .await;
    let (_, _, kernels) = http("GET", &format!("{url}/v1/kernels"), &[], "").await;
    let kernels: Value = serde_json::from_slice(&kernels).unwrap();
    assert!(
        kernels
            .as_array()
            .unwrap()
            .iter()
            .all(|k| k["owner"] != json!(s)),
        "{kernels}"
    );
    d.call("DELETE", &format!("/session/{}", d.session), Value::Null)
        .await;
}

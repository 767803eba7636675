//! The `/mcp` (streamable HTTP) half of the MCP benchmark: a real
//! `cellhost serve` child, one MCP session over one keep-alive connection
//! from a lean blocking client (the request's bytes written as they are,
//! the answer read to its end: `content-length`, or the last chunk of a
//! chunked SSE body), and the same cell over `/v1/.../execute` on the same
//! daemon, so `/mcp − /v1` is MCP's own cost over HTTP.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

/// A `cellhost serve` child, killed when dropped.
pub struct Daemon {
    child: Child,
    pub addr: SocketAddr,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Daemon {
    pub fn start(cellhost: &Path, python: &Path, data: &Path) -> Result<Daemon> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
        let child = Command::new(cellhost)
            .args(["serve", "--sandbox", "none", "--listen"])
            .arg(addr.to_string())
            .arg("--python")
            .arg(python)
            .arg("--data-dir")
            .arg(data)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {} serve", cellhost.display()))?;
        let d = Daemon { child, addr };
        let t0 = Instant::now();
        while TcpStream::connect(addr).is_err() {
            if t0.elapsed() > Duration::from_secs(20) {
                bail!("cellhost serve did not listen on {addr} within 20 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(d)
    }
}

/// One keep-alive connection speaking plain HTTP/1.1.
pub struct Lean {
    s: TcpStream,
    buf: Vec<u8>,
    session: Option<String>,
}

/// A whole answer: its head (lower-cased) and its body (de-chunked).
struct Answer {
    head: String,
    body: Vec<u8>,
}

impl Lean {
    pub fn connect(addr: SocketAddr) -> Result<Lean> {
        let s = TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        Ok(Lean {
            s,
            buf: Vec::with_capacity(8192),
            session: None,
        })
    }

    /// POST `body`; `/mcp` is sent the MCP headers (its clients accept
    /// SSE, which `/v1` would answer with an event stream).
    fn post(&mut self, path: &str, body: &[u8]) -> Result<Answer> {
        let accept = if path == "/mcp" {
            "application/json, text/event-stream"
        } else {
            "application/json"
        };
        let mut req = format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Accept: {accept}\r\nContent-Length: {}\r\n",
            body.len()
        );
        if let Some(sid) = self.session.as_ref().filter(|_| path == "/mcp") {
            req.push_str(&format!(
                "Mcp-Session-Id: {sid}\r\nMcp-Protocol-Version: 2025-06-18\r\n"
            ));
        }
        req.push_str("\r\n");
        let mut bytes = req.into_bytes();
        bytes.extend_from_slice(body);
        self.s.write_all(&bytes)?;
        self.buf.clear();
        let mut chunk = [0u8; 16 * 1024];
        loop {
            if let Some(a) = whole(&self.buf)? {
                return Ok(a);
            }
            let n = self.s.read(&mut chunk)?;
            if n == 0 {
                bail!("the daemon closed the connection");
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// `initialize` and `notifications/initialized`: an MCP session.
    pub fn initialize(&mut self) -> Result<()> {
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "cellhost-bench-mcp", "version": "1"}}});
        let a = self.post("/mcp", init.to_string().as_bytes())?;
        let sid = a
            .head
            .lines()
            .find_map(|l| l.strip_prefix("mcp-session-id:"))
            .context("initialize answered without an Mcp-Session-Id")?
            .trim()
            .to_owned();
        jsonrpc_result(&a.body).context("initialize")?;
        self.session = Some(sid);
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let a = self.post("/mcp", note.to_string().as_bytes())?;
        if !a.head.starts_with("http/1.1 202") && !a.head.starts_with("http/1.1 200") {
            bail!(
                "notifications/initialized: {}",
                a.head.lines().next().unwrap_or("")
            );
        }
        Ok(())
    }

    /// `tools/call` of `tool`, checked not to be an error.
    pub fn call(&mut self, id: u64, tool: &str, args: &Value) -> Result<()> {
        let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": tool, "arguments": args}});
        let a = self.post("/mcp", call.to_string().as_bytes())?;
        let r = jsonrpc_result(&a.body).with_context(|| format!("tools/call {tool}"))?;
        if r["isError"] == json!(true) {
            bail!("{tool} failed: {r}");
        }
        Ok(())
    }

    /// `x=1` through `POST /v1/sessions/{session}/execute`.
    pub fn execute(&mut self, session: &str) -> Result<()> {
        let a = self.post(
            &format!("/v1/sessions/{session}/execute"),
            br#"{"code":"x=1"}"#,
        )?;
        if !a.head.starts_with("http/1.1 200") || !a.body.starts_with(br#"{"status":"success""#) {
            bail!("execute: {}", String::from_utf8_lossy(&a.body));
        }
        Ok(())
    }
}

/// The `result` of the JSON-RPC answer in `body` (plain JSON, or the SSE
/// `data:` line that carries it).
fn jsonrpc_result(body: &[u8]) -> Result<Value> {
    let text = std::str::from_utf8(body)?;
    let answer = serde_json::from_str::<Value>(text).ok().or_else(|| {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .find(|v| v.get("id").is_some())
    });
    match answer {
        Some(v) if v.get("result").is_some() => Ok(v["result"].clone()),
        Some(v) => bail!("a JSON-RPC error: {v}"),
        None => bail!("no JSON-RPC answer in {text:?}"),
    }
}

/// The answer in `buf` once it is whole.
fn whole(buf: &[u8]) -> Result<Option<Answer>> {
    let Some(h) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Ok(None);
    };
    let head = std::str::from_utf8(&buf[..h])?.to_ascii_lowercase();
    let rest = &buf[h + 4..];
    if let Some(len) = head.lines().find_map(|l| l.strip_prefix("content-length:")) {
        let len: usize = len.trim().parse()?;
        return Ok((rest.len() >= len).then(|| Answer {
            body: rest[..len].to_vec(),
            head,
        }));
    }
    if !head.contains("transfer-encoding: chunked") {
        bail!("an answer with neither a length nor chunks: {head}");
    }
    let (mut body, mut at) = (Vec::new(), 0);
    loop {
        let Some(eol) = rest[at..].windows(2).position(|w| w == b"\r\n") else {
            return Ok(None);
        };
        let size = std::str::from_utf8(&rest[at..at + eol])?;
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
            .with_context(|| format!("a bad chunk size {size:?}"))?;
        let start = at + eol + 2;
        if rest.len() < start + size + 2 {
            return Ok(None);
        }
        if size == 0 {
            return Ok(Some(Answer { head, body }));
        }
        body.extend_from_slice(&rest[start..start + size]);
        at = start + size + 2;
    }
}

//! A blocking HTTP/1.1 client for one keep-alive connection to the
//! daemon: small, dependency-free, and honest about what happened to a
//! request (never sent, or sent and then the connection broke).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde_json::Value;

/// How a request ended without an answer.
#[derive(Debug)]
pub enum Failure {
    /// Nothing reached the server (no connection): the request did not run.
    NotSent(String),
    /// The request was written but no whole answer came back: it may or
    /// may not have run.
    NoAnswer(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::NotSent(e) => write!(f, "not sent: {e}"),
            Failure::NoAnswer(e) => write!(f, "sent, no answer: {e}"),
        }
    }
}

/// One connection, reopened on demand.
pub struct Conn {
    addr: SocketAddr,
    stream: Option<TcpStream>,
    buf: Vec<u8>,
    timeout: Duration,
}

impl Conn {
    /// A client for `addr`; `timeout` bounds each read (a cell's whole run).
    /// Close the connection (the next request opens a new one), so a
    /// quiet checkpoint sees no client connections in the daemon's fds.
    pub fn disconnect(&mut self) {
        self.stream = None;
    }

    pub fn new(addr: SocketAddr, timeout: Duration) -> Conn {
        Conn {
            addr,
            stream: None,
            buf: Vec::with_capacity(16 * 1024),
            timeout,
        }
    }

    pub fn post(&mut self, path: &str, body: &Value) -> Result<(u16, Value), Failure> {
        self.request("POST", path, Some(body.to_string().as_bytes()))
    }

    pub fn get(&mut self, path: &str) -> Result<(u16, Value), Failure> {
        self.request("GET", path, None)
    }

    pub fn delete(&mut self, path: &str) -> Result<(u16, Value), Failure> {
        self.request("DELETE", path, None)
    }

    /// Send raw `body` (any bytes) with a JSON content type.
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<(u16, Value), Failure> {
        let (status, raw) = self.request_raw(method, path, body)?;
        let v = serde_json::from_slice(&raw)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&raw).into_owned()));
        Ok((status, v))
    }

    /// The status and the raw body.
    pub fn request_raw(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<(u16, Vec<u8>), Failure> {
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\n");
        if let Some(b) = body {
            req.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                b.len()
            ));
        }
        req.push_str("\r\n");
        let mut bytes = req.into_bytes();
        bytes.extend_from_slice(body.unwrap_or_default());
        let stream = match self.stream.take() {
            Some(s) => s,
            None => self.connect()?,
        };
        let r = self.exchange(stream, &bytes);
        if let Err(Failure::NoAnswer(_)) = &r {
            self.stream = None;
        }
        r
    }

    fn connect(&self) -> Result<TcpStream, Failure> {
        let s = TcpStream::connect_timeout(&self.addr, Duration::from_secs(2))
            .map_err(|e| Failure::NotSent(e.to_string()))?;
        let _ = s.set_nodelay(true);
        let _ = s.set_read_timeout(Some(self.timeout));
        Ok(s)
    }

    fn exchange(&mut self, mut s: TcpStream, req: &[u8]) -> Result<(u16, Vec<u8>), Failure> {
        let lost = |e: std::io::Error| Failure::NoAnswer(e.to_string());
        if let Err(e) = s.write_all(req) {
            // A kept-alive connection the server closed while idle fails
            // here with nothing delivered: retry once on a new one.
            s = self.connect()?;
            s.write_all(req)
                .map_err(|e2| Failure::NoAnswer(format!("{e}; then {e2}")))?;
        }
        self.buf.clear();
        let mut chunk = [0u8; 64 * 1024];
        loop {
            let n = s.read(&mut chunk).map_err(lost)?;
            if n == 0 {
                return Err(Failure::NoAnswer("the server closed the connection".into()));
            }
            self.buf.extend_from_slice(&chunk[..n]);
            let Some(h) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                continue;
            };
            let head = String::from_utf8_lossy(&self.buf[..h]).to_ascii_lowercase();
            let status: u16 = head
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| Failure::NoAnswer(format!("bad status line: {head}")))?;
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .ok_or_else(|| Failure::NoAnswer(format!("no content-length: {head}")))?;
            if self.buf.len() < h + 4 + len {
                continue;
            }
            let body = self.buf[h + 4..h + 4 + len].to_vec();
            if !head.contains("connection: close") {
                self.stream = Some(s);
            }
            return Ok((status, body));
        }
    }
}

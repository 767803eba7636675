//! The host end of tool RPC: one Unix socket per kernel process.
//!
//! The socket sits in the kernel's staging dir (0700, the socket itself
//! 0600; under the strict sandbox both belong to the kernel's uid). Each
//! connection carries one call at a time: a frame (4-byte little-endian
//! length, then JSON `{"token", "tool", "args"}`) in, a frame
//! (`{"result": …}` or `{"error": "…"}`) out. The runner's client keeps one
//! connection per thread, so threads call concurrently.
//!
//! Every call is checked against the per-kernel token (constant time), then
//! against the authority of the cell running *now*; it runs in its own task
//! (a panic fails only that call) and is cancelled when the cell settles.
//! Bad input (a malformed request, a wrong token, an unknown tool, a frame
//! over [`MAX_PAYLOAD`]) gets an error back; the kernel and host go on.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::task::{JoinHandle, JoinSet};

use super::{Authority, AuthoritySlot, MAX_PAYLOAD};

/// The socket's file name in the staging dir.
pub(crate) const SOCKET_NAME: &str = "tools.sock";

/// The env var that hands the runner its token (it removes it at start).
pub(crate) const TOKEN_ENV: &str = "CELLHOST_TOOLS_TOKEN";

/// Connections served at once per kernel; more are closed at once.
const MAX_CONNECTIONS: usize = 256;

/// Serves one kernel process's socket until dropped.
pub(crate) struct ToolServer {
    task: JoinHandle<()>,
}

impl Drop for ToolServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ToolServer {
    /// Create the socket in `dir` (the private staging dir, so no one can
    /// reach it before it is 0600).
    pub(crate) fn bind(dir: &Path) -> io::Result<std::os::unix::net::UnixListener> {
        let path = dir.join(SOCKET_NAME);
        let listener = std::os::unix::net::UnixListener::bind(&path)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        listener.set_nonblocking(true)?;
        Ok(listener)
    }

    /// Serve calls on `listener` under whatever authority `slot` holds.
    pub(crate) fn start(
        listener: std::os::unix::net::UnixListener,
        token: Arc<str>,
        slot: AuthoritySlot,
    ) -> io::Result<ToolServer> {
        let listener = tokio::net::UnixListener::from_std(listener)?;
        Ok(ToolServer {
            task: tokio::spawn(accept(listener, token, slot)),
        })
    }
}

async fn accept(listener: tokio::net::UnixListener, token: Arc<str>, slot: AuthoritySlot) {
    // Dropping the set (when this task is aborted) aborts every connection.
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, _)) if conns.len() < MAX_CONNECTIONS => {
                    conns.spawn(serve(stream, token.clone(), slot.clone()));
                }
                Ok(_) => {}
                // Out of fds, say: back off instead of spinning.
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// What one request asks.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Request {
    token: String,
    tool: String,
    #[serde(default)]
    args: Value,
}

async fn serve(stream: UnixStream, token: Arc<str>, slot: AuthoritySlot) {
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::with_capacity(64 * 1024, rd);
    let mut body = Vec::new();
    loop {
        let mut head = [0u8; 4];
        if rd.read_exact(&mut head).await.is_err() {
            return;
        }
        let len = u32::from_le_bytes(head) as usize;
        let (reply, close) = if len > MAX_PAYLOAD {
            // The rest cannot be skipped safely: answer and hang up (the
            // client reconnects for its next call).
            (
                error(format!(
                    "the tool request is {len} bytes, over the {MAX_PAYLOAD}-byte limit; \
                     pass less data per call"
                )),
                true,
            )
        } else {
            body.resize(len, 0);
            if rd.read_exact(&mut body).await.is_err() {
                return;
            }
            handle(&body, &token, &slot).await
        };
        let mut frame = Vec::with_capacity(4 + reply.len());
        frame.extend_from_slice(&(reply.len() as u32).to_le_bytes());
        frame.extend_from_slice(&reply);
        if wr.write_all(&frame).await.is_err() || close {
            return;
        }
    }
}

fn error(message: String) -> Vec<u8> {
    serde_json::to_vec(&json!({ "error": message })).unwrap_or_default()
}

/// The reply to one request, and whether to hang up after it.
async fn handle(body: &[u8], token: &str, slot: &AuthoritySlot) -> (Vec<u8>, bool) {
    let req: Request = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => {
            return (
                error(format!(
                    "malformed tool request ({e}); expected JSON {{\"token\", \"tool\", \"args\"}}"
                )),
                false,
            )
        }
    };
    if !same_token(req.token.as_bytes(), token.as_bytes()) {
        return (
            error("wrong token: this socket serves only its own kernel's cells".into()),
            true,
        );
    }
    let name = req.tool;
    let authority: Option<Arc<Authority>> = slot.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let Some(authority) = authority else {
        return (
            error(format!(
                "tool call {name:?} refused: no cell is running in this kernel (a thread left \
                 over from a finished cell?); tools can be called only while a cell runs"
            )),
            false,
        );
    };
    let args = match req.args {
        Value::Null => Value::Object(Default::default()),
        v @ Value::Object(_) => v,
        _ => {
            return (
                error(format!(
                    "the arguments of {name:?} must be a JSON object of keyword arguments"
                )),
                false,
            )
        }
    };
    let tool = match authority.admit(&name) {
        Ok(t) => t,
        Err(why) => return (error(why), false),
    };
    let mut call = tokio::spawn(async move { tool.call(args).await });
    let outcome = tokio::select! {
        r = &mut call => r,
        () = authority.retired() => {
            call.abort();
            return (error(format!(
                "tool call {name:?} cancelled: its cell ended (timeout, interrupt or kernel \
                 stop) before the tool returned"
            )), false);
        }
    };
    let reply = match outcome {
        Ok(Ok(value)) => serde_json::to_vec(&json!({ "result": value })),
        Ok(Err(e)) => Ok(error(e.message().to_owned())),
        Err(e) if e.is_panic() => Ok(error(format!(
            "tool {name:?} failed: it panicked ({})",
            panic_message(e.into_panic())
        ))),
        Err(_) => Ok(error(format!("tool call {name:?} was cancelled"))),
    };
    match reply {
        Ok(r) if r.len() <= MAX_PAYLOAD => (r, false),
        Ok(r) => (
            error(format!(
                "the result of tool {name:?} is {} bytes, over the {MAX_PAYLOAD}-byte limit",
                r.len()
            )),
            false,
        ),
        Err(e) => (
            error(format!(
                "the result of tool {name:?} is not valid JSON: {e}"
            )),
            false,
        ),
    }
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "no message".to_owned()
    }
}

/// Equal tokens, compared in time that does not depend on where they differ.
fn same_token(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_whole() {
        assert!(same_token(b"abcd", b"abcd"));
        assert!(!same_token(b"abcd", b"abce"));
        assert!(!same_token(b"abcd", b"abc"));
        assert!(!same_token(b"", b"a"));
    }
}

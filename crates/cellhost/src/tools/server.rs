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
//! over the payload limit) gets an error back; the kernel and host go on.
//! The host never buffers more than [`IN_FLIGHT_BYTES`] of one kernel's
//! requests at once.

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::request::{self, error, Admitted, Refused, Running};
use super::{Authority, AuthoritySlot};

/// The socket's file name in the staging dir.
pub(crate) const SOCKET_NAME: &str = "tools.sock";

/// The env var that hands the runner its token (it removes it at start).
pub(crate) const TOKEN_ENV: &str = "CELLHOST_TOOLS_TOKEN";

/// Connections served at once per kernel; more are told so and closed.
const MAX_CONNECTIONS: usize = 256;

/// Request bytes buffered at once per kernel (at least one whole request).
const IN_FLIGHT_BYTES: usize = 32 * 1024 * 1024;

/// Serves one kernel process's socket until dropped.
pub(crate) struct ToolServer {
    _task: crate::sys::AbortOnDrop,
}

impl ToolServer {
    /// Create the socket in `dir` (the private staging dir, so no one can
    /// reach it before it is 0600).
    pub(crate) fn bind(dir: &Path) -> io::Result<std::os::unix::net::UnixListener> {
        crate::sys::bind_private_socket(dir, SOCKET_NAME)
    }

    /// Serve calls on `listener` under whatever authority `slot` holds.
    /// `packages`: serves the reserved `%pip` request (see
    /// [`crate::packages`]).
    pub(crate) fn start(
        listener: std::os::unix::net::UnixListener,
        token: Arc<str>,
        slot: AuthoritySlot,
        max_payload: usize,
        packages: Option<Arc<crate::packages::Installer>>,
    ) -> io::Result<ToolServer> {
        let listener = tokio::net::UnixListener::from_std(listener)?;
        Ok(ToolServer {
            _task: crate::sys::AbortOnDrop(tokio::spawn(accept(
                listener,
                token,
                slot,
                max_payload,
                packages,
            ))),
        })
    }
}

async fn accept(
    listener: tokio::net::UnixListener,
    token: Arc<str>,
    slot: AuthoritySlot,
    max: usize,
    packages: Option<Arc<crate::packages::Installer>>,
) {
    // Dropping the set (when this task is aborted) aborts every connection.
    let mut conns = JoinSet::new();
    // Request bytes buffered at once across this kernel's connections: a
    // cell opening many connections cannot make the host hold more.
    let budget = Arc::new(Semaphore::new(IN_FLIGHT_BYTES.max(max) >> 10));
    loop {
        tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, _)) if conns.len() < MAX_CONNECTIONS => {
                    let conn = Conn { token: token.clone(), slot: slot.clone(), budget: budget.clone(), max, packages: packages.clone() };
                    conns.spawn(conn.serve(stream));
                }
                Ok((mut stream, _)) => {
                    // Say why before hanging up (the client reads this as
                    // the reply to its first request).
                    conns.spawn(async move {
                        let reply = error(format!(
                            "too many tool connections in this kernel (at most {MAX_CONNECTIONS}); \
                             call tools from fewer threads at once"
                        ));
                        let _ = stream.write_all(&framed(&reply)).await;
                    });
                }
                // Out of fds, say: back off instead of spinning.
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

struct Conn {
    token: Arc<str>,
    slot: AuthoritySlot,
    budget: Arc<Semaphore>,
    max: usize,
    packages: Option<Arc<crate::packages::Installer>>,
}

impl Conn {
    async fn serve(self, stream: UnixStream) {
        let (rd, mut wr) = stream.into_split();
        let mut rd = BufReader::with_capacity(64 * 1024, rd);
        loop {
            let mut head = [0u8; 4];
            if rd.read_exact(&mut head).await.is_err() {
                return;
            }
            let len = u32::from_le_bytes(head) as usize;
            let (reply, close) = if len > self.max {
                // The rest cannot be skipped safely: answer and hang up (the
                // client reconnects for its next call).
                (
                    error(format!(
                        "the tool request is {len} bytes, over the {}-byte limit; pass less \
                         data per call",
                        self.max
                    )),
                    true,
                )
            } else {
                let Ok(_permit) = self
                    .budget
                    .acquire_many(u32::try_from(len >> 10).unwrap_or(u32::MAX))
                    .await
                else {
                    return;
                };
                // Read what actually arrives, never a buffer sized on trust.
                let mut body = Vec::with_capacity(len.min(64 * 1024));
                match (&mut rd).take(len as u64).read_to_end(&mut body).await {
                    Ok(n) if n == len => {}
                    _ => return,
                }
                if let Some(args) = self.pip_request(&body) {
                    // Streams its own frames; not a tool call (no budget).
                    let authority = self.slot.lock().unwrap_or_else(|e| e.into_inner()).clone();
                    let installer = self.packages.as_deref();
                    if crate::packages::serve(installer, authority, &args, &mut wr)
                        .await
                        .is_err()
                    {
                        return;
                    }
                    continue;
                }
                self.handle(&body).await
            };
            if wr.write_all(&framed(&reply)).await.is_err() || close {
                return;
            }
        }
    }

    /// The arguments of a reserved `%pip` request with the right token
    /// (anything else goes the tool path, which explains what is wrong).
    fn pip_request(&self, body: &[u8]) -> Option<Value> {
        let req: request::Request = serde_json::from_slice(body).ok()?;
        if req.tool != crate::packages::REQUEST
            || !request::same_token(req.token.as_bytes(), self.token.as_bytes())
        {
            return None;
        }
        Some(
            req.args
                .and_then(|raw| serde_json::from_str(raw.get()).ok())
                .unwrap_or(Value::Null),
        )
    }

    /// The reply to one request, and whether to hang up after it (the
    /// parsing, token check, authority and reply live in `request.rs`).
    async fn handle(&self, body: &[u8]) -> (Vec<u8>, bool) {
        let authority: Option<Arc<Authority>> =
            self.slot.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let running = Running {
            authority: authority.as_ref(),
            cell: None,
        };
        match request::admit(body, &self.token, running) {
            Ok(Admitted { name, call }) => (request::reply(&name, call.await, self.max), false),
            Err(Refused { reply, hang_up }) => (reply, hang_up),
        }
    }
}

fn framed(body: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
    frame.extend_from_slice(body);
    frame
}

//! The host end of `network = "allowlist"`: an HTTP proxy (CONNECT and
//! plain `http://` requests) on a Unix socket in the kernel's staging dir,
//! bound into the sandbox. The kernel's runner forwards its loopback proxy
//! port to it. Every request is checked by name against the policy, the
//! name is resolved here (never by the kernel), and only addresses the
//! policy admits are dialled; a refusal is a 403 whose body says why.

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};
use tokio::task::JoinSet;

use super::{EgressPolicy, COUNTS};

/// The socket's file name in the staging dir.
pub(crate) const SOCKET_NAME: &str = "egress.sock";

/// Largest request head read before answering.
const MAX_HEAD: usize = 16 * 1024;

/// Serves one kernel's proxy socket until dropped.
pub(crate) struct EgressProxy {
    _task: crate::sys::AbortOnDrop,
}

impl EgressProxy {
    /// Create the socket in the private staging `dir`.
    pub(crate) fn bind(dir: &Path) -> io::Result<std::os::unix::net::UnixListener> {
        crate::sys::bind_private_socket(dir, SOCKET_NAME)
    }

    pub(crate) fn start(
        listener: std::os::unix::net::UnixListener,
        policy: Arc<EgressPolicy>,
    ) -> io::Result<EgressProxy> {
        let listener = tokio::net::UnixListener::from_std(listener)?;
        Ok(EgressProxy {
            _task: crate::sys::AbortOnDrop(tokio::spawn(async move {
                let mut conns = JoinSet::new();
                loop {
                    tokio::select! {
                        r = listener.accept() => match r {
                            Ok((s, _)) if conns.len() < 256 => {
                                conns.spawn(serve(s, policy.clone()));
                            }
                            Ok(_) => {}
                            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                        },
                        Some(_) = conns.join_next(), if !conns.is_empty() => {}
                    }
                }
            })),
        })
    }
}

async fn serve(mut s: UnixStream, policy: Arc<EgressPolicy>) {
    let mut head = Vec::with_capacity(2048);
    let mut buf = [0u8; 4096];
    let end = loop {
        if let Some(at) = find(&head, b"\r\n\r\n") {
            break at + 4;
        }
        if head.len() > MAX_HEAD {
            return refuse(&mut s, "?", "the request head is over 16 KiB").await;
        }
        match tokio::time::timeout(Duration::from_secs(30), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return,
            Ok(Ok(n)) => head.extend_from_slice(&buf[..n]),
        }
    };
    let text = String::from_utf8_lossy(&head[..end]).into_owned();
    let rest = head[end..].to_vec();
    let first = text.lines().next().unwrap_or_default();
    let mut parts = first.split(' ');
    let (method, target, version) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or("HTTP/1.1"),
    );
    let connect = method.eq_ignore_ascii_case("CONNECT");
    let (authority, path) = if connect {
        (target.to_owned(), String::new())
    } else if let Some(after) = target.strip_prefix("http://") {
        match after.find('/') {
            Some(i) => (after[..i].to_owned(), after[i..].to_owned()),
            None => (after.to_owned(), "/".to_owned()),
        }
    } else {
        return refuse(
            &mut s,
            target,
            "only CONNECT and absolute http:// requests go through this proxy",
        )
        .await;
    };
    let (host, port) = match split_host_port(&authority, if connect { 443 } else { 80 }) {
        Some(hp) => hp,
        None => return refuse(&mut s, &authority, "the target has no valid host:port").await,
    };
    let shown = format!("{host}:{port}");
    if let Some(why) = policy.refuse_name(&host) {
        return refuse(&mut s, &shown, &why).await;
    }
    let addrs: Vec<SocketAddr> = match tokio::time::timeout(
        Duration::from_secs(10),
        tokio::net::lookup_host((host.as_str(), port)),
    )
    .await
    {
        Ok(Ok(a)) => a.collect(),
        _ => return refuse(&mut s, &shown, "the host could not resolve this name").await,
    };
    // Every address the name resolves to must pass: a name that also
    // points inside (a rebinding trick) is refused whole.
    if let Some(why) = addrs.iter().find_map(|a| policy.refuse_addr(a.ip())) {
        return refuse(&mut s, &shown, &why).await;
    }
    let Some(addr) = addrs.first().copied() else {
        return refuse(&mut s, &shown, "the name has no address").await;
    };
    let mut up = match tokio::time::timeout(Duration::from_secs(10), TcpStream::connect(addr)).await
    {
        Ok(Ok(up)) => up,
        _ => {
            let _ = s
                .write_all(
                    b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                )
                .await;
            return;
        }
    };
    COUNTS.allowed.fetch_add(1, Ordering::Relaxed);
    eprintln!("cellhost: egress allowed {shown} ({addr})");
    if connect {
        if s.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await
            .is_err()
        {
            return;
        }
    } else {
        // Origin-form request line; the headers as they came.
        let after_line = &text[first.len()..];
        let mut out = format!("{method} {path} {version}").into_bytes();
        out.extend_from_slice(after_line.as_bytes());
        if up.write_all(&out).await.is_err() {
            return;
        }
    }
    if !rest.is_empty() && up.write_all(&rest).await.is_err() {
        return;
    }
    let _ = tokio::io::copy_bidirectional(&mut s, &mut up).await;
}

async fn refuse(s: &mut UnixStream, target: &str, why: &str) {
    COUNTS.refused.fetch_add(1, Ordering::Relaxed);
    eprintln!("cellhost: egress refused {target}: {why}");
    let body = format!("cellhost egress proxy refused {target}: {why}\n");
    let reply = format!(
        "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = s.write_all(reply.as_bytes()).await;
    let _ = s.shutdown().await;
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// `host:port`, `host` (default port) or `[v6]:port`.
fn split_host_port(a: &str, default: u16) -> Option<(String, u16)> {
    if a.starts_with('[') {
        let close = a.find(']')?;
        let port = match &a[close + 1..] {
            "" => default,
            p => p.strip_prefix(':')?.parse().ok()?,
        };
        return Some((a[..=close].to_owned(), port));
    }
    match a.rsplit_once(':') {
        Some((h, p)) => Some((h.to_owned(), p.parse().ok()?)),
        None if !a.is_empty() => Some((a.to_owned(), default)),
        None => None,
    }
    .filter(|(h, _)| !h.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_split_into_host_and_port() {
        assert_eq!(split_host_port("a.b:8443", 443), Some(("a.b".into(), 8443)));
        assert_eq!(split_host_port("a.b", 80), Some(("a.b".into(), 80)));
        assert_eq!(split_host_port("[::1]:5", 80), Some(("[::1]".into(), 5)));
        assert_eq!(split_host_port(":5", 80), None);
        assert_eq!(split_host_port("a:x", 80), None);
    }
}

//! Run-to-completion exec: the one thing every remote backend offers.
//!
//! A [`Transport`] runs a POSIX shell script on the remote side with some
//! bytes on its stdin and returns its stdout, stderr and exit status. The
//! script is sent as the command (never containing a secret: secrets go
//! on stdin). All three backends are command-line clients (`ssh`,
//! `docker exec -i`, `kubectl exec -i`), run by [`run_client`].

use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A boxed future, so [`Transport`] stays object safe.
pub(super) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What one exec produced.
#[derive(Debug, Clone, Default)]
pub struct ExecOutput {
    /// The client's stdout (the remote script's), capped at
    /// `MAX_CLIENT_STDOUT` (64 MiB); the rest is read and dropped.
    pub stdout: Vec<u8>,
    /// The client's stderr (the script's and the client's own messages),
    /// capped at `MAX_CLIENT_STDERR` (1 MiB).
    pub stderr: Vec<u8>,
    /// Exit status of the client; `None` when it was killed by a signal.
    pub status: Option<i32>,
}

impl ExecOutput {
    /// The last non-empty line of stderr, for error messages.
    pub fn stderr_line(&self) -> String {
        String::from_utf8_lossy(&self.stderr)
            .lines()
            .rev()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .unwrap_or("")
            .to_owned()
    }
}

/// Why an exec did not complete. Any of these counts as "the remote side
/// may be dead".
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ExecError {
    /// The local client (`ssh`, `docker`, `kubectl`) could not be started.
    #[error("failed to run {program}: {detail}; check that it is installed and on PATH")]
    Client {
        /// The client's path as configured.
        program: String,
        /// The OS error from spawning it.
        detail: String,
    },
    /// The exec took longer than its bound; the client was killed.
    #[error("{what} did not answer within {after:?} (connection lost?)")]
    Timeout {
        /// What was run (a backend's description, or `docker run`).
        what: String,
        /// The bound that passed.
        after: Duration,
    },
    /// The client ran but the exec failed: it could not connect, the
    /// container could not be started, or waiting for it failed.
    #[error("{what} failed: {detail}")]
    Failed {
        /// What was run (a backend's description, or `docker run IMAGE`).
        what: String,
        /// Why, usually the last line of the client's stderr.
        detail: String,
    },
}

/// A way to run a command on a remote host, container or pod.
pub trait Transport: Send + Sync + fmt::Debug {
    /// Run `script` with `sh -c` remotely, `stdin` on its stdin; give up
    /// (killing the local client) after `timeout`.
    fn exec<'a>(
        &'a self,
        script: &'a str,
        stdin: Vec<u8>,
        timeout: Option<Duration>,
    ) -> BoxFuture<'a, Result<ExecOutput, ExecError>>;

    /// Where this runs, for notes: `ssh user@host:port`, `docker exec ID`.
    fn describe(&self) -> String;

    /// The local client that runs `script` remotely with its stdin and
    /// stdout as pipes, for transfers streamed rather than collected
    /// (workspace files). The script is the command (never a secret,
    /// never file content). `None`: this transport cannot stream.
    fn stream_client<'a>(
        &'a self,
        script: &'a str,
    ) -> BoxFuture<'a, Result<Option<Client>, ExecError>> {
        let _ = script;
        Box::pin(async { Ok(None) })
    }

    /// Release what the transport holds (ssh master, per-kernel
    /// container). Idempotent; best effort.
    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// A local client program and its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Client {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// `'…'`, safe in any POSIX shell.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// Bytes of stdout [`run_client`] keeps: a result blob is at most three
/// capped streams (8 MiB each) and a header; a tool request is bounded by
/// `head -c`. More than this is cut (the blob then fails to parse).
pub(super) const MAX_CLIENT_STDOUT: u64 = 64 << 20;
/// Bytes of stderr [`run_client`] keeps (it is only used for messages).
pub(super) const MAX_CLIENT_STDERR: u64 = 1 << 20;

/// Read at most `cap` bytes of `s`, then drain (and drop) the rest so the
/// client never blocks on a full pipe.
async fn read_capped<R: tokio::io::AsyncRead + Unpin>(s: &mut R, cap: u64) -> Vec<u8> {
    let mut buf = Vec::new();
    let _ = (&mut *s).take(cap).read_to_end(&mut buf).await;
    let _ = tokio::io::copy(s, &mut tokio::io::sink()).await;
    buf
}

/// Run a client to completion with `stdin`, collecting its output (at
/// most [`MAX_CLIENT_STDOUT`] / [`MAX_CLIENT_STDERR`] bytes); killed (and
/// the exec failed) after `timeout`.
pub(super) async fn run_client(
    client: &Client,
    stdin: Vec<u8>,
    timeout: Option<Duration>,
    what: &str,
) -> Result<ExecOutput, ExecError> {
    let mut cmd = tokio::process::Command::new(&client.program);
    cmd.args(&client.args)
        .envs(client.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|e| ExecError::Client {
        program: client.program.display().to_string(),
        detail: e.to_string(),
    })?;
    let mut input = child.stdin.take();
    let mut out = child.stdout.take();
    let mut err = child.stderr.take();
    let work = async move {
        let feed = async {
            if let Some(mut i) = input.take() {
                // A client that exits early closes its stdin: not an error here.
                let _ = i.write_all(&stdin).await;
                let _ = i.shutdown().await;
            }
        };
        let (_, stdout, stderr, status) = tokio::join!(
            feed,
            async {
                match out.take() {
                    Some(mut s) => read_capped(&mut s, MAX_CLIENT_STDOUT).await,
                    None => Vec::new(),
                }
            },
            async {
                match err.take() {
                    Some(mut s) => read_capped(&mut s, MAX_CLIENT_STDERR).await,
                    None => Vec::new(),
                }
            },
            child.wait()
        );
        let status = status.map_err(|e| ExecError::Failed {
            what: what.to_owned(),
            detail: format!("waiting for the client: {e}"),
        })?;
        Ok(ExecOutput {
            stdout,
            stderr,
            status: status.code(),
        })
    };
    match timeout {
        None => work.await,
        Some(t) => tokio::time::timeout(t, work)
            .await
            .map_err(|_| ExecError::Timeout {
                what: what.to_owned(),
                after: t,
            })?,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_quotes() {
        assert_eq!(shell_quote("a'b"), "'a'\\''b'");
        assert_eq!(shell_quote(""), "''");
    }

    #[tokio::test]
    async fn a_local_client_runs_with_stdin_and_a_timeout() {
        let sh = Client {
            program: "/bin/sh".into(),
            args: vec!["-c".into(), "cat; echo err >&2; exit 3".into()],
            env: vec![],
        };
        let out = run_client(&sh, b"hi".to_vec(), None, "sh").await.unwrap();
        assert_eq!(out.stdout, b"hi");
        assert_eq!(out.stderr_line(), "err");
        assert_eq!(out.status, Some(3));
        let slow = Client {
            args: vec!["-c".into(), "sleep 5".into()],
            ..sh
        };
        let e = run_client(&slow, vec![], Some(Duration::from_millis(100)), "sh")
            .await
            .unwrap_err();
        assert!(matches!(e, ExecError::Timeout { .. }), "{e}");
    }

    #[tokio::test]
    async fn a_client_flooding_stdout_is_cut_at_the_cap_and_still_finishes() {
        let sh = Client {
            program: "/bin/sh".into(),
            args: vec![
                "-c".into(),
                format!("head -c {} /dev/zero; exit 4", MAX_CLIENT_STDOUT + 4096),
            ],
            env: vec![],
        };
        let out = run_client(&sh, vec![], Some(Duration::from_secs(30)), "sh")
            .await
            .unwrap();
        assert_eq!(out.stdout.len() as u64, MAX_CLIENT_STDOUT);
        assert_eq!(out.status, Some(4));
    }
}

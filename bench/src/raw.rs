//! The raw-pipe reference: the physical floor cellhost is compared against.
//!
//! `reference_runner.py` (stdlib only) is a persistent Python process that
//! reads length-prefixed JSON requests (`{"code": ...}`) on its stdin, runs
//! each as `exec(compile(code))`, and answers `{"ok": true, "stdout": ...}`
//! on a duplicate of its original stdout. This side uses blocking std I/O:
//! one `write` per request, one buffered read per reply, nothing else.

use std::io::{BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

use crate::procfs;

/// The runner's source, passed with `-c` so the binary needs no files.
const RUNNER: &str = include_str!("../reference_runner.py");

/// A live reference runner.
pub struct RawRunner {
    child: Child,
    requests: ChildStdin,
    replies: BufReader<ChildStdout>,
}

/// What one cell printed, as the runner reported it.
pub struct Reply {
    pub stdout: String,
}

impl RawRunner {
    /// Start a runner on `python` (a real interpreter, never a shim).
    pub fn spawn(python: &Path) -> Result<RawRunner> {
        let mut child = Command::new(python)
            .args(["-I", "-c", RUNNER])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("spawning the reference runner on {}", python.display()))?;
        let requests = child.stdin.take().expect("piped stdin");
        let replies = BufReader::new(child.stdout.take().expect("piped stdout"));
        Ok(RawRunner {
            child,
            requests,
            replies,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Run one cell and wait for its reply; an error reply is an error.
    pub fn execute(&mut self, code: &str) -> Result<Reply> {
        let body = serde_json::to_vec(&serde_json::json!({ "code": code }))?;
        let mut frame = Vec::with_capacity(4 + body.len());
        frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
        frame.extend_from_slice(&body);
        self.requests
            .write_all(&frame)
            .context("writing to the reference runner")?;

        let mut header = [0u8; 4];
        self.replies
            .read_exact(&mut header)
            .context("reading the reference runner's reply (did it exit?)")?;
        let mut body = vec![0u8; u32::from_be_bytes(header) as usize];
        self.replies.read_exact(&mut body)?;
        let reply: Value = serde_json::from_slice(&body).context("parsing the runner's reply")?;
        if reply.get("ok") != Some(&Value::Bool(true)) {
            bail!("reference runner: cell {code:?} failed: {reply}");
        }
        let stdout = reply
            .get("stdout")
            .and_then(Value::as_str)
            .ok_or_else(|| anyhow!("reference runner: reply without stdout: {reply}"))?;
        Ok(Reply {
            stdout: stdout.to_owned(),
        })
    }

    /// Run `code` `count` times, pushing each round trip's wall time onto
    /// `samples` and checking that the cell printed `expect_stdout`.
    pub fn time_cells(
        &mut self,
        code: &str,
        expect_stdout: &str,
        count: usize,
        samples: &mut Vec<Duration>,
    ) -> Result<()> {
        for _ in 0..count {
            let t0 = Instant::now();
            let reply = self.execute(code)?;
            samples.push(t0.elapsed());
            if reply.stdout != expect_stdout {
                bail!(
                    "reference runner: {code:?} printed {:?}, expected {expect_stdout:?}",
                    reply.stdout
                );
            }
        }
        Ok(())
    }

    /// Close the request pipe (the runner exits on EOF) and reap it.
    pub fn shutdown(mut self) -> Result<()> {
        drop(self.requests);
        let status = self.child.wait()?;
        if !status.success() {
            bail!("reference runner exited with {status}");
        }
        Ok(())
    }
}

/// What brand-new reference runners cost.
pub struct ColdFigures {
    /// Spawn → first `x=1` reply.
    pub first_reply: Vec<Duration>,
    /// VmRSS of each runner after its first cell, KiB.
    pub idle_rss_kib: Vec<u64>,
}

/// Start `repeats` runners one after another, timing each to its first
/// `x=1` reply and reading its resident size while it sits idle.
pub fn cold_starts(python: &Path, repeats: usize) -> Result<ColdFigures> {
    let mut figures = ColdFigures {
        first_reply: Vec::with_capacity(repeats),
        idle_rss_kib: Vec::with_capacity(repeats),
    };
    for _ in 0..repeats {
        let t0 = Instant::now();
        let mut runner = RawRunner::spawn(python)?;
        runner.execute("x=1")?;
        figures.first_reply.push(t0.elapsed());
        figures.idle_rss_kib.push(procfs::vm_rss_kib(runner.pid())?);
        runner.shutdown()?;
    }
    Ok(figures)
}

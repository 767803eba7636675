//! Process fork of a local kernel (docs/snapshots.md, "Fork"): between
//! cells the source's runner `fork()`s, and the child is re-homed as a
//! kernel of its own. The host makes the new kernel's staging dir (runner
//! files, tool socket), its five pipes (stdout, stderr, control in and
//! out, death) and a one-shot socket; the child takes a session and
//! process group of its own, connects (its pid checked against the one
//! the source reported), receives the pipes and its new runner dir, tool
//! token, cwd and package dir, and says hello there. The host then gives
//! it a death watcher and a cgroup of its own (where limits use one), and
//! a driver and actor of its own: from then on it is a kernel like any
//! other. Memory is shared copy-on-write, so the cost does not grow with
//! the state.
//!
//! Only a `none` kernel forks its process: a strict kernel's child would
//! stay in its source's sandbox (mount namespace, workspace bind, uid),
//! so strict sessions fork by snapshot and restore. The runner refuses a
//! kernel whose state `fork()` would not copy alone (threads of its own,
//! open files or sockets, which the child would share): each refusal is
//! a reason the caller reports as it falls back.

use std::io::IoSlice;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;

use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};

use super::actor::Actor;
use super::frame::{Frame, FrameReader};
use super::leader::Leader;
use super::local::LocalDriver;
use super::process::{max_display_bytes, Process, Rpc, ToolListener};
use super::staging::Staged;
use super::{Kernel, KernelOptions, Observed};
use crate::interpreter::Interpreter;
use crate::sandbox::cgroup::KernelCgroup;
use crate::sys;

/// Why a kernel's process was not forked, in words: the caller then
/// copies the state by snapshot and restore, and says why.
pub(crate) type Refusal = String;

/// Under the strict profile the child would stay in its source's sandbox.
pub(crate) const STRICT: &str =
    "a strict kernel's fork would stay in its source's sandbox (mount namespace, \
                      workspace and uid), so the state was copied by snapshot and restore";

impl Kernel {
    /// A new kernel whose process is a fork of this one's (between its
    /// cells), re-homed with `opts`: its own staging dir, pipes, process
    /// group, death watcher, cgroup, tool token, cwd and package dir.
    /// Returns it and how many globals it holds. For a local kernel (a
    /// remote runner answers that it knows no such request).
    ///
    /// # Errors
    /// Why the process was not forked (the kernel's kind, what its state
    /// holds, or a failure on the way, with nothing left behind).
    pub(crate) async fn fork_process(&self, opts: KernelOptions) -> Result<(Kernel, u64), Refusal> {
        if opts.sandbox.is_strict() {
            return Err(STRICT.into());
        }
        let failed = |what: &str, why: String| format!("the process fork failed ({what}: {why})");
        let python = opts.python.clone();
        let interpreter =
            tokio::task::spawn_blocking(move || Interpreter::resolve(python.as_deref()))
                .await
                .map_err(|e| failed("the interpreter lookup", e.to_string()))?
                .map_err(|e| failed("the interpreter lookup", crate::error_chain(&e)))?;
        let observed = Arc::new(Observed::default());
        let driver = LocalDriver::new(opts.clone(), interpreter, observed.clone())
            .map_err(|e| failed("the new kernel's driver", crate::error_chain(&e)))?;
        let home = Home::make(&opts).map_err(|e| failed("the new kernel's staging dir", e))?;
        let request = Frame::new()
            .with("op", "fork")
            .with("path", home.socket.to_string_lossy().as_bytes())
            .encode();
        let reply = self
            .op(request, opts.spawn_timeout)
            .await
            .map_err(|why| failed("the source kernel", why))?;
        if reply.text("status").as_deref() != Some("ok") {
            let why = reply
                .text("error")
                .unwrap_or_else(|| "the runner gave no reason".into());
            return Err(if reply.text("refused").is_some() {
                format!("{why}, so the state was copied by snapshot and restore")
            } else {
                failed("the source kernel", why)
            });
        }
        let value = reply.text("value").unwrap_or_default();
        let forked: serde_json::Value = serde_json::from_str(&value)
            .map_err(|e| failed("the source's reply", e.to_string()))?;
        let (Some(pid), names) = (
            forked["pid"].as_u64().and_then(|p| u32::try_from(p).ok()),
            forked["names"].as_u64().unwrap_or(0),
        ) else {
            return Err(failed("the source's reply", "no pid".into()));
        };
        let proc = home
            .rehome(pid, &opts, driver.rpc())
            .await
            .map_err(|why| failed("re-homing the child", why))?;
        Ok((Actor::adopting(driver, proc, observed), names))
    }
}

/// The new kernel's home, made before the source forks.
struct Home {
    id: String,
    /// Removed with the home unless a process takes it.
    staging: Staged,
    tools: ToolListener,
    /// The one-shot socket the child connects to.
    socket: PathBuf,
    listener: tokio::net::UnixListener,
}

impl Home {
    fn make(opts: &KernelOptions) -> Result<Home, String> {
        let (id, staging, tools) =
            Process::make_staging(opts).map_err(|e| crate::error_chain(&e))?;
        let staging = Staged::new(staging);
        let listener = sys::bind_private_socket(staging.path(), "rehome.sock")
            .and_then(tokio::net::UnixListener::from_std)
            .map_err(|e| format!("the re-homing socket: {e}"))?;
        Ok(Home {
            id,
            socket: staging.path().join("rehome.sock"),
            staging,
            tools,
            listener,
        })
    }

    /// Hand the child `pid` its pipes and wait for its hello.
    async fn rehome(self, pid: u32, opts: &KernelOptions, rpc: &Rpc) -> Result<Process, String> {
        // (A failed home's staging dir goes with it.)
        let made = self.rehome_in(pid, opts, rpc).await;
        if made.is_err() {
            // The source's turn is held, so it has not reaped the child:
            // its pid is still the child's. Its group, once it has one.
            sys::signal_pid(pid, nix::sys::signal::Signal::SIGKILL);
            if sys::process_group(pid) == Some(pid) {
                sys::signal_group(pid, nix::sys::signal::Signal::SIGKILL);
            }
        }
        made
    }

    async fn rehome_in(self, pid: u32, opts: &KernelOptions, rpc: &Rpc) -> Result<Process, String> {
        let leader = Leader::forked(pid).map_err(|e| format!("a pidfd on the child: {e}"))?;
        let within = opts.spawn_timeout;
        let (stream, _) = tokio::time::timeout(within, self.listener.accept())
            .await
            .map_err(|_| format!("the child did not connect within {} s", within.as_secs()))?
            .map_err(|e| format!("accept the child: {e}"))?;
        let peer = stream.peer_cred().map_err(|e| e.to_string())?.pid();
        if peer != Some(pid as i32) {
            return Err(format!("pid {peer:?} connected, not the child {pid}"));
        }
        drop(self.listener);
        let _ = std::fs::remove_file(&self.socket);
        let pipe = |about: &str| sys::pipe().map_err(|e| format!("{about}: {e}"));
        let (req_r, req_w) = pipe("the request pipe")?;
        let (rep_r, rep_w) = pipe("the reply pipe")?;
        let (death_r, death_w) = pipe("the death pipe")?;
        let (out_r, out_w) = pipe("the stdout pipe")?;
        let (err_r, err_w) = pipe("the stderr pipe")?;
        let watch = death_r.try_clone().map_err(|e| e.to_string())?;
        // Made as a spawn makes it (a pip install goes there).
        let packages = rpc.packages.as_ref().and_then(|p| {
            let dir = p.dir()?;
            crate::packages::ensure_dir(&dir, p.uid, p.gid).ok()?;
            Some(dir)
        });
        let payload = serde_json::json!({
            "runner": self.staging.path().join("runner.py"),
            "token": &*rpc.token,
            "cwd": opts.cwd,
            "packages": packages,
        })
        .to_string();
        let stream = stream.into_std().map_err(|e| e.to_string())?;
        stream.set_nonblocking(false).map_err(|e| e.to_string())?;
        let sent: [&OwnedFd; 5] = [&out_w, &err_w, &req_r, &rep_w, &death_r];
        let raw: Vec<i32> = sent.iter().map(|fd| fd.as_raw_fd()).collect();
        sendmsg::<()>(
            stream.as_raw_fd(),
            &[IoSlice::new(payload.as_bytes())],
            &[ControlMessage::ScmRights(&raw)],
            MsgFlags::empty(),
            None,
        )
        .map_err(|e| format!("send the child its pipes: {e}"))?;
        drop(stream); // EOF: the payload is whole
        drop((out_w, err_w, req_r, rep_w, death_r));
        let cgroup = if opts.limits.cgroups {
            KernelCgroup::create(
                &self.id,
                opts.limits.memory_bytes,
                opts.limits.max_processes,
            )
        } else {
            None
        };
        if let Some(cg) = &cgroup {
            let moved = cg.adopt(pid, None).await.map_err(|e| e.to_string())?;
            if let Err(e) = moved {
                cg.kill_and_remove().await;
                return Err(format!("move the child into its cgroup: {e}"));
            }
        }
        let mem_cgroup = cgroup.as_ref().is_some_and(|c| c.limits_memory());
        let io = |e: std::io::Error| e.to_string();
        let mut proc = Process {
            id: self.id,
            pid,
            leader: pid,
            wrapped: false,
            cgroup,
            limits: crate::sandbox::launch::enforced(&opts.limits, mem_cgroup),
            counters: (0, 0),
            child: leader,
            ctrl_tx: tokio::net::unix::pipe::Sender::from_owned_fd(req_w).map_err(io)?,
            ctrl_rx: tokio::net::unix::pipe::Receiver::from_owned_fd(rep_r).map_err(io)?,
            frames: FrameReader::with_display_limit(
                max_display_bytes(opts) + super::display::FRAME_SLACK,
            ),
            stdout: tokio::net::unix::pipe::Receiver::from_owned_fd(out_r).map_err(io)?,
            stderr: tokio::net::unix::pipe::Receiver::from_owned_fd(err_r).map_err(io)?,
            _death: death_w,
            watcher: sys::watch_group(pid, watch).ok(),
            staging: self.staging.keep(),
            _etc: None,
            _tools: None,
            _egress: None,
            tools_unavailable: None,
            tools_installed: None,
            execution_count: 0,
            exited: None,
            group_killed: false,
        };
        proc.serve_tools(self.tools, opts, rpc);
        let hello = tokio::time::timeout(within, proc.await_hello()).await;
        match hello {
            Ok(Ok(())) => Ok(proc),
            Ok(Err(e)) => {
                proc.kill_now().await;
                Err(crate::error_chain(&e))
            }
            Err(_) => {
                proc.kill_now().await;
                Err(format!("no hello within {} s", within.as_secs()))
            }
        }
    }
}

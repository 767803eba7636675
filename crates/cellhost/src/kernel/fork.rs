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
//! so strict sessions fork by snapshot and restore. A strict *template*
//! (which runs no cell, unsandboxed as root in a bwrap of its own) forks
//! spares that sandbox themselves: their namespaces with the go, their
//! mounts, uid, Landlock and seccomp with the hand-over
//! (`sandbox/rehome.rs`, `runner/strictfork.py`). The runner refuses a
//! kernel whose state `fork()` would not copy alone (threads of its own,
//! open files or sockets, which the child would share): each refusal is
//! a reason the caller reports as it falls back.

use std::io::IoSlice;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
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
use crate::sandbox::{rehome, STAGING_IN_SANDBOX, WORKSPACE_IN_SANDBOX};
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
        let child = self.fork_child(&opts, false).await?;
        let names = child.names;
        Ok((child.into_kernel(opts).await?, names))
    }

    /// A fork of this kernel's process that waits, in its own process
    /// group and cgroup, to be made a kernel ([`Spare::into_kernel`]): a
    /// template's next kernel, made before it is asked for. `opts` are
    /// the template's (its limits make the cgroup).
    ///
    /// # Errors
    /// As [`Kernel::fork_process`].
    pub(crate) async fn fork_spare(&self, opts: &KernelOptions) -> Result<Spare, Refusal> {
        self.fork_child(opts, true).await
    }

    async fn fork_child(&self, opts: &KernelOptions, waits: bool) -> Result<Spare, Refusal> {
        // Only a strict template's spares sandbox themselves.
        if opts.sandbox.is_strict() && !(waits && strict_template(opts).is_some()) {
            return Err(STRICT.into());
        }
        // A strict template sees no host path: its fork connects through
        // the template's own staging dir (`/run/cellhost/kernel` inside).
        let template_dir = strict_template(opts).map(|_| opts.staging_root.join(self.process_id()));
        let home = Home::make(opts, template_dir.as_deref())
            .map_err(|e| failed("the new kernel's staging dir", e))?;
        let mut request = Frame::new()
            .with("op", "fork")
            .with("path", home.told.to_string_lossy().as_bytes());
        if waits {
            request = request.with("wait", "1");
        }
        let reply = self
            .op(request.encode(), opts.spawn_timeout)
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
        let mut spare = Spare {
            pid,
            waits,
            names,
            home: Some(home),
            leader: None,
            stream: None,
            cgroup: None,
            death: None,
            watcher: None,
            strict: false,
        };
        // (Dropped on failure: the child and its cgroup are killed.)
        spare
            .connect(opts)
            .await
            .map_err(|why| failed("re-homing the child", why))?;
        Ok(spare)
    }
}

fn failed(what: &str, why: String) -> String {
    format!("the process fork failed ({what}: {why})")
}

/// The strict profile of a strict template's options.
fn strict_template(opts: &KernelOptions) -> Option<&crate::StrictSandbox> {
    match &opts.sandbox {
        crate::Sandbox::Strict(s) if s.template.0 => Some(s),
        _ => None,
    }
}

/// The strict profile of a kernel's options.
fn strict_of(opts: &KernelOptions) -> Option<&crate::StrictSandbox> {
    match &opts.sandbox {
        crate::Sandbox::Strict(s) => Some(s),
        crate::Sandbox::None => None,
    }
}

/// The new kernel's home, made before the source forks.
struct Home {
    id: String,
    /// Removed with the home unless a process takes it.
    staging: Staged,
    tools: ToolListener,
    /// The one-shot socket the child connects to, and its path as the
    /// source sees it.
    socket: Unlinked,
    told: PathBuf,
    listener: tokio::net::UnixListener,
}

impl Home {
    /// `template_dir`: a strict template's staging dir, where the socket
    /// goes (the template sees it at `STAGING_IN_SANDBOX`); else the new
    /// kernel's own.
    fn make(opts: &KernelOptions, template_dir: Option<&Path>) -> Result<Home, String> {
        let (id, staging, tools) =
            Process::make_staging(opts).map_err(|e| crate::error_chain(&e))?;
        let staging = Staged::new(staging);
        let name = format!("rehome-{id}.sock");
        let dir = template_dir.unwrap_or(staging.path());
        let listener = sys::bind_private_socket(dir, &name)
            .and_then(tokio::net::UnixListener::from_std)
            .map_err(|e| format!("the re-homing socket: {e}"))?;
        let told = match template_dir {
            Some(_) => Path::new(STAGING_IN_SANDBOX).join(&name),
            None => dir.join(&name),
        };
        Ok(Home {
            id,
            socket: Unlinked(dir.join(&name)),
            told,
            staging,
            tools,
            listener,
        })
    }
}

/// A socket file removed when dropped (once the child connected, or the
/// fork was given up: in a template's dir it would outlive the fork).
struct Unlinked(PathBuf);

impl Drop for Unlinked {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A forked child on its way to being a kernel: connected to its home's
/// socket (its pid checked), in a process group and cgroup of its own,
/// waiting for its pipes. Killed, with its cgroup, if dropped before it
/// is a kernel.
pub(crate) struct Spare {
    pid: u32,
    /// Made ahead (a template's): told when it is in its cgroup.
    waits: bool,
    names: u64,
    home: Option<Home>,
    leader: Option<Leader>,
    stream: Option<std::os::unix::net::UnixStream>,
    cgroup: Option<KernelCgroup>,
    /// Its death pipe (the read end is sent on) and the group watcher on
    /// it, started with the spare: a `/bin/sh` spawn off the hand-over.
    death: Option<(OwnedFd, OwnedFd)>,
    watcher: Option<tokio::process::Child>,
    /// A strict template's: it sandboxes itself, and only a strict
    /// kernel's options may be handed to it.
    strict: bool,
}

impl Drop for Spare {
    fn drop(&mut self) {
        if self.home.is_none() {
            return; // a kernel now
        }
        // Its pid is still the child's: the source holds it (it reaps
        // between its requests, and this child has not been handed on).
        sys::signal_pid(self.pid, nix::sys::signal::Signal::SIGKILL);
        if sys::process_group(self.pid) == Some(self.pid) {
            sys::signal_group(self.pid, nix::sys::signal::Signal::SIGKILL);
        }
        // The cgroup's own drop kills what is left in it and removes it.
    }
}

impl Spare {
    /// Accept the child's connection and move it into its cgroup.
    async fn connect(&mut self, opts: &KernelOptions) -> Result<(), String> {
        let pid = self.pid;
        self.leader = Some(Leader::forked(pid).map_err(|e| format!("a pidfd on the child: {e}"))?);
        let home = self
            .home
            .as_ref()
            .expect("a spare has its home until it is a kernel");
        let within = opts.spawn_timeout;
        let leader = self.leader.as_mut().expect("its pidfd was just opened");
        let (stream, _) = tokio::select! {
            accepted = tokio::time::timeout(within, home.listener.accept()) => accepted
                .map_err(|_| format!("the child did not connect within {} s", within.as_secs()))?
                .map_err(|e| format!("accept the child: {e}"))?,
            // (Killed with its source's cgroup, say, before it connected.)
            _ = leader.wait() => return Err("the child ended before it connected".into()),
        };
        let peer = stream.peer_cred().map_err(|e| e.to_string())?.pid();
        if peer != Some(pid as i32) {
            return Err(format!("pid {peer:?} connected, not the child {pid}"));
        }
        let _ = std::fs::remove_file(&home.socket.0);
        let stream = stream.into_std().map_err(|e| e.to_string())?;
        stream.set_nonblocking(false).map_err(|e| e.to_string())?;
        self.stream = Some(stream);
        // The watcher's spawn before the cgroup move, which may wait out
        // an RCU grace period.
        let (death_r, death_w) = sys::pipe().map_err(|e| format!("the death pipe: {e}"))?;
        let watch = death_r.try_clone().map_err(|e| e.to_string())?;
        self.watcher = sys::watch_group(pid, watch).ok();
        self.death = Some((death_r, death_w));
        let cgroup = if opts.limits.cgroups {
            KernelCgroup::create(
                &home.id,
                opts.limits.memory_bytes,
                opts.limits.max_processes,
            )
        } else {
            None
        };
        let memory_cgroup = opts.limits.cgroups
            && opts.limits.memory_bytes.is_some()
            && crate::sandbox::cgroup::memory_available();
        if memory_cgroup && !cgroup.as_ref().is_some_and(KernelCgroup::limits_memory) {
            // Fails closed: its source may have no memory limit of its own
            // (a template's is its kernels' cgroups).
            return Err("its memory cgroup could not be made".into());
        }
        if let Some(cg) = &cgroup {
            let moved = cg.adopt(pid, None).await.map_err(|e| e.to_string())?;
            if let Err(e) = moved {
                cg.kill_and_remove().await;
                return Err(format!("move the child into its cgroup: {e}"));
            }
        }
        self.cgroup = cgroup;
        if self.waits {
            // In its cgroup now: what it touches from here is charged there.
            self.go(opts)?;
        }
        Ok(())
    }

    /// Tell a waiting child it is in its cgroup; a strict template's child
    /// is sent its namespaces' config and a status pipe with it.
    fn go(&mut self, opts: &KernelOptions) -> Result<(), String> {
        let stream = self.stream.as_ref().ok_or("the child's socket is gone")?;
        let Some(strict) = strict_template(opts) else {
            use std::io::Write;
            let mut go = stream;
            return go
                .write_all(b"g")
                .map_err(|e| format!("tell the child to go on: {e}"));
        };
        let mem_cgroup = self
            .cgroup
            .as_ref()
            .is_some_and(KernelCgroup::limits_memory);
        let rlimit_memory = opts.limits.memory_bytes.is_some() && !mem_cgroup;
        let go = rehome::go(strict, opts.limits.memory_bytes, rlimit_memory)?;
        let (status_r, status_w) = sys::pipe().map_err(|e| format!("the status pipe: {e}"))?;
        let mut fds = vec![status_w.as_raw_fd()];
        fds.extend(go.landlock.as_ref().map(AsRawFd::as_raw_fd));
        let sent = sendmsg::<()>(
            stream.as_raw_fd(),
            &[IoSlice::new(&go.message)],
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::empty(),
            None,
        )
        .map_err(|e| format!("tell the child to go on: {e}"))?;
        if sent != go.message.len() {
            return Err("tell the child to go on: a short write".into());
        }
        let leader = self.leader.take().ok_or("the child's pidfd is gone")?;
        self.leader = Some(
            leader
                .told_by(status_r)
                .map_err(|e| format!("the status pipe: {e}"))?,
        );
        self.strict = true;
        Ok(())
    }

    /// Why a strict template's child never became a kernel, when its
    /// sandbox's init said (appended to an error).
    fn why_not(&mut self) -> String {
        match self.leader.as_mut().and_then(|l| l.told().error) {
            Some(e) => format!(" ({e})"),
            None => String::new(),
        }
    }

    /// Whether the child still lives (a spare can wait long).
    pub(crate) fn is_alive(&self) -> bool {
        self.leader.as_ref().is_some_and(Leader::holds_pid) && sys::pid_alive(self.pid)
    }

    /// Make the child a kernel of `opts`: its pipes, runner dir, tool
    /// token, cwd and package dir sent (a strict template's child: its
    /// sandbox too), its hello awaited.
    ///
    /// # Errors
    /// Why not (the child is killed, nothing of it left behind).
    pub(crate) async fn into_kernel(mut self, opts: KernelOptions) -> Result<Kernel, Refusal> {
        // (Known already, as a rule: its template resolved it. A blocking
        // thread's hand-off costs ~0.1 ms.)
        let interpreter = match Interpreter::resolved(opts.python.as_deref()) {
            Some(found) => found,
            None => {
                let python = opts.python.clone();
                tokio::task::spawn_blocking(move || Interpreter::resolve(python.as_deref()))
                    .await
                    .map_err(|e| failed("the interpreter lookup", e.to_string()))?
                    .map_err(|e| failed("the interpreter lookup", crate::error_chain(&e)))?
            }
        };
        let observed = Arc::new(Observed::default());
        let driver = LocalDriver::new(opts.clone(), interpreter, observed.clone())
            .map_err(|e| failed("the new kernel's driver", crate::error_chain(&e)))?;
        let proc = self
            .hand_over(&opts, driver.rpc(), driver.workspace())
            .await
            .map_err(|why| failed("re-homing the child", why))?;
        Ok(Actor::adopting(driver, proc, observed))
    }

    async fn hand_over(
        &mut self,
        opts: &KernelOptions,
        rpc: &Rpc,
        workspace: Option<&Path>,
    ) -> Result<Process, String> {
        let pid = self.pid;
        let pipe = |about: &str| sys::pipe().map_err(|e| format!("{about}: {e}"));
        let (req_r, req_w) = pipe("the request pipe")?;
        let (rep_r, rep_w) = pipe("the reply pipe")?;
        let (out_r, out_w) = pipe("the stdout pipe")?;
        let (err_r, err_w) = pipe("the stderr pipe")?;
        // Made as a spawn makes it (a pip install goes there).
        let packages = rpc.packages.as_ref().and_then(|p| p.ensured_dir());
        let home = self
            .home
            .as_ref()
            .expect("a spare has its home until it is a kernel");
        if strict_of(opts).is_some() != self.strict {
            // (A strict template's child runs as root until it is sealed.)
            return Err("the kernel's sandbox profile is not its template's".into());
        }
        let seal = match strict_of(opts) {
            Some(strict) => {
                let workspace = workspace.ok_or("a strict kernel without a workspace")?;
                let places = rehome::Places {
                    staging: home.staging.path(),
                    workspace,
                    packages: packages.as_deref(),
                };
                Some(rehome::seal(strict, &places)?)
            }
            None => None,
        };
        let payload = match &seal {
            None => serde_json::json!({
                "runner": home.staging.path().join("runner.py"),
                "token": &*rpc.token,
                "cwd": opts.cwd,
                "packages": packages,
            }),
            // Paths inside its sandbox (the template's are the same).
            Some(seal) => serde_json::json!({
                "runner": Path::new(STAGING_IN_SANDBOX).join("runner.py"),
                "token": &*rpc.token,
                "cwd": opts.cwd.as_deref().unwrap_or(Path::new(WORKSPACE_IN_SANDBOX)),
                "packages": packages.is_some().then_some(crate::packages::PACKAGES_IN_SANDBOX),
                "strict": seal.spec,
            }),
        }
        .to_string();
        let (death_r, death_w) = self.death.take().ok_or("the child's death pipe is gone")?;
        let stream = self.stream.take().ok_or("the child's socket is gone")?;
        let mut raw: Vec<i32> = [&out_w, &err_w, &req_r, &rep_w, &death_r]
            .iter()
            .map(|fd| fd.as_raw_fd())
            .collect();
        raw.extend(
            seal.iter()
                .flat_map(|s| s.fds.iter().map(AsRawFd::as_raw_fd)),
        );
        let sent = sendmsg::<()>(
            stream.as_raw_fd(),
            &[IoSlice::new(payload.as_bytes())],
            &[ControlMessage::ScmRights(&raw)],
            MsgFlags::empty(),
            None,
        );
        if let Err(e) = sent {
            return Err(format!("send the child its pipes: {e}{}", self.why_not()));
        }
        drop(stream); // EOF: the payload is whole
        drop((out_w, err_w, req_r, rep_w, death_r));
        let (etc, egress) = match seal {
            Some(seal) => (Some(seal.etc), seal.egress),
            None => (None, None),
        };
        let home = self
            .home
            .take()
            .expect("a spare has its home until it is a kernel");
        let cgroup = self.cgroup.take();
        let mem_cgroup = cgroup.as_ref().is_some_and(|c| c.limits_memory());
        let io = |e: std::io::Error| e.to_string();
        let made = (|| -> Result<Process, String> {
            Ok(Process {
                id: home.id,
                pid,
                leader: pid,
                wrapped: false,
                cgroup,
                limits: crate::sandbox::launch::enforced(&opts.limits, mem_cgroup),
                counters: (0, 0),
                child: self.leader.take().ok_or("the child's pidfd is gone")?,
                ctrl_tx: tokio::net::unix::pipe::Sender::from_owned_fd(req_w).map_err(io)?,
                ctrl_rx: tokio::net::unix::pipe::Receiver::from_owned_fd(rep_r).map_err(io)?,
                frames: FrameReader::with_display_limit(
                    max_display_bytes(opts) + super::display::FRAME_SLACK,
                ),
                stdout: tokio::net::unix::pipe::Receiver::from_owned_fd(out_r).map_err(io)?,
                stderr: tokio::net::unix::pipe::Receiver::from_owned_fd(err_r).map_err(io)?,
                _death: death_w,
                watcher: self.watcher.take(),
                staging: home.staging.keep(),
                _etc: etc,
                _tools: None,
                _egress: None,
                tools_unavailable: None,
                tools_installed: None,
                execution_count: 0,
                exited: None,
                group_killed: false,
                runner: None,
            })
        })();
        let mut proc = match made {
            Ok(proc) => proc,
            Err(e) => {
                sys::signal_pid(pid, nix::sys::signal::Signal::SIGKILL);
                return Err(e);
            }
        };
        proc.serve_tools(home.tools, opts, rpc);
        if let (Some(listener), Some(strict)) = (egress, strict_of(opts)) {
            let policy = strict
                .egress
                .clone()
                .ok_or("an egress socket without a policy")?;
            match crate::egress::proxy::EgressProxy::start(listener, policy) {
                Ok(p) => proc._egress = Some(p),
                Err(e) => {
                    proc.kill_now().await;
                    return Err(format!("serve the egress proxy socket: {e}"));
                }
            }
        }
        let within = opts.spawn_timeout;
        let hello = tokio::time::timeout(within, proc.await_hello()).await;
        let why = match hello {
            Ok(Ok(())) if opts.sandbox.is_strict() => {
                // Its leader, the namespace's init, the runner: signals
                // (SIGINT) go to the runner, and pid() means it.
                match crate::sandbox::launch::runner_pid(pid, 2) {
                    Some(runner) => {
                        proc.pid = runner;
                        proc.pin_runner();
                        return Ok(proc);
                    }
                    None => "the sandboxed runner's pid could not be found".to_owned(),
                }
            }
            Ok(Ok(())) => {
                proc.pin_runner();
                return Ok(proc);
            }
            Ok(Err(e)) => crate::error_chain(&e),
            Err(_) => format!("no hello within {} s", within.as_secs()),
        };
        proc.kill_now().await;
        let told = proc.child.told().error;
        Err(match told {
            Some(e) => format!("{why} ({e})"),
            None => why,
        })
    }
}

//! One kernel process: spawning it, talking to it, tearing it down.
//!
//! The process is owned by exactly one task (the kernel actor); nothing else
//! touches its `Child` or pipes.

use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::net::unix::pipe;

use super::frame::{Frame, FrameReader};
use super::{KernelOptions, SpawnError};
use crate::sandbox::cgroup::KernelCgroup;
use crate::sandbox::launch::{self, EnforcedLimits};
use crate::sys::{self, private_dir, random_hex};
use crate::tools::{AuthoritySlot, ToolServer, TOKEN_ENV};

/// The runner script: its parts joined (compile.py, limits.py, helpers.py,
/// warmup.py, frames.py and streams.py define what runner.py calls),
/// shipped as one file so a kernel reads and compiles one script.
pub(crate) const RUNNER_SOURCE: &str = concat!(
    include_str!("../runner/compile.py"),
    include_str!("../runner/limits.py"),
    include_str!("../runner/helpers.py"),
    include_str!("../runner/warmup.py"),
    include_str!("../runner/frames.py"),
    include_str!("../runner/streams.py"),
    include_str!("../runner/runner.py")
);
/// Rich outputs; runner.py reads it from its own dir at start.
pub(crate) const DISPLAY_SOURCE: &str = include_str!("../runner/display.py");
/// The files written next to the runner script (local and remote alike):
/// display.py and the agent's dialect (helpers.py reads them at start and
/// compiles each on first use).
pub(crate) const RUNNER_FILES: &[(&str, &str)] = &[
    ("display.py", DISPLAY_SOURCE),
    ("dialect.py", include_str!("../runner/dialect.py")),
    ("magics.py", include_str!("../runner/magics.py")),
    ("hints.py", include_str!("../runner/hints.py")),
    ("pipmagic.py", include_str!("../runner/pipmagic.py")),
    // `%pip` on remote kernels (pip runs there) and `%pip uninstall`.
    ("remotepip.py", include_str!("../runner/remotepip.py")),
    ("pipuninstall.py", include_str!("../runner/pipuninstall.py")),
    // The snapshot and restore ops (docs/snapshots.md).
    ("snapshot.py", include_str!("../runner/snapshot.py")),
    // A strict template's forks sandbox themselves (docs/templates.md).
    ("strictfork.py", include_str!("../runner/strictfork.py")),
];

/// How a process ended, for notes and errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exit {
    Code(i32),
    Signal(i32),
    Unknown,
}

impl Exit {
    pub(crate) fn from_status(status: std::process::ExitStatus) -> Exit {
        use std::os::unix::process::ExitStatusExt;
        match (status.code(), status.signal()) {
            (Some(c), _) => Exit::Code(c),
            (_, Some(s)) => Exit::Signal(s),
            _ => Exit::Unknown,
        }
    }

    /// Under bwrap the host sees bwrap's exit, which reports a runner
    /// killed by signal N as status 128 + N.
    pub(crate) fn unwrapped(self, wrapped: bool) -> Exit {
        match self {
            Exit::Code(c) if wrapped && (129..=128 + 64).contains(&c) => Exit::Signal(c - 128),
            other => other,
        }
    }

    pub(crate) fn describe(self) -> String {
        match self {
            Exit::Code(c) => format!("exited with status {c}"),
            Exit::Signal(s) => format!("was killed by signal {s} ({})", sys::signal_name(s)),
            Exit::Unknown => "ended".to_owned(),
        }
    }
}

/// A live kernel process and its pipes.
pub(crate) struct Process {
    pub id: String,
    /// The runner's pid as the host sees it (under bwrap: the Python
    /// inside the sandbox, not bwrap).
    pub pid: u32,
    /// The host's child and process-group leader: the runner itself, or
    /// bwrap when sandboxed.
    pub(super) leader: u32,
    /// The runner runs under bwrap (exit statuses are bwrap's).
    pub wrapped: bool,
    /// The kernel's cgroups, when limits use them.
    pub cgroup: Option<KernelCgroup>,
    /// The limits in force, to name a breach.
    pub limits: EnforcedLimits,
    /// cgroup counters when last read (OOM kills, forks refused at
    /// pids.max), to tell whether a cell added to them.
    pub counters: (u64, u64),
    pub child: super::leader::Leader,
    pub ctrl_tx: pipe::Sender,
    pub ctrl_rx: pipe::Receiver,
    pub frames: FrameReader,
    pub stdout: pipe::Receiver,
    pub stderr: pipe::Receiver,
    /// Our end of the death pipe: the runner and its watcher see EOF when
    /// we drop it or when this process dies by any means.
    pub(super) _death: std::os::fd::OwnedFd,
    /// A tiny `sh` that kills the runner's group when the death pipe
    /// closes. The runner's own watcher thread needs the GIL, which a cell
    /// busy in C code (`sum(range(10**12))`) never releases; this one does
    /// not depend on the runner at all.
    pub(super) watcher: Option<tokio::process::Child>,
    pub(super) staging: PathBuf,
    /// The sandbox's `/etc` template, held while the kernel lives.
    pub(super) _etc: Option<std::sync::Arc<crate::sandbox::etc::Template>>,
    /// Serves this process's tool socket (none if it could not be made;
    /// the cells' tool calls then fail with the reason).
    pub(super) _tools: Option<ToolServer>,
    /// Serves `network = "allowlist"`'s proxy socket.
    pub(super) _egress: Option<crate::egress::proxy::EgressProxy>,
    /// Why there is no tool server, told to the cells that call tools.
    pub tools_unavailable: Option<String>,
    /// The tool set whose `tools` module this process has (sent with the
    /// first cell that has tools).
    pub tools_installed: Option<crate::tools::ToolSet>,
    pub execution_count: u64,
    /// Set once the child has been reaped.
    pub exited: Option<Exit>,
    /// `kill_now` has run.
    pub(super) group_killed: bool,
    /// A pidfd on the runner (`pid`), opened once its pid is known
    /// ([`Process::pin_runner`]): an interrupt then reaches the runner or
    /// nothing, never a process that took its pid after it was reaped (a
    /// sandboxed runner is reaped by its sandbox's init, not by us).
    pub(super) runner: Option<std::os::fd::OwnedFd>,
}

/// What a kernel's tool calls need: the token its runner presents and the
/// slot holding the running cell's authority. One per kernel handle, so a
/// respawned process keeps the token (and its redaction).
#[derive(Clone)]
pub(crate) struct Rpc {
    pub token: std::sync::Arc<str>,
    pub slot: AuthoritySlot,
    /// Serves `%pip` (none when the kernel has no package dir).
    pub packages: Option<std::sync::Arc<crate::packages::Installer>>,
}

/// The tool socket, bound, or why it could not be.
pub(super) type ToolListener = Result<std::os::unix::net::UnixListener, String>;

/// The egress proxy's socket and its policy, bound before the launch.
type EgressListener = (
    std::os::unix::net::UnixListener,
    std::sync::Arc<crate::egress::EgressPolicy>,
);

impl Process {
    /// Start a runner and wait for its hello. `workspace`: the strict
    /// sandbox's workspace (already created).
    pub(crate) async fn spawn(
        opts: &KernelOptions,
        python: &Path,
        workspace: Option<&Path>,
        rpc: &Rpc,
    ) -> Result<Process, SpawnError> {
        let (id, staging, listener) = Self::make_staging(opts)?;
        // Removed however this ends short of a process (an error, or this
        // future dropped mid-start).
        let staged = super::staging::Staged::new(staging.clone());
        let script = staging.join("runner.py");
        let egress = match &opts.sandbox {
            crate::Sandbox::Strict(crate::StrictSandbox {
                egress: Some(policy),
                ..
            }) => match crate::egress::proxy::EgressProxy::bind(&staging) {
                Ok(l) => Some((l, policy.clone())),
                Err(err) => {
                    return Err(SpawnError::Io {
                        about: "create the egress proxy socket",
                        err,
                    });
                }
            },
            _ => None,
        };
        let p = Self::start(
            opts,
            python,
            id,
            staging,
            &script,
            workspace,
            (listener, rpc, egress),
        )
        .await?;
        staged.keep(); // the process owns it now
        Ok(p)
    }

    /// A new kernel id, its staging dir with the runner's files, and its
    /// tool socket (or why there is none). Bound before the launch, so the
    /// sandbox hands it to the kernel uid with the rest of the dir.
    pub(super) fn make_staging(
        opts: &KernelOptions,
    ) -> Result<(String, PathBuf, ToolListener), SpawnError> {
        let id = format!("k-{}", random_hex(6));
        let io = |about: &'static str| move |err| SpawnError::Io { about, err };
        private_dir(&opts.staging_root).map_err(io("create the staging root"))?;
        // A tmpfs of its own under the strict profile (root hosts), so the
        // sandbox's mountinfo shows no host path (`staging.rs`).
        let tmpfs = opts.sandbox.is_strict() && nix::unistd::geteuid().is_root();
        let staging = super::staging::create(&opts.staging_root, &id, tmpfs).map_err(io(
            "create the kernel staging dir (a tmpfs under the strict sandbox)",
        ))?;
        let files = RUNNER_FILES
            .iter()
            .map(|(name, source)| (staging.join(name), *source));
        let script = staging.join("runner.py");
        for (path, source) in std::iter::once((script, RUNNER_SOURCE)).chain(files) {
            use std::io::Write;
            let written = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .and_then(|mut f| f.write_all(source.as_bytes()));
            if let Err(err) = written {
                super::staging::remove(&staging);
                return Err(SpawnError::Io {
                    about: "write the runner script",
                    err,
                });
            }
        }
        let listener = ToolServer::bind(&staging).map_err(|e| {
            format!(
                "the tool socket could not be created in {} ({e}); a Unix socket path must stay \
                 under 108 bytes, so choose a shorter runtime dir",
                staging.display()
            )
        });
        Ok((id, staging, listener))
    }

    /// Serve the tool socket `listener` (or record why there is none).
    pub(super) fn serve_tools(&mut self, listener: ToolListener, opts: &KernelOptions, rpc: &Rpc) {
        match listener.and_then(|l| {
            ToolServer::start(
                l,
                rpc.token.clone(),
                rpc.slot.clone(),
                opts.max_tool_payload,
                rpc.packages.clone(),
            )
            .map_err(|e| format!("the tool socket could not be served: {e}"))
        }) {
            Ok(server) => self._tools = Some(server),
            Err(why) => self.tools_unavailable = Some(why),
        }
    }

    async fn start(
        opts: &KernelOptions,
        python: &Path,
        id: String,
        staging: PathBuf,
        script: &Path,
        workspace: Option<&Path>,
        (listener, rpc, egress): (ToolListener, &Rpc, Option<EgressListener>),
    ) -> Result<Process, SpawnError> {
        let io = |about: &'static str| move |err| SpawnError::Io { about, err };
        let (req_r, req_w) = sys::pipe().map_err(io("create the request pipe"))?;
        let (rep_r, rep_w) = sys::pipe().map_err(io("create the reply pipe"))?;
        let (death_r, death_w) = sys::pipe().map_err(io("create the death pipe"))?;
        let (out_r, out_w) = sys::pipe().map_err(io("create the stdout pipe"))?;
        let (err_r, err_w) = sys::pipe().map_err(io("create the stderr pipe"))?;

        // The package dir as it is now (a pooled kernel's moves with it).
        let packages = rpc.packages.as_ref().and_then(|p| p.ensured_dir());
        let launch::Launch {
            mut cmd,
            setup,
            cgroup,
            wrapped,
            depth,
            limits,
            landlock,
            block,
            seccomp,
            etc,
        } = launch::prepare(&launch::Spec {
            id: &id,
            python,
            staging: &staging,
            script,
            env: &opts.env,
            cwd: opts.cwd.as_deref(),
            sandbox: &opts.sandbox,
            workspace,
            limits: &opts.limits,
            extra_env: &[(TOKEN_ENV, &rpc.token)],
            packages: packages.as_deref(),
            preload: &opts.preload,
            warmup: opts.warmup,
        })?;
        let caps = &opts.display;
        cmd.arg(format!(
            "--display={},{},{}",
            max_display_bytes(opts),
            caps.max_cell_bytes,
            caps.max_cell_displays
        ))
        .arg(format!("--network={}", opts.sandbox.network_mode()))
        .stdin(Stdio::null())
        .stdout(Stdio::from(out_w))
        .stderr(Stdio::from(err_w))
        .kill_on_drop(true);
        let (block_r, block_w) = block.unzip();
        let mut placements = vec![
            (sys::raw(&req_r), 3),
            (sys::raw(&rep_w), 4),
            (sys::raw(&death_r), 5),
        ];
        if let Some(r) = &block_r {
            placements.push((sys::raw(r), launch::BLOCK_FD));
        }
        for (i, fd) in seccomp.iter().enumerate() {
            placements.push((sys::raw(fd), launch::SECCOMP_FD + i as i32));
        }
        // SAFETY: child_setup and setup.apply only call async-signal-safe
        // functions (everything they use was allocated before the fork).
        unsafe {
            cmd.pre_exec(move || {
                sys::child_setup(&placements)?;
                setup.apply()
            });
        }
        let spawned = cmd.spawn();
        drop(landlock);
        let child = match spawned {
            Ok(child) => child,
            Err(err) => {
                if let Some(cg) = &cgroup {
                    cg.kill_and_remove().await;
                }
                return Err(SpawnError::Exec {
                    python: python.to_path_buf(),
                    err,
                });
            }
        };
        drop((req_r, rep_w, block_r, seccomp));
        let leader = child.id().expect("a just-spawned child has a pid");
        // Into the cgroups while the runner starts; awaited before the
        // kernel is handed out (no cell runs outside its cgroup). Started
        // before the watcher: the first move waits out an RCU grace
        // period (~10 ms) while bwrap's sandbox waits on it, and the
        // watcher's own spawn (~3 ms) fits inside that wait instead of
        // delaying its start.
        let adopting = cgroup.as_ref().map(|cg| cg.adopt(leader, block_w));
        let watcher = sys::watch_group(leader, death_r).ok();

        let ctrl_tx = pipe::Sender::from_owned_fd(req_w).map_err(io("watch the request pipe"))?;
        let ctrl_rx = pipe::Receiver::from_owned_fd(rep_r).map_err(io("watch the reply pipe"))?;
        let stdout = pipe::Receiver::from_owned_fd(out_r).map_err(io("watch the stdout pipe"))?;
        let stderr = pipe::Receiver::from_owned_fd(err_r).map_err(io("watch the stderr pipe"))?;
        let mut proc = Process {
            id,
            pid: leader,
            leader,
            wrapped,
            cgroup,
            limits,
            counters: (0, 0),
            child: super::leader::Leader::Spawned(child),
            ctrl_tx,
            ctrl_rx,
            frames: FrameReader::with_display_limit(
                max_display_bytes(opts) + super::display::FRAME_SLACK,
            ),
            stdout,
            stderr,
            _death: death_w,
            watcher,
            staging,
            _etc: etc,
            _tools: None,
            _egress: None,
            tools_unavailable: None,
            tools_installed: None,
            execution_count: 0,
            exited: None,
            group_killed: false,
            runner: None,
        };
        proc.serve_tools(listener, opts, rpc);
        if let Some((l, policy)) = egress {
            match crate::egress::proxy::EgressProxy::start(l, policy) {
                Ok(p) => proc._egress = Some(p),
                Err(err) => {
                    proc.kill_now().await;
                    return Err(SpawnError::Io {
                        about: "serve the egress proxy socket",
                        err,
                    });
                }
            }
        }
        let hello = tokio::time::timeout(opts.spawn_timeout, proc.await_hello()).await;
        // The move must have succeeded before the kernel is handed out; a
        // failed one (which killed the kernel) explains a failed hello too.
        if let Some(adopting) = adopting {
            if matches!(hello, Ok(Ok(()))) || adopting.is_finished() {
                let moved = match adopting.await {
                    Ok(r) => r,
                    Err(e) => Err(io::Error::other(e.to_string())),
                };
                if let Err(err) = moved {
                    proc.kill_now().await;
                    return Err(SpawnError::Io {
                        about: "move the kernel into its cgroup",
                        err,
                    });
                }
            }
        }
        match hello {
            Ok(Ok(())) => {
                if wrapped {
                    // Signals (SIGINT) go to the Python inside; pid() and
                    // RSS mean the runner, as without a sandbox.
                    match launch::runner_pid(leader, depth) {
                        Some(pid) => proc.pid = pid,
                        None => {
                            proc.kill_now().await;
                            return Err(SpawnError::Handshake {
                                detail: "the sandboxed runner's pid could not be found under bwrap"
                                    .into(),
                            });
                        }
                    }
                }
                proc.pin_runner();
                Ok(proc)
            }
            Ok(Err(e)) => {
                proc.kill_now().await;
                Err(e)
            }
            Err(_) => {
                proc.kill_now().await;
                Err(SpawnError::Timeout {
                    after: opts.spawn_timeout,
                })
            }
        }
    }

    pub(super) async fn await_hello(&mut self) -> Result<(), SpawnError> {
        let mut stderr_tail = Vec::new();
        let mut buf = vec![0u8; 16 * 1024];
        // A pipe at EOF is always readable: stop polling it, or this loop
        // would spin without ever letting the runtime reap the child.
        let (mut ctrl_eof, mut err_eof) = (false, false);
        loop {
            tokio::select! {
                r = self.ctrl_rx.readable(), if !ctrl_eof => {
                    r.map_err(|err| SpawnError::Io { about: "read the runner's hello", err })?;
                    match self.ctrl_rx.try_read(&mut buf) {
                        Ok(0) => ctrl_eof = true,
                        Ok(n) => self.frames.extend(&buf[..n]),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                        Err(err) => return Err(SpawnError::Io { about: "read the runner's hello", err }),
                    }
                    match self.frames.next_frame() {
                        Ok(Some(f)) if f.text("op").as_deref() == Some("hello") => {
                            if let Some(skipped) = f.text("preload_skipped") {
                                eprintln!("cellhost: kernel {}: preload skipped {skipped}", self.id);
                            }
                            return check_version(&f);
                        }
                        Ok(Some(_)) | Err(_) => return Err(SpawnError::Handshake {
                            detail: "the runner sent something other than its hello".into(),
                        }),
                        Ok(None) => {}
                    }
                }
                r = self.stderr.readable(), if !err_eof => {
                    if r.is_err() {
                        err_eof = true;
                    } else if let Ok(n) = self.stderr.try_read(&mut buf) {
                        err_eof = n == 0;
                        {
                            stderr_tail.extend_from_slice(&buf[..n]);
                            let keep = stderr_tail.len().saturating_sub(4096);
                            stderr_tail.drain(..keep);
                        }
                    }
                }
                status = self.child.wait() => {
                    // Collect what it said on the way out.
                    while let Ok(n) = self.stderr.try_read(&mut buf) {
                        if n == 0 { break; }
                        stderr_tail.extend_from_slice(&buf[..n]);
                    }
                    let exit = status.map_or(Exit::Unknown, Exit::from_status).unwrapped(self.wrapped);
                    self.exited = Some(exit);
                    let tail = String::from_utf8_lossy(&stderr_tail);
                    let tail = tail.trim();
                    let mut start = tail.len().saturating_sub(2000);
                    while !tail.is_char_boundary(start) {
                        start += 1;
                    }
                    let tail = &tail[start..];
                    return Err(SpawnError::DiedAtStart { exit: exit.describe(), stderr_tail: tail.to_string() });
                }
            }
        }
    }

    /// The process group id (we start each runner in a new session).
    pub(crate) fn staging(&self) -> &Path {
        &self.staging
    }

    pub(crate) fn watcher_pid(&self) -> Option<u32> {
        self.watcher.as_ref().and_then(|w| w.id())
    }

    pub(crate) fn pgid(&self) -> u32 {
        self.leader
    }

    pub(crate) fn signal(&self, sig: Signal) {
        if self.exited.is_some() {
            return;
        }
        match &self.runner {
            Some(fd) => {
                let _ = sys::pidfd_signal(std::os::fd::AsFd::as_fd(fd), sig as i32);
            }
            None => sys::signal_pid(self.pid, sig),
        }
    }

    /// Hold a pidfd on the runner now that `pid` names it (see `runner`).
    /// Without one (the runner already gone, or no pidfds) signals go by
    /// pid, as before.
    pub(super) fn pin_runner(&mut self) {
        self.runner = sys::pidfd_open(self.pid).ok();
    }

    /// Teardown: SIGTERM to the group, `grace`, then SIGKILL to whatever is
    /// left of the group, wait, and remove the staging dir.
    pub(crate) async fn terminate(mut self, grace: Duration) -> Option<Exit> {
        if self.exited.is_none() && self.child.holds_pid() {
            sys::signal_group(self.pgid(), Signal::SIGTERM);
            if let Ok(status) = tokio::time::timeout(grace, self.child.wait()).await {
                self.exited = Some(status.map_or(Exit::Unknown, Exit::from_status));
            }
        }
        self.kill_now().await;
        self.exited
    }

    /// SIGKILL the whole group and reap the runner. Idempotent: the group
    /// is signalled once, so a later call (the usual teardown after a kill
    /// mid-cell) never signals a group id that may have been reused.
    pub(crate) async fn kill_now(&mut self) {
        if self.group_killed {
            return;
        }
        self.group_killed = true;
        // The watcher first: once the group is gone its pgid could be
        // reused, and the watcher must never signal a stranger.
        if let Some(mut w) = self.watcher.take() {
            let _ = w.start_kill();
            let _ = w.wait().await;
        }
        if self.child.holds_pid() {
            sys::signal_group(self.pgid(), Signal::SIGKILL);
        }
        if self.exited.is_none() {
            let status = self.child.wait().await;
            self.exited = Some(status.map_or(Exit::Unknown, Exit::from_status));
        }
        if let Some(cg) = &self.cgroup {
            cg.kill_and_remove().await;
        }
        super::staging::remove(&self.staging);
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // Backstop for paths that never reached terminate(): never leave the
        // group running. kill_on_drop reaps the leader.
        if self.exited.is_none() && self.child.holds_pid() {
            sys::signal_group(self.pgid(), Signal::SIGKILL);
        }
        super::staging::remove(&self.staging);
    }
}

/// The per-display cap, within what a frame may carry.
pub(crate) fn max_display_bytes(opts: &KernelOptions) -> usize {
    let most = super::frame::MAX_FRAME - super::display::FRAME_SLACK;
    opts.display.max_display_bytes.min(most)
}

fn check_version(hello: &Frame) -> Result<(), SpawnError> {
    let version = hello.text("version").unwrap_or_default();
    let mut parts = version.split('.').filter_map(|p| p.parse::<u32>().ok());
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if (major, minor) < (3, 8) {
        return Err(SpawnError::TooOld { version });
    }
    Ok(())
}

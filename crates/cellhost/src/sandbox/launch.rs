//! Turning kernel options into the command that starts a runner: plain
//! Python, or Python under bubblewrap; plus what the forked child does
//! before exec (set rlimits, enforce Landlock); the move into cgroups happens
//! from the host while the process starts (`cgroup.rs`).

use std::collections::HashMap;
use std::ffi::OsString;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

pub(crate) use super::bwrap::find_program;
use super::bwrap::{self, Plan};
use super::cgroup::KernelCgroup;
use super::limits::{Limit, ResourceLimits, Rlimits};
use super::{etc, landlock, seccomp};
use super::{Sandbox, SandboxError, StrictSandbox, STAGING_IN_SANDBOX, WORKSPACE_IN_SANDBOX};
use crate::env::ChildEnv;

/// Host-side paths of the variables a strict kernel gets its own value of.
const HOST_PATH_VARS: &[&str] = &["HOME", "TMPDIR", "TMP", "TEMP", "XDG_RUNTIME_DIR"];

/// A command ready to spawn, and what comes with it.
pub(crate) struct Launch {
    pub cmd: tokio::process::Command,
    pub setup: ChildSetup,
    /// The kernel's cgroups (removed at teardown).
    pub cgroup: Option<KernelCgroup>,
    /// The runner runs under bwrap: the host's child is bwrap, and the
    /// runner is its grandchild (its child, for a strict template).
    pub wrapped: bool,
    /// How many generations below the host's child the runner is: 0
    /// unwrapped, 2 under bwrap (bwrap, the pid namespace's init, the
    /// runner), 1 for a strict template (no pid namespace of its own).
    pub depth: usize,
    /// How each limit is enforced, for the sentences naming a breach.
    pub limits: EnforcedLimits,
    /// Keeps the Landlock ruleset fd open until the child has forked.
    pub landlock: Option<landlock::Prepared>,
    /// Under bwrap with cgroups: the pipe bwrap's sandbox child blocks on
    /// (`--block-fd`, read end placed at [`BLOCK_FD`]) until it has been
    /// moved into the cgroups.
    pub block: Option<(OwnedFd, OwnedFd)>,
    /// Under bwrap: the read ends of pipes holding the seccomp programs,
    /// placed at [`SECCOMP_FD`], [`SECCOMP_FD`] + 1, ... in the child.
    pub seccomp: Vec<OwnedFd>,
    /// Under bwrap: the sandbox's `/etc` template, held while the kernel
    /// lives (the last one gone removes it).
    pub etc: Option<std::sync::Arc<etc::Template>>,
}

/// Where the `--block-fd` read end goes in the child.
pub(crate) const BLOCK_FD: i32 = 6;
/// Where the first seccomp program's fd goes in the child.
pub(crate) const SECCOMP_FD: i32 = 7;

/// The limits in force, as they will be named in errors.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct EnforcedLimits {
    pub memory: Option<Limit>,
    pub cpu: Option<Limit>,
    pub processes: Option<Limit>,
    pub open_files: Option<Limit>,
    pub file_size: Option<Limit>,
}

/// What the forked child does before exec (async-signal-safe only: all
/// allocation happened before the fork).
#[derive(Debug, Clone)]
pub(crate) struct ChildSetup {
    rlimits: Rlimits,
    landlock_fd: Option<i32>,
}

impl ChildSetup {
    pub(crate) fn apply(&self) -> io::Result<()> {
        self.rlimits.apply()?;
        if let Some(fd) = self.landlock_fd {
            landlock::enforce(fd)?;
        }
        Ok(())
    }
}

/// What the launch needs to know about one kernel.
pub(crate) struct Spec<'a> {
    pub id: &'a str,
    pub python: &'a Path,
    pub staging: &'a Path,
    pub script: &'a Path,
    pub env: &'a ChildEnv,
    pub cwd: Option<&'a Path>,
    pub sandbox: &'a Sandbox,
    pub workspace: Option<&'a Path>,
    pub limits: &'a ResourceLimits,
    /// Set after the allow-listed env (the tool token).
    pub extra_env: &'a [(&'a str, &'a str)],
    /// The session's package dir on the host (bound read-only at
    /// [`crate::packages::PACKAGES_IN_SANDBOX`] under the strict profile).
    pub packages: Option<&'a Path>,
    /// Modules the runner imports before its hello.
    pub preload: &'a [String],
    /// Warm the preloaded modules up before the hello.
    pub warmup: bool,
}

/// The limits `l` put in force (`mem_cgroup`: memory is the cgroup's),
/// to name a breach.
pub(crate) fn enforced(l: &ResourceLimits, mem_cgroup: bool) -> EnforcedLimits {
    EnforcedLimits {
        memory: l.memory_bytes.map(|bytes| Limit::Memory {
            bytes,
            cgroup: mem_cgroup,
        }),
        cpu: l
            .cpu_seconds_per_cell
            .map(|seconds| Limit::CpuPerCell { seconds }),
        processes: l.max_processes.map(|max| Limit::Processes { max }),
        open_files: l.max_open_files.map(|max| Limit::OpenFiles { max }),
        file_size: l.max_file_size_bytes.map(|bytes| Limit::FileSize { bytes }),
    }
}

pub(crate) fn prepare(s: &Spec<'_>) -> Result<Launch, SandboxError> {
    let cg = s
        .limits
        .cgroups
        .then(|| KernelCgroup::create(s.id, s.limits.memory_bytes, s.limits.max_processes))
        .flatten();
    let mem_cgroup = cg.as_ref().is_some_and(|c| c.limits_memory());
    let pids_cgroup = cg.as_ref().is_some_and(|c| c.limits_processes());
    let l = s.limits;
    let limits = enforced(l, mem_cgroup);
    let mut runner_args: Vec<OsString> = Vec::new();
    if let Some(cpu) = l.cpu_seconds_per_cell {
        runner_args.push(format!("--cpu-per-cell={cpu}").into());
    }
    if let Sandbox::Strict(StrictSandbox {
        egress: Some(_), ..
    }) = s.sandbox
    {
        runner_args.push(
            format!(
                "--egress={STAGING_IN_SANDBOX}/{}",
                crate::egress::proxy::SOCKET_NAME
            )
            .into(),
        );
    }
    let template = matches!(s.sandbox, Sandbox::Strict(strict) if strict.template.0);
    if template {
        runner_args.push("--template=strict".into());
    }
    if !s.preload.is_empty() {
        runner_args.push(format!("--preload={}", s.preload.join(",")).into());
        if s.warmup {
            runner_args.push("--warmup".into());
        }
    }
    if let Some(dir) = s.packages {
        let mut arg = OsString::from("--packages=");
        match s.sandbox {
            Sandbox::None => arg.push(dir),
            Sandbox::Strict(_) => arg.push(crate::packages::PACKAGES_IN_SANDBOX),
        }
        runner_args.push(arg);
    } else if template {
        // Where its forks' package dirs are mounted: on every fork's path.
        let mut arg = OsString::from("--packages=");
        arg.push(crate::packages::PACKAGES_IN_SANDBOX);
        runner_args.push(arg);
    }
    let mut setup = ChildSetup {
        rlimits: Rlimits::plan(l, !mem_cgroup, !pids_cgroup),
        landlock_fd: None,
    };
    let mut block = None;
    let mut seccomp = Vec::new();
    let mut etc_template = None;
    let (cmd, wrapped, prepared) =
        match s.sandbox {
            Sandbox::None => {
                let mut cmd = tokio::process::Command::new(s.python);
                cmd.arg(s.script)
                    .args(&runner_args)
                    .env_clear()
                    .envs(s.env.vars.iter().map(|(k, v)| (k, v)))
                    .envs(s.extra_env.iter().copied());
                if let Some(cwd) = s.cwd {
                    cmd.current_dir(cwd);
                }
                (cmd, false, None)
            }
            Sandbox::Strict(strict) => {
                if cg.is_some() {
                    block = Some(nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(
                        |e| SandboxError::Io {
                            about: "create the sandbox's start pipe",
                            err: e.into(),
                        },
                    )?);
                }
                let rlimit_memory = l.memory_bytes.is_some() && !mem_cgroup;
                // A template's forks load the filter themselves.
                if !strict.bench_omit.seccomp && !template {
                    seccomp = seccomp_pipes(rlimit_memory)?;
                }
                let (cmd, prepared, etc) =
                    strict_command(s, strict, runner_args, block.is_some(), seccomp.len())?;
                etc_template = etc;
                setup.landlock_fd = prepared.as_ref().map(|p| p.raw_fd());
                (cmd, true, prepared)
            }
        };
    Ok(Launch {
        cmd,
        setup,
        cgroup: cg,
        wrapped,
        depth: match (wrapped, template) {
            (false, _) => 0,
            (true, false) => 2,
            (true, true) => 1,
        },
        limits,
        landlock: prepared,
        block,
        seccomp,
        etc: etc_template,
    })
}

/// A pipe per seccomp program, filled and with its write end closed, so
/// bwrap reads each to its end.
fn seccomp_pipes(rlimit_memory: bool) -> Result<Vec<OwnedFd>, SandboxError> {
    let programs =
        seccomp::programs(rlimit_memory).map_err(|e| SandboxError::Seccomp { detail: e.0 })?;
    let io = |err: nix::Error| SandboxError::Io {
        about: "pass the seccomp filter to bwrap",
        err: err.into(),
    };
    let mut out = Vec::new();
    for program in &programs.programs {
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io)?;
        // A pipe holds 64 KiB; a program is a few hundred bytes.
        let mut file = std::fs::File::from(w);
        std::io::Write::write_all(&mut file, program).map_err(|err| SandboxError::Io {
            about: "pass the seccomp filter to bwrap",
            err,
        })?;
        out.push(r);
    }
    Ok(out)
}

/// The bwrap command, the Landlock ruleset it enforces, and the `/etc`
/// template it binds (`None`: the host's `/etc`, benches only).
type StrictCommand = (
    tokio::process::Command,
    Option<landlock::Prepared>,
    Option<std::sync::Arc<etc::Template>>,
);

fn strict_command(
    s: &Spec<'_>,
    strict: &StrictSandbox,
    runner_args: Vec<OsString>,
    blocked: bool,
    seccomp_programs: usize,
) -> Result<StrictCommand, SandboxError> {
    let bwrap = bwrap::find_program("bwrap").ok_or(SandboxError::BwrapMissing)?;
    let root = nix::unistd::geteuid().is_root();
    let template = strict.template.0;
    if template && !root {
        return Err(SandboxError::Io {
            about: "start a strict template",
            err: io::Error::new(
                io::ErrorKind::PermissionDenied,
                "only a host running as root starts strict templates",
            ),
        });
    }
    // The user the kernel runs as: the configured one when the host is
    // root, else the host user (bwrap maps it to itself).
    let (uid, gid) = if root {
        (strict.uid, strict.gid)
    } else {
        (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        )
    };
    let etc_io = |err| SandboxError::Io {
        about: "build the sandbox's /etc",
        err,
    };
    let etc_dir = if strict.bench_omit.built_etc {
        None
    } else {
        etc::write(s.staging, uid, gid, strict.network).map_err(etc_io)?;
        Some(etc::template(s.staging.parent().unwrap_or(s.staging)).map_err(etc_io)?)
    };
    let setpriv = if root && !template {
        if strict.uid == 0 || strict.gid == 0 {
            return Err(SandboxError::RootKernel {
                uid: strict.uid,
                gid: strict.gid,
            });
        }
        hand_staging_to(s.staging, strict.uid, strict.gid).map_err(|err| SandboxError::Io {
            about: "hand the staging dir to the kernel uid",
            err,
        })?;
        Some(
            bwrap::find_program("setpriv")
                .ok_or(SandboxError::SetprivMissing { uid: strict.uid })?,
        )
    } else {
        None
    };
    // A template has a tmpfs of its own there (its forks mount theirs).
    let workspace = match s.workspace {
        Some(dir) => Some(dir),
        None if template => None,
        None => {
            return Err(SandboxError::Io {
                about: "find the kernel's workspace",
                err: io::Error::new(io::ErrorKind::NotFound, "no workspace was prepared"),
            })
        }
    };
    let prefixes = prefixes(s.python)?;
    // `-s`: no user site dir. HOME is the workspace, so a cell could plant
    // a `usercustomize.py` there that would run at every later start.
    let mut command: Vec<OsString> = vec![
        s.python.into(),
        "-s".into(),
        Path::new(STAGING_IN_SANDBOX).join("runner.py").into(),
    ];
    command.extend(runner_args);
    let seccomp_fds: Vec<i32> = (0..seccomp_programs as i32)
        .map(|i| SECCOMP_FD + i)
        .collect();
    let plan = Plan {
        strict,
        staging: s.staging,
        workspace,
        prefixes: &prefixes,
        cwd: s.cwd,
        setpriv: setpriv.as_deref(),
        block_fd: blocked.then_some(BLOCK_FD),
        command,
        tmp_bytes: s.limits.memory_bytes,
        packages: s.packages,
        seccomp_fds: &seccomp_fds,
        etc: etc_dir.as_ref().map_or(Path::new("/etc"), |t| &t.dir),
        template,
    };
    let mut cmd = tokio::process::Command::new(&bwrap);
    cmd.args(bwrap::args(&plan))
        .env_clear()
        .envs(
            s.env
                .vars
                .iter()
                .filter(|(k, _)| !HOST_PATH_VARS.iter().any(|h| k == h))
                .map(|(k, v)| (k, v)),
        )
        .env("HOME", WORKSPACE_IN_SANDBOX)
        .env("TMPDIR", "/tmp")
        .envs(s.extra_env.iter().copied());
    // With the egress proxy the runner listens on the sandbox's own
    // loopback (the namespace has no route out). A template's forks each
    // enforce a ruleset of their own (`rehome.rs`).
    let landlock = if template {
        None
    } else {
        landlock::prepare(strict.network || strict.egress.is_some())
    };
    Ok((cmd, landlock, etc_dir))
}

/// Hand a kernel's staging dir and the files in it (runner.py,
/// display.py, the sockets, `etc/`) to its uid: the runner reads them.
/// lchown never follows a link.
pub(crate) fn hand_staging_to(staging: &Path, uid: u32, gid: u32) -> io::Result<()> {
    let mut paths = vec![staging.to_path_buf()];
    for entry in std::fs::read_dir(staging)? {
        paths.push(entry?.path());
    }
    for p in paths {
        std::os::unix::fs::lchown(&p, Some(uid), Some(gid))?;
    }
    Ok(())
}

/// Create the workspace when missing. A workspace owned by the host
/// user (e.g. just created by us, or by a session manager running as
/// root) is handed to the kernel uid; one owned by someone else is left
/// as it is. Never follows a symlink at the last component.
pub(crate) fn ensure_workspace(dir: &Path, strict: &StrictSandbox) -> Result<(), SandboxError> {
    let err = |err| SandboxError::Workspace {
        path: dir.to_path_buf(),
        err,
    };
    if !dir.exists() {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(err)?;
    }
    let meta = std::fs::symlink_metadata(dir).map_err(err)?;
    if !meta.is_dir() {
        return Err(err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "it is not a directory (symlinks are not followed)",
        )));
    }
    let me = nix::unistd::geteuid();
    if me.is_root() && meta.uid() == 0 && strict.uid != 0 {
        std::os::unix::fs::lchown(dir, Some(strict.uid), Some(strict.gid)).map_err(err)?;
    }
    Ok(())
}

/// The host dirs an interpreter needs: its `sys.prefix`, `base_prefix`,
/// `exec_prefix` and `base_exec_prefix` (a venv and the Python it was
/// made from). Asked once per interpreter per host process.
pub(crate) fn prefixes(python: &Path) -> Result<Vec<PathBuf>, SandboxError> {
    static CACHE: OnceLock<Mutex<HashMap<PathBuf, Vec<PathBuf>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(hit) = cache.lock().expect("prefix cache").get(python) {
        return Ok(hit.clone());
    }
    let fail = |detail: String| SandboxError::Prefixes {
        python: python.to_path_buf(),
        detail,
    };
    let out = std::process::Command::new(python)
        .args([
            // Not -S: site.py is what makes sys.prefix a venv's dir.
            "-I",
            "-c",
            "import sys; print(sys.prefix); print(sys.base_prefix); print(sys.exec_prefix); print(sys.base_exec_prefix)",
        ])
        .env_clear()
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| fail(e.to_string()))?;
    if !out.status.success() {
        return Err(fail(format!(
            "it exited with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let mut dirs: Vec<PathBuf> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with('/'))
        .map(PathBuf::from)
        .collect();
    // Not the interpreter's own dir: it may be a home's bin dir full of
    // other files (bwrap.rs makes the interpreter path itself visible).
    dirs.sort();
    dirs.dedup();
    cache
        .lock()
        .expect("prefix cache")
        .insert(python.to_path_buf(), dirs.clone());
    Ok(dirs)
}

/// The host pid of the runner `depth` generations below the host's child
/// (under bwrap, 2: bwrap's child is the pid namespace's init, whose
/// child is the runner).
pub(crate) fn runner_pid(leader: u32, depth: usize) -> Option<u32> {
    (0..depth).try_fold(leader, |pid, _| crate::sys::children(pid).first().copied())
}

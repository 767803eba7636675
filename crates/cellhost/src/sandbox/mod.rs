//! Sandboxing and resource limits for local kernels.
//!
//! Agent code is untrusted. Two profiles:
//!
//! - [`Sandbox::None`]: the kernel runs as the host user with the host's
//!   filesystem and network (the resource limits still apply).
//! - [`Sandbox::Strict`]: the kernel runs under bubblewrap (`bwrap`, found
//!   on PATH at run time) in new pid, ipc, uts, network and mount
//!   namespaces (and a new user namespace when the host is not root), as
//!   an unprivileged uid when the host is root (one per session's
//!   workspace, from [`StrictSandbox::uid_range`]), under a seccomp
//!   filter, with system dirs read-only, a minimal `/etc` built for it,
//!   a private `/tmp`, a private writable workspace at `/workspace`, the
//!   kernel's own staging dir read-only at [`STAGING_IN_SANDBOX`], and
//!   nothing else of the host. Landlock adds a network and signal/abstract
//!   socket scope layer where the kernel supports it.
//!
//! [`ResourceLimits`] apply in both profiles: per-kernel cgroups (v1 or v2)
//! for memory and process count where this host has a writable hierarchy,
//! rlimits otherwise and for open files and file size, and a per-cell CPU
//! limit set by the runner at the start of each cell.
//!
//! Layout: the bwrap argv in `bwrap.rs`, the sandbox's `/etc` in `etc.rs`,
//! the seccomp filters in `seccomp.rs`, rlimits and the limit sentences in
//! `limits.rs`, cgroups in `cgroup.rs`, Landlock in `landlock.rs`, and
//! `launch.rs` puts them together into a command for `kernel/process.rs`.
//! `docs/sandbox.md` describes the strict profile as a whole.

pub(crate) mod bwrap;
pub(crate) mod cgroup;
pub(crate) mod etc;
mod landlock;
pub(crate) mod launch;
mod limits;
pub(crate) mod rehome;
pub(crate) mod seccomp;

use std::path::PathBuf;

pub(crate) use limits::Limit;
pub use limits::ResourceLimits;

/// Where the kernel's staging dir (runner script, future RPC socket) is
/// mounted inside a strict sandbox, read-only.
pub const STAGING_IN_SANDBOX: &str = "/run/cellhost/kernel";
/// Where the workspace is mounted inside a strict sandbox (also the
/// default cwd and `HOME`).
pub const WORKSPACE_IN_SANDBOX: &str = "/workspace";

/// The sandbox profile of a kernel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Sandbox {
    /// No isolation: the kernel sees what the host user sees.
    #[default]
    None,
    /// bubblewrap isolation (see the module docs).
    Strict(StrictSandbox),
}

impl Sandbox {
    /// The strict profile with its defaults.
    pub fn strict() -> Sandbox {
        Sandbox::Strict(StrictSandbox::default())
    }

    /// `true` for [`Sandbox::Strict`].
    pub fn is_strict(&self) -> bool {
        matches!(self, Sandbox::Strict(_))
    }

    /// `"none"` or `"strict"`.
    pub fn name(&self) -> &'static str {
        match self {
            Sandbox::None => "none",
            Sandbox::Strict(_) => "strict",
        }
    }

    /// The kernel's network as the runner's hints and `/v1/environment`
    /// name it: `"off"` (a strict kernel's private loopback only) or
    /// `"host"` (the host's network: no sandbox, or `network = true`).
    pub fn network_mode(&self) -> &'static str {
        match self {
            Sandbox::Strict(s) if !s.network => "off",
            _ => "host",
        }
    }
}

/// Settings of the strict profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StrictSandbox {
    /// Keep the host's network (default: no network, only a private `lo`).
    pub network: bool,
    /// The session's writable workspace on the host, mounted at
    /// [`WORKSPACE_IN_SANDBOX`]. Created when missing (owned by the kernel
    /// uid) and never deleted by the kernel. `None`: a private one per
    /// kernel handle, removed when the kernel is shut down.
    pub workspace: Option<PathBuf>,
    /// The uid and gid kernels run as when the host is root (default
    /// 65534, `nobody`/`nogroup`). Ignored when the host is not root: the
    /// kernel then runs as the host user inside a new user namespace.
    pub uid: u32,
    /// The gid that goes with [`uid`](StrictSandbox#structfield.uid).
    pub gid: u32,
    /// Host root only, with a manager assigning workspaces: each workspace
    /// gets its own uid (and gid) from this inclusive range, recorded as
    /// the workspace dir's owner, so no per-uid quota (inotify, keyrings,
    /// mqueues, signals, `RLIMIT_NPROC`) is shared between sessions.
    /// Default 200000..=265535; `None`: every kernel runs as `uid`/`gid`.
    pub uid_range: Option<(u32, u32)>,
    /// Extra host paths mounted read-only at the same path.
    pub ro_binds: Vec<PathBuf>,
    /// `network = "allowlist"`: no network of its own (`network` is
    /// false), only the host's egress proxy under this policy (see
    /// [`crate::egress`]).
    pub egress: Option<std::sync::Arc<crate::egress::EgressPolicy>>,
    /// Benchmarks only: layers left out to measure what they cost.
    #[doc(hidden)]
    pub bench_omit: BenchOmit,
    /// Set on a strict template's own options only (docs/templates.md,
    /// "Strict kernels"): it starts as root with the capabilities its
    /// forks need to sandbox themselves. Not settable outside this crate.
    #[doc(hidden)]
    pub template: TemplateRole,
}

/// Whether a strict kernel is a warm template (`kernel/template.rs`).
/// Only this crate sets it.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TemplateRole(pub(crate) bool);

/// Benchmarks only (`cellhost-bench sandbox`): parts of the strict
/// profile a bench leaves out to measure what they cost in the spawn path
/// and on warm cells. Not settable from any config; a default (nothing
/// left out) is the only value production code ever uses.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BenchOmit {
    /// No seccomp filter (before the hardening).
    pub(crate) seccomp: bool,
    /// The host's `/etc` bound read-only instead of the built one (before
    /// the hardening).
    pub(crate) built_etc: bool,
}

/// The default [`StrictSandbox::uid_range`].
pub const DEFAULT_UID_RANGE: (u32, u32) = (200_000, 265_535);

impl Default for StrictSandbox {
    fn default() -> Self {
        StrictSandbox {
            network: false,
            workspace: None,
            uid: 65534,
            gid: 65534,
            uid_range: Some(DEFAULT_UID_RANGE),
            ro_binds: Vec::new(),
            egress: None,
            bench_omit: BenchOmit::default(),
            template: TemplateRole::default(),
        }
    }
}

impl StrictSandbox {
    /// Keep the host's network (`true`) or give the kernel only a private
    /// loopback (`false`, the default).
    pub fn network(mut self, on: bool) -> Self {
        self.network = on;
        self
    }

    /// Mount this host dir as the writable workspace (created when missing;
    /// never deleted by the kernel).
    pub fn workspace(mut self, dir: impl Into<PathBuf>) -> Self {
        self.workspace = Some(dir.into());
        self
    }

    /// Run kernels as `uid`:`gid` when the host is root (ignored otherwise).
    pub fn user(mut self, uid: u32, gid: u32) -> Self {
        self.uid = uid;
        self.gid = gid;
        self
    }

    /// Per-workspace uids from `lo..=hi` (`None`: one uid for all).
    pub fn uid_range(mut self, range: Option<(u32, u32)>) -> Self {
        self.uid_range = range;
        self
    }

    /// Also mount the host path `path` read-only at the same path (for
    /// example a data set or a shared venv).
    pub fn ro_bind(mut self, path: impl Into<PathBuf>) -> Self {
        self.ro_binds.push(path.into());
        self
    }

    /// Benchmarks only: no seccomp filter, to measure what it costs.
    #[doc(hidden)]
    pub fn bench_without_seccomp(mut self) -> Self {
        self.bench_omit.seccomp = true;
        self
    }

    /// Benchmarks only: the host's `/etc` bound read-only, as before the
    /// hardening, instead of the built one, to measure what it costs.
    #[doc(hidden)]
    pub fn bench_with_host_etc(mut self) -> Self {
        self.bench_omit.built_etc = true;
        self
    }
}

/// Why a sandboxed kernel could not be prepared.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SandboxError {
    /// No `bwrap` on PATH.
    #[error("the strict sandbox needs bubblewrap, but no `bwrap` was found on PATH; install it (Debian: apt-get install bubblewrap) or use the `none` sandbox profile")]
    BwrapMissing,
    /// The host is root and no `setpriv` was found to drop to the kernel uid.
    #[error("the strict sandbox needs `setpriv` (util-linux) to drop to uid {uid} when the host runs as root, but it was not found; install util-linux")]
    SetprivMissing {
        /// The uid the kernel was to run as.
        uid: u32,
    },
    /// The configured kernel uid or gid is 0.
    #[error("the strict sandbox must not run kernels as root: set [sandbox] uid/gid to an unprivileged user (got uid {uid}, gid {gid})")]
    RootKernel {
        /// The configured uid.
        uid: u32,
        /// The configured gid.
        gid: u32,
    },
    /// The workspace dir could not be created or given to the kernel uid.
    #[error("failed to prepare the workspace {} (choose a directory the host can create and own)", path.display())]
    Workspace {
        /// The workspace dir on the host.
        path: PathBuf,
        /// Why it could not be prepared.
        #[source]
        err: std::io::Error,
    },
    /// The seccomp filter could not be compiled for this architecture.
    #[error("the strict sandbox's seccomp filter could not be built ({detail}); use the `none` sandbox profile on this architecture")]
    Seccomp {
        /// The filter compiler's error.
        detail: String,
    },
    /// Every uid of [`StrictSandbox::uid_range`] is taken.
    #[error("no free uid left in [sandbox] uid_range {lo}..={hi} (every one owns a workspace or a host account); widen the range or remove unused sessions")]
    UidRangeFull {
        /// The range's first uid.
        lo: u32,
        /// The range's last uid (inclusive).
        hi: u32,
    },
    /// The interpreter could not say where its installation lives
    /// (`sys.prefix` and friends, which the sandbox mounts read-only).
    #[error("failed to ask {} for its prefixes: {detail}", python.display())]
    Prefixes {
        /// The interpreter asked.
        python: PathBuf,
        /// Why the answer is missing (exec error, exit status, output).
        detail: String,
    },
    /// Another host-side step of the sandbox setup failed.
    #[error("failed to {about}")]
    Io {
        /// What was being done, as a verb phrase ("write the seccomp filter").
        about: &'static str,
        /// The operating system's error.
        #[source]
        err: std::io::Error,
    },
}

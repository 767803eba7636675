//! How a [`KernelManager`](super::KernelManager) runs kernels, and where it
//! keeps its files.

use std::path::{Path, PathBuf};
use std::time::Duration;

use std::collections::BTreeMap;

use crate::config::{BackendConfig, Config, LifecycleConfig};
use crate::kernel::KernelOptions;
use crate::sandbox::{Sandbox, SandboxError, StrictSandbox};
use crate::tools::ToolSet;

/// How the manager runs kernels. `ManagerOptions::new(data_dir)` gives the
/// documented defaults.
#[derive(Debug, Clone)]
pub struct ManagerOptions {
    /// Template for every kernel (interpreter, env, limits, runtime dir).
    pub kernel: KernelOptions,
    /// Most live owned kernels (the warm pool is extra). Default 32.
    pub max_kernels: usize,
    /// Idle time after which a kernel is reaped; `None`: never. Default 1800 s.
    pub idle_timeout: Option<Duration>,
    /// How often the background pass reaps; default
    /// min(300, max(30, idle_timeout / 6)) s.
    pub reap_interval: Option<Duration>,
    /// Spawned, idle, unowned kernels kept ready. Default 2.
    pub warm_pool: usize,
    /// Where live-kernel records are kept (`<data_dir>/live`).
    pub data_dir: PathBuf,
    /// Staging dirs older than this are swept at start. Default 7 days.
    pub stale_staging_age: Duration,
    /// Remote backends by name (`[backends.NAME]`); see [`crate::remote`].
    pub backends: BTreeMap<String, BackendConfig>,
    /// The backend of cells whose spec names none (`None`: `"local"`).
    pub default_backend: Option<String>,
    /// The agent's tools. A kernel's tool set (its key's) is a subset,
    /// and its cells call them through the `tools` module.
    pub tools: ToolSet,
    /// `[kernel] preload`: modules pooled kernels import before they are
    /// handed out.
    pub preload: Vec<String>,
    /// `[kernel] warmup` (default on): pooled kernels warm their
    /// preloaded modules up (see [`KernelOptions::warmup`]).
    pub warmup: bool,
    /// `[kernel] template` (default on): new local kernels that can be
    /// (not strict, no packages in their package dir yet) are forks of a
    /// warm template of their flavour, which has imported the runner and
    /// `preload` once (docs/templates.md).
    pub templates: bool,
    /// Bytes a session's workspace may hold (`[limits] workspace_mib`,
    /// default 4096 MiB); `None`: unlimited. Uploads respect it.
    pub workspace_quota: Option<u64>,
    /// Each workspace on a loop-mounted filesystem of its own sized to the
    /// quota (`[limits] workspace_fs`, default on): the kernel's
    /// filesystem stops a cell's writes past it. Where the host cannot
    /// (not root, no loop devices, no `mkfs.ext4`) or there is no quota,
    /// [`KernelManager::start`](super::KernelManager::start) turns it off
    /// and says why ([`workspace_fs_warning`](super::KernelManager::workspace_fs_warning)).
    pub workspace_fs: bool,
    /// Events queued per session watcher before it is dropped as too slow
    /// (see [`crate::events`]). Default 256.
    pub event_buffer: usize,
    /// Snapshot a local kernel's state when it is evicted, reaped or shut
    /// down, and restore it on the session's next cell, with at most this
    /// many bytes of snapshot stream (`None`, the library's default:
    /// off; the daemon's `[lifecycle] snapshots` default is on). See
    /// docs/snapshots.md.
    pub snapshots: Option<u64>,
    /// How long one snapshot or restore may take (`[snapshots]
    /// timeout_seconds`, default 60 s): past it the runner is interrupted
    /// (killed after the interrupt grace) and nothing is kept. It bounds
    /// a shutdown's snapshots too (they run concurrently).
    pub snapshot_timeout: Duration,
}

impl ManagerOptions {
    /// The documented defaults, keeping records, workspaces and caches
    /// under `data_dir`.
    pub fn new(data_dir: impl Into<PathBuf>) -> ManagerOptions {
        let defaults = LifecycleConfig::default();
        ManagerOptions {
            kernel: KernelOptions::default(),
            max_kernels: defaults.max_kernels,
            idle_timeout: defaults.idle_timeout(),
            reap_interval: None,
            warm_pool: defaults.warm_pool,
            data_dir: data_dir.into(),
            stale_staging_age: Duration::from_secs(7 * 24 * 3600),
            backends: BTreeMap::new(),
            default_backend: None,
            tools: ToolSet::new(),
            preload: Vec::new(),
            warmup: true,
            templates: true,
            workspace_quota: crate::config::LimitsConfig::default().workspace_quota(),
            workspace_fs: true,
            event_buffer: crate::events::DEFAULT_WATCHER_BUFFER,
            snapshots: None,
            snapshot_timeout: crate::kernel::SnapshotLimits::DEFAULT_TIMEOUT,
        }
    }

    /// Snapshots on stop with at most `max_bytes` of stream, or off
    /// (`None`); see [`ManagerOptions::snapshots`].
    pub fn snapshots(mut self, max_bytes: Option<u64>) -> Self {
        self.snapshots = max_bytes;
        self
    }

    /// How long one snapshot or restore may take; see
    /// [`ManagerOptions::snapshot_timeout`].
    pub fn snapshot_timeout(mut self, timeout: Duration) -> Self {
        self.snapshot_timeout = timeout;
        self
    }

    /// The limits of one snapshot, where snapshots are on.
    pub(crate) fn snapshot_limits(&self) -> Option<crate::kernel::SnapshotLimits> {
        Some(crate::kernel::SnapshotLimits {
            max_bytes: self.snapshots?,
            timeout: self.snapshot_timeout,
        })
    }

    /// The limits of a fork's snapshot: the snapshot cap, or with
    /// snapshots off the default cap (a fork is asked for).
    pub(crate) fn fork_limits(&self) -> crate::kernel::SnapshotLimits {
        crate::kernel::SnapshotLimits {
            max_bytes: self
                .snapshots
                .unwrap_or(crate::config::SnapshotsConfig::default().max_bytes()),
            timeout: self.snapshot_timeout,
        }
    }

    /// Where snapshots are kept (`<data_dir>/snapshots`).
    pub fn snapshot_dir(&self) -> PathBuf {
        self.data_dir.join("snapshots")
    }

    /// The workspace quota in bytes (`None`: unlimited).
    pub fn workspace_quota(mut self, bytes: Option<u64>) -> Self {
        self.workspace_quota = bytes;
        self
    }

    /// Whether workspaces get a filesystem of their own (see
    /// [`ManagerOptions::workspace_fs`]).
    pub fn workspace_fs(mut self, on: bool) -> Self {
        self.workspace_fs = on;
        self
    }

    /// Whether this manager's workspaces live in volumes (decided at start).
    pub(crate) fn volumes(&self) -> bool {
        self.workspace_fs && self.workspace_quota.is_some()
    }

    /// Mount `ws`'s volume when it lies in one (see `volume.rs`).
    pub(crate) fn ensure_volume(&self, ws: &Path) -> std::io::Result<()> {
        match (super::volume::of_workspace(ws), self.workspace_quota) {
            (Some(vol), Some(quota)) if self.workspace_fs => {
                super::volume::ensure(&self.workspace_root(), vol, quota)
            }
            _ => Ok(()),
        }
    }

    /// `then`, with `ws`'s volume mounted (when it lies in one) and kept
    /// so until `then` returns (see `volume::with_mounted`).
    fn with_volume(
        &self,
        ws: &Path,
        then: impl FnOnce() -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        match (super::volume::of_workspace(ws), self.workspace_quota) {
            (Some(vol), Some(quota)) if self.workspace_fs => {
                super::volume::with_mounted(&self.workspace_root(), vol, quota, then)
            }
            _ => then(),
        }
    }

    /// Mount `ws`'s volume again if it has an image (after a restart or a
    /// disposal of its kernels, for a handle that only reads).
    pub(crate) fn remount_volume(&self, ws: &Path) {
        if let Some(vol) = super::volume::of_workspace(ws) {
            if vol.join("img").exists() {
                let _ = self.ensure_volume(ws);
            }
        }
    }

    /// Events queued per session watcher (see [`ManagerOptions::event_buffer`]).
    pub fn event_buffer(mut self, n: usize) -> Self {
        self.event_buffer = n.max(1);
        self
    }

    /// Apply `[backends.*]` and `default_backend`.
    pub fn remote(mut self, config: &Config) -> Self {
        self.backends = config.backends.clone();
        self.default_backend = config.default_backend.clone();
        self
    }

    /// Add one remote backend.
    pub fn backend(mut self, name: impl Into<String>, config: BackendConfig) -> Self {
        self.backends.insert(name.into(), config);
        self
    }

    /// The backend of cells whose spec names none.
    pub fn default_backend(mut self, name: impl Into<String>) -> Self {
        self.default_backend = Some(name.into());
        self
    }

    /// Apply a `[lifecycle]` config section.
    pub fn lifecycle(mut self, config: &LifecycleConfig) -> Self {
        self.max_kernels = config.max_kernels;
        self.idle_timeout = config.idle_timeout();
        self.warm_pool = config.warm_pool;
        self
    }

    /// Start every kernel from this template.
    pub fn kernel(mut self, kernel: KernelOptions) -> Self {
        self.kernel = kernel;
        self
    }

    /// Keep at most `n` owned kernels alive (at least 1): the least
    /// recently used idle one is evicted for a new owner.
    pub fn max_kernels(mut self, n: usize) -> Self {
        self.max_kernels = n.max(1);
        self
    }

    /// Reap kernels idle for longer than `idle` (`None`: never).
    pub fn idle_timeout(mut self, idle: Option<Duration>) -> Self {
        self.idle_timeout = idle;
        self
    }

    /// Run the background reaping pass every `every` instead of the
    /// default derived from the idle timeout.
    pub fn reap_interval(mut self, every: Duration) -> Self {
        self.reap_interval = Some(every);
        self
    }

    /// Register the agent's tools.
    pub fn tools(mut self, tools: ToolSet) -> Self {
        self.tools = tools;
        self
    }

    /// Modules pooled kernels import before they are handed out.
    pub fn preload(mut self, modules: Vec<String>) -> Self {
        self.preload = modules;
        self
    }

    /// Whether new kernels are forks of a warm template (default on); see
    /// [`ManagerOptions::templates`].
    pub fn templates(mut self, on: bool) -> Self {
        self.templates = on;
        self
    }

    /// Whether pooled kernels warm their preloaded modules up (default on).
    pub fn warmup(mut self, on: bool) -> Self {
        self.warmup = on;
        self
    }

    /// Keep `n` started, unowned kernels ready for new owners (0: none;
    /// every first cell waits for a spawn).
    pub fn warm_pool(mut self, n: usize) -> Self {
        self.warm_pool = n;
        self
    }

    /// The background pass's period.
    pub fn effective_reap_interval(&self) -> Option<Duration> {
        let idle = self.idle_timeout?;
        Some(
            self.reap_interval
                .unwrap_or_else(|| Duration::from_secs((idle.as_secs() / 6).clamp(30, 300))),
        )
    }

    pub(super) fn record_dir(&self) -> PathBuf {
        self.data_dir.join("live")
    }

    /// Where sandboxed sessions' workspaces live (`<data_dir>/workspaces`).
    pub fn workspace_root(&self) -> PathBuf {
        self.data_dir.join("workspaces")
    }

    /// The strict profile when the manager assigns workspaces (the
    /// template names none: each owner gets its own).
    fn managed_strict(&self) -> Option<&StrictSandbox> {
        match &self.kernel.sandbox {
            Sandbox::Strict(s) if s.workspace.is_none() => Some(s),
            _ => None,
        }
    }

    /// The template with its workspace set to `dir` when the manager
    /// assigns workspaces: a strict template naming none mounts `dir`
    /// and, on a root host with a uid range, runs as the workspace's own
    /// uid (allocated and the dir created on first use; see `uids.rs`;
    /// `seed`: the owner); a `none` template without a cwd runs in `dir`
    /// (made here). Otherwise the template as is.
    pub(super) fn kernel_with_workspace(
        &self,
        dir: impl FnOnce() -> PathBuf,
        seed: &str,
    ) -> Result<KernelOptions, SandboxError> {
        let mut opts = self.kernel.clone();
        if opts.packages.cache_dir.is_none() {
            opts.packages.cache_dir = Some(self.data_dir.join("pip-cache"));
        }
        if let Some(strict) = self.managed_strict() {
            let dir = dir();
            self.ensure_volume(&dir)
                .map_err(|err| SandboxError::Workspace {
                    path: dir.clone(),
                    err,
                })?;
            let strict = self.strict_for(strict, &dir, seed)?;
            opts.sandbox = Sandbox::Strict(strict.workspace(dir));
        } else if self.managed_plain() {
            let dir = dir();
            if (self.prepare_workspace())(&dir, crate::files::Need::Create).is_ok() {
                opts.cwd = Some(dir.clone());
                opts.workspace_dir = Some(dir);
            }
        }
        Ok(opts)
    }

    /// `strict` running as the uid of the workspace `dir` (allocated on
    /// first use) when the host is root and a uid range is set.
    fn strict_for(
        &self,
        strict: &StrictSandbox,
        dir: &Path,
        seed: &str,
    ) -> Result<StrictSandbox, SandboxError> {
        let mut strict = strict.clone();
        if let Some(range) = strict.uid_range {
            if nix::unistd::geteuid().is_root() {
                let uid =
                    super::uids::ensure(&self.workspace_root(), dir, range, strict.uid, seed)?;
                strict = strict.user(uid, uid);
            }
        }
        Ok(strict)
    }

    /// A `none` template without a cwd: the manager gives each owner a
    /// workspace as its cwd.
    fn managed_plain(&self) -> bool {
        matches!(self.kernel.sandbox, Sandbox::None) && self.kernel.cwd.is_none()
    }

    /// How a missing workspace is made: the owner's home 0700, the
    /// workspace 0700 owned by the strict kernel's uid (the host user
    /// under `none`).
    pub(crate) fn prepare_workspace(&self) -> crate::files::Prepare {
        let strict = self.managed_strict().cloned();
        let this = self.clone();
        std::sync::Arc::new(move |dir: &Path, need: crate::files::Need| {
            use std::os::unix::fs::DirBuilderExt;
            if need == crate::files::Need::Reach {
                this.remount_volume(dir);
                return Ok(());
            }
            this.with_volume(dir, || {
                if let Some(parent) = dir.parent() {
                    std::fs::DirBuilder::new()
                        .recursive(true)
                        .mode(0o700)
                        .create(parent)?;
                }
                match &strict {
                    // Under a uid range the workspace's uid is allocated
                    // here, as a kernel's spawn would, so files uploaded
                    // before the first cell belong to the session's uid.
                    Some(strict) => this
                        .strict_for(strict, dir, &dir.to_string_lossy())
                        .and_then(|strict| crate::sandbox::launch::ensure_workspace(dir, &strict))
                        .map_err(|e| std::io::Error::other(crate::error_chain(&e))),
                    None => match std::fs::DirBuilder::new().mode(0o700).create(dir) {
                        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
                        other => other,
                    },
                }
            })
        })
    }

    /// Where `dir` appears inside the owner's kernels.
    pub(crate) fn workspace_in_kernel(&self, dir: &Path) -> PathBuf {
        if self.kernel.sandbox.is_strict() {
            PathBuf::from(crate::sandbox::WORKSPACE_IN_SANDBOX)
        } else {
            dir.to_path_buf()
        }
    }
}

/// `$XDG_DATA_HOME/cellhost`, else `~/.local/share/cellhost`, else
/// `./.cellhost`.
pub fn default_data_dir() -> PathBuf {
    match (std::env::var_os("XDG_DATA_HOME"), std::env::var_os("HOME")) {
        (Some(d), _) if Path::new(&d).is_absolute() => PathBuf::from(d).join("cellhost"),
        (_, Some(h)) if Path::new(&h).is_absolute() => {
            PathBuf::from(h).join(".local/share/cellhost")
        }
        _ => PathBuf::from(".cellhost"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn the_reap_interval_follows_the_idle_timeout_within_30_to_300_s() {
        let every = |idle: u64| {
            ManagerOptions::new("/d")
                .idle_timeout(Some(Duration::from_secs(idle)))
                .effective_reap_interval()
                .unwrap()
                .as_secs()
        };
        assert_eq!(every(1800), 300);
        assert_eq!(every(600), 100);
        assert_eq!(every(60), 30);
        assert_eq!(every(100_000), 300);
        assert!(ManagerOptions::new("/d")
            .idle_timeout(None)
            .effective_reap_interval()
            .is_none());
    }

    #[test]
    fn lifecycle_config_sets_the_limits() {
        let config = Config::parse(
            "[lifecycle]\nmax_kernels = 5\nidle_timeout = 0\nwarm_pool = 1\n",
            Path::new("cellhost.toml"),
        )
        .unwrap();
        let opts = ManagerOptions::new("/d").lifecycle(&config.lifecycle);
        assert_eq!(opts.max_kernels, 5);
        assert_eq!(opts.idle_timeout, None);
        assert_eq!(opts.warm_pool, 1);
        let defaults = ManagerOptions::new("/d");
        assert_eq!(
            (defaults.max_kernels, defaults.warm_pool),
            (32, 2),
            "the documented defaults"
        );
        assert_eq!(defaults.idle_timeout, Some(Duration::from_secs(1800)));
        let err = Config::parse("[lifecycle]\nwarm_pool = 40\n", Path::new("c.toml"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("warm_pool") && err.contains("max_kernels"),
            "{err}"
        );
    }
}

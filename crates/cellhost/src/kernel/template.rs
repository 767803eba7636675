//! Warm templates (docs/templates.md): an idle kernel that has started
//! Python, imported the runner and its preload list, and never runs a
//! cell; new kernels of its flavour are forks of it (`fork.rs`: the
//! re-homing a session's fork uses), so the interpreter's and the
//! preloaded modules' pages are shared copy-on-write and a new kernel
//! costs a hand-over, not an interpreter start.
//!
//! A flavour is everything a process keeps from its start: the
//! interpreter, the environment, the resource limits (rlimits are
//! inherited), the preload list, the display caps and the sandbox
//! profile (its network mode, binds, egress policy), and whether it has a
//! package dir. What differs per kernel (staging dir, pipes, process
//! group, death pipe, cgroup, tool token, cwd, package dir; under the
//! strict profile also its namespaces, mounts, uid, Landlock domain and
//! seccomp filter) the fork re-homes. Where that cannot hold,
//! [`Template::options_for`] says so and the caller spawns plainly:
//! - a strict kernel on a host not running as root (a template could not
//!   give its forks namespaces and a uid of their own);
//! - a kernel whose package dir already holds packages (its own versions
//!   of preloaded modules must be the ones imported).
//!
//! Each template keeps its next kernel forked ahead (a spare: connected,
//! in its own process group and cgroup, a strict one in its namespaces),
//! so a request costs the hand-over alone.

use std::sync::Arc;

use super::{Kernel, KernelOptions, Spare, SpawnError};
use crate::sandbox::{Sandbox, TemplateRole};

/// Set in a template's environment (the runner takes it out at start:
/// it names itself `cellhost-tmpl`).
const TEMPLATE_ENV: &str = "CELLHOST_TEMPLATE";

/// The uid a strict template's own files and its forks' namespace inits
/// are given (`nobody`): never a session's.
const TEMPLATE_UID: u32 = 65534;

/// A warm template and its spare.
pub struct Template {
    inner: Arc<Inner>,
}

struct Inner {
    kernel: Kernel,
    /// What its spares are forked with (their cgroups follow its limits).
    opts: KernelOptions,
    flavour: String,
    /// Its next kernel, forked before it is asked for.
    spare: tokio::sync::Mutex<Option<Spare>>,
}

/// Why [`Template::fork`] gave no kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForkError {
    /// The options are of another flavour than the template's.
    Flavour,
    /// The template could not fork, or its fork did not become a kernel:
    /// why, in words. Spawn plainly (and start a new template later).
    Failed(String),
}

impl std::fmt::Display for ForkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ForkError::Flavour => f.write_str(
                "the kernel's options are not of the template's flavour (interpreter, \
                 environment, limits, preload, display caps, sandbox and package dir must match)",
            ),
            ForkError::Failed(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for ForkError {}

impl Template {
    /// What a template for kernels of `opts` starts with, or `None` where
    /// a fork would not give what a plain spawn gives (see the module).
    pub fn options_for(opts: &KernelOptions) -> Option<KernelOptions> {
        let mut t = opts.clone();
        // The template's own: re-homed in each fork.
        t.cwd = None;
        t.workspace_dir = None;
        match &mut t.sandbox {
            Sandbox::None => {}
            Sandbox::Strict(strict) => {
                if !nix::unistd::geteuid().is_root() {
                    return None;
                }
                strict.workspace = None;
                strict.uid = TEMPLATE_UID;
                strict.gid = TEMPLATE_UID;
                strict.template = TemplateRole(true);
            }
        }
        let strict = t.sandbox.is_strict();
        let packages = opts.packages.dir.clone().or_else(|| match &opts.sandbox {
            Sandbox::Strict(s) => s
                .workspace
                .as_deref()
                .map(crate::packages::dir_for_workspace),
            Sandbox::None => None,
        });
        if let Some(dir) = packages {
            let holds_packages = std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some());
            if holds_packages {
                return None;
            }
        }
        if strict {
            // Its sandbox has an empty dir where its forks mount theirs.
            t.packages.dir = None;
        } else if t.packages.dir.is_some() {
            // Never written: a fork's runner is pointed at its own.
            let root = t.staging_root.parent().unwrap_or(&t.staging_root);
            t.packages.dir = Some(root.join("template-packages"));
        }
        // It names itself `cellhost-tmpl` (ps, /proc/<pid>/comm); its
        // forks take their interpreter's name back.
        t.env.vars.push((TEMPLATE_ENV.into(), "1".into()));
        Some(t)
    }

    /// The key of a template's options: what its forks keep from its start.
    pub(crate) fn flavour(t: &KernelOptions) -> String {
        format!(
            "{:?}|{:?}|{:?}|{:?}|{}|{:?}|{:?}|{}",
            t.python,
            t.env,
            t.limits,
            t.preload,
            t.warmup,
            t.display,
            t.sandbox,
            t.packages.dir.is_some(),
        )
    }

    /// Start a template for kernels of `opts`' flavour (see
    /// [`Template::options_for`]: `None` there is an error here).
    ///
    /// # Errors
    /// The flavour cannot be forked, or the template did not start.
    pub async fn start(opts: &KernelOptions) -> Result<Template, SpawnError> {
        let t = Self::options_for(opts).ok_or_else(|| SpawnError::Handshake {
            detail: "kernels of these options cannot be forked from a template (a strict \
                     kernel on a host not running as root, or a package dir that holds \
                     packages): spawn them"
                .into(),
        })?;
        let kernel = Kernel::spawn(unbounded(&t)).await?;
        Ok(Template {
            inner: Arc::new(Inner {
                kernel,
                flavour: Self::flavour(&t),
                opts: t,
                spare: tokio::sync::Mutex::new(None),
            }),
        })
    }

    /// The template process's pid (`None` once it is gone).
    pub fn pid(&self) -> Option<u32> {
        self.inner.kernel.pid()
    }

    /// A new kernel of `opts`, forked from this template: its spare, or a
    /// fork made now. The next spare is forked once it is handed over.
    ///
    /// # Errors
    /// [`ForkError::Flavour`] for options of another flavour;
    /// [`ForkError::Failed`] with why, and nothing of the fork left behind.
    pub async fn fork(&self, opts: KernelOptions) -> Result<Kernel, ForkError> {
        let fits =
            Self::options_for(&opts).is_some_and(|t| Self::flavour(&t) == self.inner.flavour);
        if !fits {
            return Err(ForkError::Flavour);
        }
        let spare = {
            let mut slot = self.inner.spare.lock().await;
            match slot.take() {
                Some(spare) if spare.is_alive() => Ok(spare),
                _ => self.inner.kernel.fork_spare(&self.inner.opts).await,
            }
        };
        let spare = spare.map_err(ForkError::Failed)?;
        let made = spare.into_kernel(opts).await;
        // The next one, once this one is handed over (on two cores a fork
        // beside the hand-over slows it down).
        tokio::spawn(refill(Arc::downgrade(&self.inner)));
        made.map_err(ForkError::Failed)
    }

    /// Kill the template and its spare (the kernels forked from it live
    /// on) and wait for the template to exit. Idempotent.
    pub async fn shutdown(&self) {
        self.close().await.shutdown().await;
    }

    /// Kill the spare; the template's kernel, for the caller to shut down
    /// (a manager kills all its kernels at once).
    pub(crate) async fn close(&self) -> Kernel {
        drop(self.inner.spare.lock().await.take()); // killed, with its cgroup
        self.inner.kernel.clone()
    }
}

/// Fork the template's next kernel ahead of its request, unless it has
/// one or is gone.
async fn refill(inner: std::sync::Weak<Inner>) {
    let Some(inner) = inner.upgrade() else { return };
    let mut slot = inner.spare.lock().await;
    if slot.as_ref().is_some_and(Spare::is_alive) || inner.kernel.pid().is_none() {
        return;
    }
    // A failure is told by the next fork, which tries again.
    *slot = inner.kernel.fork_spare(&inner.opts).await.ok();
}

/// What a template itself starts with: its kernels' options, but with no
/// memory limit where theirs is a cgroup of each kernel's own. The pages
/// a fork touches before it is moved into its cgroup are charged to the
/// template's (on cgroup v1 they stay there), and 1,000 forks filled a
/// template's 1 GiB and had it OOM-killed. Where the limit is `RLIMIT_AS`
/// (no memory cgroups) it stays: the forks inherit it.
fn unbounded(t: &KernelOptions) -> KernelOptions {
    let mut spawn = t.clone();
    if t.limits.cgroups && crate::sandbox::cgroup::memory_available() {
        spawn.limits.memory_bytes = None;
    }
    spawn
}

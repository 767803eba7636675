//! Warm templates (docs/templates.md): one idle kernel per flavour that
//! has started Python, imported the runner and `[kernel] preload`, and
//! never runs a cell; new local kernels of that flavour are forks of it
//! (`Kernel::fork_process`, the re-homing a session's fork uses), so the
//! interpreter's and the preloaded modules' pages are shared copy-on-write
//! and a new kernel costs a fork, not an interpreter start.
//!
//! A flavour is everything a process keeps from its start: the
//! interpreter, the environment, the resource limits (rlimits are
//! inherited), the preload list, the display caps and the network mode
//! (runner arguments), and whether it has a package dir. What differs per
//! kernel (staging dir, pipes, process group, death pipe, cgroup, tool
//! token, cwd, package dir) the fork re-homes. Where that cannot hold, a
//! new kernel is spawned as before:
//! - a strict kernel (its sandbox, namespaces and uid are per kernel);
//! - a session whose package dir already holds packages (its own
//!   versions of preloaded modules must be the ones imported);
//! - a template that could not start, or whose fork failed: for
//!   [`RETRY_AFTER`], then a new template is tried.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::kernel::{Kernel, KernelOptions, Spare};

use super::Shared;

/// After a template failed to start, how long its flavour spawns plainly
/// before a template is tried again.
const RETRY_AFTER: Duration = Duration::from_secs(30);

/// Set in a template's environment (the runner takes it out at start).
const TEMPLATE_ENV: &str = "CELLHOST_TEMPLATE";

/// The templates of one manager, by flavour.
#[derive(Default)]
pub(super) struct Templates {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    closed: bool,
    flavours: HashMap<String, Arc<tokio::sync::Mutex<Template>>>,
}

/// One flavour's template. Its lock is held while it starts and while it
/// forks (its turn serializes forks anyway).
#[derive(Default)]
struct Template {
    kernel: Option<Kernel>,
    /// What it started with (its spares' cgroups follow its limits).
    opts: Option<KernelOptions>,
    /// Its next kernel, forked, connected and in its own cgroup before it
    /// is asked for: a request then costs the hand-over alone (the move
    /// into a cgroup waits for an RCU grace period, ~10 ms on v1).
    spare: Option<Spare>,
    /// When its last start failed.
    failed: Option<Instant>,
}

impl Templates {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// No template starts from now on; returns the live ones to kill.
    pub(super) async fn close(&self) -> Vec<Kernel> {
        let all: Vec<_> = {
            let mut inner = self.lock();
            inner.closed = true;
            inner.flavours.drain().map(|(_, t)| t).collect()
        };
        let mut kernels = Vec::new();
        for t in all {
            let mut t = t.lock().await;
            drop(t.spare.take()); // killed, with its cgroup
            kernels.extend(t.kernel.take());
        }
        kernels
    }
}

/// A new kernel of `opts`, forked from its flavour's template (started
/// first if there is none), or `None`: the caller spawns one.
pub(super) async fn fork(shared: &Arc<Shared>, opts: &KernelOptions) -> Option<Kernel> {
    if !shared.opts.templates {
        return None;
    }
    let template_opts = template_options(shared, opts)?;
    let flavour = flavour(&template_opts);
    let entry = {
        let mut inner = shared.templates.lock();
        if inner.closed {
            return None;
        }
        inner.flavours.entry(flavour).or_default().clone()
    };
    let mut t = entry.lock().await;
    if t.kernel.is_none() {
        if t.failed.is_some_and(|at| at.elapsed() < RETRY_AFTER) {
            return None;
        }
        match Kernel::spawn(unbounded(&template_opts)).await {
            Ok(k) => {
                if shared.templates.lock().closed {
                    drop(t);
                    k.shutdown().await;
                    return None;
                }
                shared.counters.templates.fetch_add(1, Ordering::Relaxed);
                t.kernel = Some(k);
                t.opts = Some(template_opts.clone());
                t.failed = None;
            }
            Err(e) => {
                eprintln!(
                    "cellhost: warning: a kernel template did not start ({}); kernels of its \
                     flavour start plainly for {} s",
                    crate::error_chain(&e),
                    RETRY_AFTER.as_secs()
                );
                t.failed = Some(Instant::now());
                return None;
            }
        }
    }
    let spare = match t.spare.take() {
        Some(spare) if spare.is_alive() => Ok(spare),
        _ => match &t.kernel {
            Some(k) => k.fork_spare(&template_opts).await,
            None => return None,
        },
    };
    let spare = match spare {
        Ok(spare) => spare,
        Err(why) => {
            broken(&mut t, &why).await;
            return None;
        }
    };
    drop(t);
    let made = spare.into_kernel(opts.clone()).await;
    // The next one, once this one is handed over (on two cores a fork
    // beside the hand-over slows it down).
    tokio::spawn(refill(Arc::downgrade(shared), entry));
    match made {
        Ok(k) => {
            shared
                .counters
                .template_forks
                .fetch_add(1, Ordering::Relaxed);
            Some(k)
        }
        Err(why) => {
            eprintln!(
                "cellhost: warning: a kernel template's fork failed ({why}); the kernel starts \
                 plainly"
            );
            None
        }
    }
}

/// Fork `entry`'s template's next kernel ahead of its request.
async fn refill(shared: Weak<Shared>, entry: Arc<tokio::sync::Mutex<Template>>) {
    let mut t = entry.lock().await;
    if t.spare.is_some() || shared.upgrade().is_none_or(|s| s.templates.lock().closed) {
        return;
    }
    let (Some(k), Some(opts)) = (t.kernel.clone(), t.opts.clone()) else {
        return;
    };
    match k.fork_spare(&opts).await {
        Ok(spare) => t.spare = Some(spare),
        Err(why) => broken(&mut t, &why).await,
    }
}

/// A template whose fork failed: this kernel and its flavour's for a while
/// start plainly; then a new template is tried (one whose fork is refused,
/// say for a thread a preloaded module started, is not retried at once).
async fn broken(t: &mut Template, why: &str) {
    eprintln!(
        "cellhost: warning: a kernel template's fork failed ({why}); kernels of its flavour \
         start plainly for {} s",
        RETRY_AFTER.as_secs()
    );
    t.failed = Some(Instant::now());
    t.spare = None;
    if let Some(k) = t.kernel.take() {
        k.shutdown().await;
    }
}

/// What the template of `opts`'s flavour starts with, or `None` where a
/// fork would not give the kernel a plain spawn gives (see the module).
fn template_options(shared: &Shared, opts: &KernelOptions) -> Option<KernelOptions> {
    if opts.sandbox.is_strict() {
        return None;
    }
    if let Some(dir) = &opts.packages.dir {
        let holds_packages = std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some());
        if holds_packages {
            return None;
        }
    }
    let mut t = opts.clone();
    // The template's own: re-homed in each fork.
    t.cwd = None;
    t.workspace_dir = None;
    if t.packages.dir.is_some() {
        // Never written: a fork's runner is pointed at its own.
        t.packages.dir = Some(shared.opts.data_dir.join("template-packages"));
    }
    t.preload.clone_from(&shared.opts.preload);
    t.warmup = shared.opts.warmup;
    // It names itself `cellhost-tmpl` (ps, /proc/<pid>/comm); its forks
    // take their interpreter's name back.
    t.env.vars.push((TEMPLATE_ENV.into(), "1".into()));
    Some(t)
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

/// The key of a template's options: what its forks keep from its start.
fn flavour(t: &KernelOptions) -> String {
    format!(
        "{:?}|{:?}|{:?}|{:?}|{}|{:?}|{}|{}",
        t.python,
        t.env,
        t.limits,
        t.preload,
        t.warmup,
        t.display,
        t.sandbox.network_mode(),
        t.packages.dir.is_some(),
    )
}

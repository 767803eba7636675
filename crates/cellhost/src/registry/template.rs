//! The manager's warm templates (docs/templates.md): one per kernel
//! flavour, started on the first kernel of that flavour, each keeping its
//! next kernel forked ahead (`kernel/template.rs` is the template itself).
//! New local kernels of a flavour that can be forked are forks of its
//! template, the warm pool's included; where [`Template::options_for`]
//! says no, or a template could not start or fork, the kernel is spawned
//! as before: for [`RETRY_AFTER`] after a failure, then a new template is
//! tried.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::kernel::{ForkError, Kernel, KernelOptions, Template};

use super::Shared;

/// After a template failed to start or fork, how long its flavour spawns
/// plainly before a template is tried again.
const RETRY_AFTER: Duration = Duration::from_secs(30);

/// The templates of one manager, by flavour.
#[derive(Default)]
pub(super) struct Templates {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    closed: bool,
    flavours: HashMap<String, Arc<tokio::sync::Mutex<Entry>>>,
}

/// One flavour's template. Its lock is held while it starts.
#[derive(Default)]
struct Entry {
    template: Option<Arc<Template>>,
    /// When it last failed to start or fork.
    failed: Option<Instant>,
}

impl Templates {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// No template starts from now on; kills the spares and returns the
    /// live templates' kernels to kill.
    pub(super) async fn close(&self) -> Vec<Kernel> {
        let all: Vec<_> = {
            let mut inner = self.lock();
            inner.closed = true;
            inner.flavours.drain().map(|(_, t)| t).collect()
        };
        let mut kernels = Vec::new();
        for entry in all {
            let template = entry.lock().await.template.take();
            if let Some(t) = template {
                kernels.push(t.close().await);
            }
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
    let mut opts = opts.clone();
    // Every fork has its template's preload, whatever its own options say.
    opts.preload.clone_from(&shared.opts.preload);
    opts.warmup = shared.opts.warmup;
    let flavour = Template::flavour(&Template::options_for(&opts)?);
    let entry = {
        let mut inner = shared.templates.lock();
        if inner.closed {
            return None;
        }
        inner.flavours.entry(flavour).or_default().clone()
    };
    let template = {
        let mut e = entry.lock().await;
        match &e.template {
            Some(t) => t.clone(),
            None => {
                if e.failed.is_some_and(|at| at.elapsed() < RETRY_AFTER) {
                    return None;
                }
                match Template::start(&opts).await {
                    Ok(t) => {
                        let t = Arc::new(t);
                        if shared.templates.lock().closed {
                            drop(e);
                            t.shutdown().await;
                            return None;
                        }
                        shared.counters.templates.fetch_add(1, Ordering::Relaxed);
                        e.template = Some(t.clone());
                        e.failed = None;
                        t
                    }
                    Err(err) => {
                        eprintln!(
                            "cellhost: warning: a kernel template did not start ({}); kernels of \
                             its flavour start plainly for {} s",
                            crate::error_chain(&err),
                            RETRY_AFTER.as_secs()
                        );
                        e.failed = Some(Instant::now());
                        return None;
                    }
                }
            }
        }
    };
    match template.fork(opts).await {
        Ok(k) => {
            shared
                .counters
                .template_forks
                .fetch_add(1, Ordering::Relaxed);
            Some(k)
        }
        Err(why) => {
            broken(&entry, &template, &why).await;
            None
        }
    }
}

/// A template whose fork failed: this kernel and its flavour's for a while
/// start plainly; then a new template is tried (one whose fork is refused,
/// say for a thread a preloaded module started, or whose forks cannot
/// sandbox themselves, is not retried at once).
async fn broken(entry: &tokio::sync::Mutex<Entry>, template: &Arc<Template>, why: &ForkError) {
    eprintln!(
        "cellhost: warning: a kernel template's fork failed ({why}); kernels of its flavour \
         start plainly for {} s",
        RETRY_AFTER.as_secs()
    );
    let mut e = entry.lock().await;
    e.failed = Some(Instant::now());
    // Unless another caller already replaced it.
    if e.template
        .as_ref()
        .is_some_and(|t| Arc::ptr_eq(t, template))
    {
        if let Some(t) = e.template.take() {
            drop(e);
            t.shutdown().await;
        }
    }
}

//! Placement on an ssh fleet: a new owner goes to the host with the
//! fewest live kernels; an owner with a live kernel stays on its host.
//!
//! A host that failed to connect or ship is skipped by new owners for a
//! backoff ([`FAILED_HOST_BACKOFF`]) while another host is healthy.
//!
//! A [`Lease`] is held by each remote kernel for its whole life; dropping
//! it gives the slot back (and forgets the owner's host once its last
//! kernel is gone).
//!
//! A session's workspace files live on one host, so the session is
//! pinned to the host its files first went to (its first upload or its
//! first kernel, whichever came first): later kernels of the session and
//! its children go there too, also after its kernels are gone (idle
//! reaping, eviction). The pin goes with the session's disposal
//! ([`Fleet::unpin`]) or when its host fails to start a kernel (the
//! session then moves to a healthy host; its files stay behind).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long new owners avoid a host whose start failed.
pub(super) const FAILED_HOST_BACKOFF: Duration = Duration::from_secs(60);

#[derive(Debug, Default)]
struct State {
    /// Live kernels per host.
    load: Vec<usize>,
    /// Owner -> (host, live kernels of that owner).
    owners: HashMap<String, (usize, usize)>,
    /// When each host last failed to start a kernel.
    failed: Vec<Option<Instant>>,
    /// Session -> the host its workspace lives on.
    pins: HashMap<String, usize>,
}

/// The hosts of one backend and their loads.
#[derive(Debug)]
pub struct Fleet {
    hosts: Vec<String>,
    state: Mutex<State>,
    backoff: Duration,
}

/// One kernel's place on a host.
#[derive(Debug)]
pub struct Lease {
    fleet: Arc<Fleet>,
    owner: String,
    /// Index of the host in the fleet's host list.
    pub host: usize,
}

impl Fleet {
    /// A fleet of `hosts` (ssh destinations, in the backend's `hosts` order;
    /// placement indexes into them), none loaded, with the
    /// default backoff (`FAILED_HOST_BACKOFF`, 60 s).
    pub fn new(hosts: Vec<String>) -> Arc<Fleet> {
        Fleet::with_backoff(hosts, FAILED_HOST_BACKOFF)
    }

    /// As [`Fleet::new`], with new owners avoiding a failed host for
    /// `backoff` instead.
    pub fn with_backoff(hosts: Vec<String>, backoff: Duration) -> Arc<Fleet> {
        let n = hosts.len();
        Arc::new(Fleet {
            hosts,
            state: Mutex::new(State {
                load: vec![0; n],
                owners: HashMap::new(),
                failed: vec![None; n],
                pins: HashMap::new(),
            }),
            backoff,
        })
    }

    /// Host `host` failed to connect or ship: new owners avoid it for the
    /// backoff.
    pub fn failed(&self, host: usize) {
        let mut s = self.state();
        if let Some(f) = s.failed.get_mut(host) {
            *f = Some(Instant::now());
        }
        s.pins.retain(|_, h| *h != host);
    }

    /// Host `host` started a kernel: it is healthy again.
    pub fn succeeded(&self, host: usize) {
        if let Some(f) = self.state().failed.get_mut(host) {
            *f = None;
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The host the next kernel of `owner` would go to.
    fn choose(&self, s: &State, owner: &str) -> usize {
        let pinned = || s.pins.get(crate::owner::session_of(owner)).copied();
        match s.owners.get(owner).map(|&(h, _)| h).or_else(pinned) {
            Some(host) => host,
            None => {
                // Hosts in backoff only when every host is.
                let cooling = |i: usize| s.failed[i].is_some_and(|t| t.elapsed() < self.backoff);
                (0..s.load.len())
                    .min_by_key(|&i| (cooling(i), s.load[i], i))
                    .unwrap_or(0)
            }
        }
    }

    /// Where [`Fleet::place`] would put `owner`'s next kernel now.
    pub fn peek(&self, owner: &str) -> usize {
        self.choose(&self.state(), owner)
    }

    /// The host `owner`'s workspace lives on: its session's pin, made
    /// now (where a kernel would go) when it has none.
    pub fn pin(&self, owner: &str) -> usize {
        let mut s = self.state();
        let host = self.choose(&s, owner);
        *s.pins
            .entry(crate::owner::session_of(owner).to_owned())
            .or_insert(host)
    }

    /// Forget `session`'s host (the session was disposed).
    pub fn unpin(&self, session: &str) {
        self.state().pins.remove(session);
    }

    /// Place one kernel of `owner` (and pin its session there).
    pub fn place(self: &Arc<Fleet>, owner: &str) -> Lease {
        let mut s = self.state();
        let host = self.choose(&s, owner);
        s.pins
            .entry(crate::owner::session_of(owner).to_owned())
            .or_insert(host);
        s.load[host] += 1;
        s.owners.entry(owner.to_owned()).or_insert((host, 0)).1 += 1;
        Lease {
            fleet: self.clone(),
            owner: owner.to_owned(),
            host,
        }
    }

    /// `(host, live kernels)` for each host.
    pub fn loads(&self) -> Vec<(String, usize)> {
        let s = self.state();
        self.hosts
            .iter()
            .cloned()
            .zip(s.load.iter().copied())
            .collect()
    }

    /// The host an owner's kernels run on, while it has any.
    pub fn host_of(&self, owner: &str) -> Option<String> {
        let s = self.state();
        s.owners.get(owner).map(|&(h, _)| self.hosts[h].clone())
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut s = self.fleet.state();
        s.load[self.host] = s.load[self.host].saturating_sub(1);
        if let Some(entry) = s.owners.get_mut(&self.owner) {
            entry.1 -= 1;
            if entry.1 == 0 {
                s.owners.remove(&self.owner);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_owners_go_to_the_least_loaded_host_and_owners_stay_put() {
        let f = Fleet::new(vec!["a".into(), "b".into()]);
        let a1 = f.place("alice");
        let b1 = f.place("bob");
        assert_ne!(a1.host, b1.host);
        let a2 = f.place("alice");
        assert_eq!(a2.host, a1.host);
        let c = f.place("carol");
        assert_eq!(c.host, b1.host, "carol goes where the load is lower");
        drop((a1, a2));
        assert_eq!(f.host_of("alice"), None);
        assert_eq!(f.loads().iter().map(|(_, n)| n).sum::<usize>(), 2);
    }

    #[test]
    fn a_session_stays_on_its_pinned_host_until_unpinned_or_the_host_fails() {
        let f = Fleet::new(vec!["a".into(), "b".into()]);
        assert_eq!(f.pin("s"), 0, "files first: the least loaded host");
        let other = f.place("o");
        assert_eq!(other.host, 0, "the pin is no load");
        let s = f.place("s");
        assert_eq!(s.host, 0, "the kernel goes where the files are, not to b");
        let _o2 = f.place("o2");
        drop(s);
        let c = f.place(&format!("s{}c", crate::registry::CHILD_SEPARATOR));
        assert_eq!(c.host, 0, "children and later kernels too");
        drop(c);
        f.failed(0);
        assert_eq!(f.peek("s"), 1, "a failed host loses its pins");
        f.succeeded(0);
        f.unpin("s");
        assert_eq!(f.pin("s"), 0);
        f.unpin("s");
        let _x = f.place("x");
        assert_eq!(f.pin("s"), 1, "unpinned: placed afresh");
    }

    #[test]
    fn a_failed_host_is_skipped_by_new_owners_until_its_backoff_passes() {
        let f = Fleet::with_backoff(vec!["a".into(), "b".into()], Duration::from_millis(200));
        f.failed(0);
        let x = f.place("x");
        let y = f.place("y");
        assert_eq!((x.host, y.host), (1, 1), "a is cooling down");
        f.failed(1);
        let z = f.place("z");
        assert_eq!(z.host, 0, "every host cooling: least loaded");
        drop(z);
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(f.place("w").host, 0, "backoff over");
        f.failed(0);
        f.succeeded(0);
        assert_eq!(f.place("v").host, 0);
    }
}

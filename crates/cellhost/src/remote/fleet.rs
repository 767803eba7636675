//! Placement on an ssh fleet: a new owner goes to the host with the
//! fewest live kernels; an owner with a live kernel stays on its host.
//!
//! A host that failed to connect or ship is skipped by new owners for a
//! backoff ([`FAILED_HOST_BACKOFF`]) while another host is healthy.
//!
//! A [`Lease`] is held by each remote kernel for its whole life; dropping
//! it gives the slot back (and forgets the owner's host once its last
//! kernel is gone).

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
    pub host: usize,
}

impl Fleet {
    pub fn new(hosts: Vec<String>) -> Arc<Fleet> {
        Fleet::with_backoff(hosts, FAILED_HOST_BACKOFF)
    }

    pub fn with_backoff(hosts: Vec<String>, backoff: Duration) -> Arc<Fleet> {
        let n = hosts.len();
        Arc::new(Fleet {
            hosts,
            state: Mutex::new(State {
                load: vec![0; n],
                owners: HashMap::new(),
                failed: vec![None; n],
            }),
            backoff,
        })
    }

    /// Host `host` failed to connect or ship: new owners avoid it for the
    /// backoff.
    pub fn failed(&self, host: usize) {
        if let Some(f) = self.state().failed.get_mut(host) {
            *f = Some(Instant::now());
        }
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
        match s.owners.get(owner) {
            Some(&(host, _)) => host,
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

    /// Place one kernel of `owner`.
    pub fn place(self: &Arc<Fleet>, owner: &str) -> Lease {
        let mut s = self.state();
        let host = self.choose(&s, owner);
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

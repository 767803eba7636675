//! Many owners, a small cap, idle reaping, a warm pool and random disposals
//! all at once: every result tells the truth about state (checked with a
//! per-owner counter kept in the kernel), nothing fails, and nothing is
//! left running afterwards.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use cellhost::{Cell, Status};
use common::registry::{eventually, manager_with};

const OWNERS: usize = 8;
const RUN_FOR: Duration = Duration::from_secs(6);

/// A tiny deterministic generator (no dependency, reproducible runs).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_result_is_truthful_under_eviction_reaping_and_disposal() {
    let m = Arc::new(
        manager_with(|o| {
            o.max_kernels(4)
                .warm_pool(1)
                .idle_timeout(Some(Duration::from_millis(300)))
                .reap_interval(Duration::from_millis(100))
        })
        .await,
    );
    let end = Instant::now() + RUN_FOR;
    let mut owners = Vec::new();
    for i in 0..OWNERS {
        let m = m.clone();
        owners.push(tokio::spawn(async move {
            let owner = format!("owner-{i}");
            let mut rng = Lcg(i as u64 + 1);
            let mut expected = 0u64;
            let mut cells = 0;
            while Instant::now() < end {
                let r = m
                    .manager
                    .execute(&owner, Cell::new("n = globals().get('n', 0) + 1\nn"))
                    .await
                    .expect("no call fails");
                cells += 1;
                let k = &r.kernel;
                if !k.reused && expected > 0 {
                    assert!(
                        k.state_lost || k.state_reset,
                        "{owner}: a fresh kernel replaced one with state, silently: {k:?}"
                    );
                }
                if k.state_lost || k.state_reset || !k.reused {
                    expected = 1;
                } else {
                    expected += 1;
                }
                match r.status {
                    Status::Success => {
                        let got: u64 = r.value.as_deref().unwrap().parse().unwrap();
                        assert_eq!(
                            got, expected,
                            "{owner}: state changed without the result saying so: {k:?}"
                        );
                    }
                    // Disposed mid-cell: the result must say the state is gone.
                    _ => {
                        assert!(k.state_lost || k.ended, "{owner}: {r:?}");
                        expected = 0;
                    }
                }
                // Mostly quick turns; now and then a pause past the idle
                // timeout, so reaping joins in.
                let pause = if rng.next(5) == 0 {
                    400 + rng.next(200)
                } else {
                    rng.next(40)
                };
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
            cells
        }));
    }
    let chaos = {
        let m = m.clone();
        tokio::spawn(async move {
            let mut rng = Lcg(99);
            let mut disposals = 0;
            while Instant::now() < end {
                tokio::time::sleep(Duration::from_millis(50 + rng.next(150))).await;
                let owner = format!("owner-{}", rng.next(OWNERS as u64));
                m.manager.dispose_owner(&owner).await;
                disposals += 1;
            }
            disposals
        })
    };
    let mut cells = 0;
    for t in owners {
        cells += t.await.unwrap();
    }
    let disposals = chaos.await.unwrap();
    // Under a loaded machine the owners may keep every kernel busier than
    // the idle timeout for the whole run; after a quiet spell one more
    // call reaps the idle ones (reaping runs on every acquire): calls
    // after quiet spells until one has reaped, bounded.
    let quiet_until = Instant::now() + Duration::from_secs(10);
    loop {
        tokio::time::sleep(Duration::from_millis(450)).await;
        let r = m
            .manager
            .execute("owner-after", Cell::new("1"))
            .await
            .expect("the call after the churn runs");
        assert_eq!(r.value.as_deref(), Some("1"), "{r:?}");
        if m.manager.stats().reaps > 0 || Instant::now() > quiet_until {
            break;
        }
    }
    let stats = m.manager.stats();
    // A floor that says the run did real work, low enough for a loaded machine.
    assert!(cells > 20, "only {cells} cells ran");
    assert!(
        disposals > 5 && stats.evictions > 5 && stats.reaps > 0 && stats.pool_hits > 0,
        "every kind of churn happened: {disposals} disposals, {stats:?}"
    );
    m.manager.shutdown().await;
    assert!(
        eventually(Duration::from_secs(5), || m.runner_pids().is_empty()).await,
        "orphans after shutdown: {:?}",
        m.runner_pids()
    );
    let staging = m.run_dir().join("kernels");
    let left: Vec<_> = std::fs::read_dir(&staging)
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "staging dirs left: {left:?}");
    let records: Vec<_> = std::fs::read_dir(m.dir.path().join("data/live"))
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(records.is_empty(), "records left: {records:?}");
    eprintln!("{cells} cells, {disposals} disposals, {stats:?}");
}

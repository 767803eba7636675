//! Crash recovery against real processes: records naming a reused pid are
//! never acted on, and only our own stale staging dirs are swept. (The
//! SIGKILLed-host case runs the real binary: see cellhost-cli's tests.)

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime};

use cellhost::kernel::record::{KernelRecord, ProcessId};
use cellhost::kernel::{process_group, process_start_time};
use cellhost::registry::{KernelManager, ManagerOptions};
use cellhost::KernelOptions;
use common::pid_alive;

fn write_record(live: &Path, record: &KernelRecord) {
    std::fs::create_dir_all(live).unwrap();
    std::fs::write(
        live.join(format!("{}.json", record.id)),
        serde_json::to_vec(record).unwrap(),
    )
    .unwrap();
}

fn options(dir: &tempfile::TempDir) -> ManagerOptions {
    ManagerOptions::new(dir.path().join("data"))
        .kernel(KernelOptions::default().runtime_dir(dir.path().join("run")))
        .warm_pool(0)
}

/// A host that is gone: a pid with a start time it never had.
fn dead_host() -> ProcessId {
    ProcessId {
        pid: 1,
        start_time: u64::MAX,
    }
}

#[tokio::test]
async fn a_reused_pid_of_an_unrelated_process_is_never_killed() {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("data/live");
    // An unrelated process in its own group, standing in for whatever
    // the system gave the dead kernel's pid to.
    let mut unrelated = Command::new("sleep");
    std::os::unix::process::CommandExt::process_group(&mut unrelated, 0);
    let mut unrelated = unrelated.arg("30").spawn().unwrap();
    let pid = unrelated.id();
    let start = process_start_time(pid).unwrap();
    let pgid = process_group(pid).unwrap();
    let staging = dir.path().join("run/kernels/k-000000000001");
    std::fs::create_dir_all(&staging).unwrap();
    // Same pid, other start time: the recorded process is long gone.
    write_record(
        &live,
        &KernelRecord {
            id: "k-000000000001".into(),
            host: dead_host(),
            runner: ProcessId {
                pid,
                start_time: start.wrapping_sub(1),
            },
            leader: ProcessId {
                pid,
                start_time: start.wrapping_sub(1),
            },
            pgid,
            watcher: None,
            staging: staging.clone(),
        },
    );
    // Same pid and start, but not the recorded group leader's group.
    write_record(
        &live,
        &KernelRecord {
            id: "k-000000000002".into(),
            host: dead_host(),
            runner: ProcessId {
                pid,
                start_time: start,
            },
            leader: ProcessId {
                pid,
                start_time: start,
            },
            pgid: pgid + 1,
            watcher: None,
            staging: dir.path().join("run/kernels/k-000000000002"),
        },
    );
    let m = KernelManager::start(options(&dir)).await;
    let report = m.recovery().clone();
    assert_eq!(report.orphans_killed, 0, "{report:?}");
    assert_eq!(report.pids_reused, 2, "{report:?}");
    assert!(pid_alive(pid), "the unrelated process lives");
    assert!(
        !staging.exists(),
        "the dead kernel's staging dir was removed"
    );
    assert_eq!(
        std::fs::read_dir(&live).unwrap().count(),
        0,
        "records cleared"
    );
    m.shutdown().await;
    unrelated.kill().unwrap();
    unrelated.wait().unwrap();
}

#[tokio::test]
async fn records_of_a_host_that_still_runs_are_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    // A second manager on the same data dir must not reap the first's
    // kernels: their host (this process) is alive.
    let first = KernelManager::start(options(&dir)).await;
    let pid = first
        .execute("p", cellhost::Cell::new("x = 1"))
        .await
        .unwrap()
        .kernel
        .pid
        .unwrap();
    let second = KernelManager::start(options(&dir)).await;
    assert_eq!(second.recovery().orphans_killed, 0);
    assert!(pid_alive(pid));
    let r = first.execute("p", cellhost::Cell::new("x")).await.unwrap();
    assert_eq!(r.value.as_deref(), Some("1"));
    second.shutdown().await;
    first.shutdown().await;
    assert!(!pid_alive(pid));
}

fn age(path: &Path, days: u64) {
    let when = SystemTime::now() - Duration::from_secs(days * 24 * 3600);
    let secs = when
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let tv = nix::sys::time::TimeVal::new(secs as i64, 0);
    nix::sys::stat::lutimes(path, &tv, &tv).unwrap();
}

#[tokio::test]
async fn week_old_staging_dirs_are_swept_young_and_unrelated_ones_kept() {
    let dir = tempfile::tempdir().unwrap();
    let kernels = dir.path().join("run/kernels");
    std::fs::create_dir_all(&kernels).unwrap();
    let old = kernels.join("k-0123456789ab");
    let young = kernels.join("k-ba9876543210");
    let unrelated = kernels.join("notes");
    let outside = tempfile::tempdir().unwrap();
    let victim = outside.path().join("k-aaaaaaaaaaaa");
    let link = kernels.join("k-aaaaaaaaaaaa");
    for d in [&old, &young, &unrelated, &victim] {
        std::fs::create_dir(d).unwrap();
        std::fs::write(d.join("runner.py"), "").unwrap();
    }
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    for d in [&old, &unrelated, &victim] {
        age(d, 8);
    }
    age(&link, 8);
    age(&young, 6);
    let m = KernelManager::start(options(&dir)).await;
    assert!(!old.exists(), "a week-old staging dir is swept");
    assert!(young.exists(), "a six-day-old one is kept");
    assert!(unrelated.exists(), "a dir we did not name is never touched");
    assert!(
        link.exists() && victim.join("runner.py").exists(),
        "symlinks are never followed"
    );
    assert_eq!(m.recovery().staging_dirs_removed, 1);
    m.shutdown().await;
}

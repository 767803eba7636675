//! Snapshots of a live kernel's namespace and restores into a fresh one
//! (docs/snapshots.md): real kernels, real files.

mod common;

use cellhost::{Kernel, SnapshotError, SnapshotLimits};

use common::{kernel_with, options, strict_options, venv_python, TestKernel};

const MAX: u64 = 64 << 20;

async fn venv_kernel() -> TestKernel {
    let dir = tempfile::tempdir().unwrap();
    kernel_with(options(&dir).python(venv_python()), dir).await
}

/// A fresh kernel on the venv's interpreter, with its own runtime dir.
async fn fresh() -> TestKernel {
    venv_kernel().await
}

#[tokio::test]
async fn a_snapshot_keeps_values_functions_and_classes_and_names_what_it_skips() {
    let k = venv_kernel().await;
    let r = k
        .run(
            "import numpy as np, pandas as pd, socket, json as j\n\
             n = 1\nd = {'a': [1, 2]}\narr = np.arange(5)\ndf = pd.DataFrame({'a': [1, 2]})\n\
             class C:\n    def __init__(self, v): self.v = v\n    def twice(self): return self.v * 2\n\
             c = C(21)\n\
             def f(x): return x + n\n\
             sq = lambda x: x * x\n\
             sock = socket.socket()\nrows = (i for i in range(3))",
        )
        .await;
    assert!(r.is_success(), "{r:?}");
    let dest = k.dir.path().join("snap.zst");
    let taken = k.kernel.snapshot_to(&dest, MAX).await.expect("snapshot");
    let skipped: Vec<_> = taken
        .skipped
        .iter()
        .map(|s| (s.name.as_str(), s.kind.as_str()))
        .collect();
    assert_eq!(
        skipped,
        [("sock", "socket.socket"), ("rows", "generator")],
        "{taken:?}"
    );
    assert!(taken.bytes > 0 && taken.bytes <= std::fs::metadata(&dest).unwrap().len());
    // The kernel it was taken from goes on as before, not counted a cell.
    let r = k.run("n").await;
    assert_eq!(r.value.as_deref(), Some("1"));
    assert_eq!(r.kernel.execution_count, 2);

    let fresh = fresh().await;
    let fresh = &fresh.kernel;
    let loaded = fresh.restore_from(&dest, MAX).await.expect("restore");
    assert_eq!(loaded.names, taken.names);
    assert!(loaded.skipped.is_empty(), "{loaded:?}");
    let r = fresh
        .execute(cellhost::Cell::new(
            "n = 100\n(f(1), sq(3), c.twice(), isinstance(c, C), d, int(arr.sum()), \
             int(df.a.sum()), j.dumps(1), 'sock' in globals())",
        ))
        .await
        .unwrap();
    assert_eq!(
        r.value.as_deref(),
        Some("(101, 9, 42, True, {'a': [1, 2]}, 10, 3, '1', False)"),
        "a restored function sees the session's globals: {r:?}"
    );
    assert_eq!(r.kernel.execution_count, 1, "the restore is not a cell");
    assert!(!r.kernel.reused);
}

#[tokio::test]
async fn a_corrupt_or_truncated_snapshot_is_refused_with_the_reason() {
    let k = venv_kernel().await;
    k.run("n = 5\na = list(range(100000))").await;
    let dest = k.dir.path().join("snap.zst");
    k.kernel.snapshot_to(&dest, MAX).await.unwrap();
    let bytes = std::fs::read(&dest).unwrap();
    let cut = k.dir.path().join("cut.zst");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let junk = k.dir.path().join("junk.zst");
    std::fs::write(&junk, b"not zstd at all").unwrap();
    for (path, want) in [(&cut, "truncated"), (&junk, "corrupt or truncated")] {
        let fresh = fresh().await;
        let fresh = &fresh.kernel;
        let err = fresh.restore_from(path, MAX).await.unwrap_err();
        assert!(
            matches!(&err, SnapshotError::Runner(why) if why.contains(want)),
            "{path:?}: {err}"
        );
        // The kernel is still whole and empty: what a cut stream had
        // loaded before its end is taken out again.
        let r = fresh
            .execute(cellhost::Cell::new("'a' in globals() or 'n' in globals()"))
            .await
            .unwrap();
        assert_eq!(r.value.as_deref(), Some("False"));
    }
}

#[tokio::test]
async fn a_snapshot_that_hangs_times_out_and_the_kernel_keeps_its_state() {
    let k = venv_kernel().await;
    // A global whose pickling never returns (a cell's hostile __reduce__).
    let r = k
        .run(
            "import time\nn = 7\n\
             class Stuck:\n    def __reduce__(self):\n        time.sleep(3600)\n\
             stuck = Stuck()",
        )
        .await;
    assert!(r.is_success(), "{r:?}");
    let dest = k.dir.path().join("snap.zst");
    let limits = SnapshotLimits {
        max_bytes: MAX,
        timeout: std::time::Duration::from_secs(2),
    };
    let started = std::time::Instant::now();
    let err = k.kernel.snapshot_to(&dest, limits).await.unwrap_err();
    assert!(matches!(err, SnapshotError::TimedOut { .. }), "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    assert!(!dest.exists());
    let r = k.run("n").await;
    assert_eq!(r.value.as_deref(), Some("7"), "{r:?}");
}

#[tokio::test]
async fn a_state_over_the_cap_keeps_no_snapshot() {
    let k = venv_kernel().await;
    k.run("big = bytes(8 << 20)").await;
    let dest = k.dir.path().join("snap.zst");
    let err = k.kernel.snapshot_to(&dest, 1 << 20).await.unwrap_err();
    assert!(matches!(err, SnapshotError::TooLarge { .. }), "{err}");
    assert!(!dest.exists());
    let left: Vec<_> = std::fs::read_dir(k.dir.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".tmp-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let r = k.run("len(big)").await;
    assert_eq!(r.value.as_deref(), Some("8388608"), "the kernel lives on");
}

#[tokio::test]
async fn a_strict_kernel_snapshots_and_restores_through_its_staging_dir() {
    common::require_bwrap();
    let dir = tempfile::tempdir().unwrap();
    let opts = strict_options(&dir, cellhost::StrictSandbox::default());
    let k = kernel_with(opts, dir).await;
    k.run("x = {'k': 7}\ndef g(): return x['k']").await;
    let dest = k.dir.path().join("strict.zst");
    let taken = k.kernel.snapshot_to(&dest, MAX).await.expect("snapshot");
    assert_eq!(taken.names, 2, "{taken:?}");
    let dir2 = tempfile::tempdir().unwrap();
    let fresh = Kernel::spawn(strict_options(&dir2, cellhost::StrictSandbox::default()))
        .await
        .unwrap();
    fresh.restore_from(&dest, MAX).await.expect("restore");
    let r = fresh
        .execute(cellhost::Cell::new("x['k'] = 8\ng()"))
        .await
        .unwrap();
    assert_eq!(r.value.as_deref(), Some("8"));
}

// --- Through the manager: eviction, reaping, shutdown, requests ---

use cellhost::registry::{KernelManager, ManagerOptions};
use cellhost::RestoreFrom;
use common::registry::manager_options;

fn snap_options(dir: &tempfile::TempDir) -> ManagerOptions {
    let o = manager_options(dir).snapshots(Some(MAX));
    let kernel = o.kernel.clone().python(venv_python());
    o.kernel(kernel)
}

fn snapshot_files(m: &KernelManager) -> usize {
    std::fs::read_dir(m.options().snapshot_dir()).map_or(0, |rd| rd.count())
}

async fn run(m: &KernelManager, owner: &str, code: &str) -> cellhost::CellResult {
    m.execute(owner, cellhost::Cell::new(code)).await.unwrap()
}

#[tokio::test]
async fn an_evicted_session_comes_back_with_its_state_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let m = KernelManager::start(snap_options(&dir).max_kernels(1)).await;
    run(
        &m,
        "a",
        "import numpy as np, socket\nn = 5\narr = np.ones(3)\ndef f(x): return x + n\n\
         class P:\n    def __init__(self): self.v = 2\np = P()\nsock = socket.socket()\ngen = (i for i in [1])",
    )
    .await;
    let b = run(&m, "b", "1").await; // evicts a, snapshotting it
    assert!(b.is_success());
    assert_eq!(m.stats().evictions, 1);
    let back = run(
        &m,
        "a",
        "n = 10\n(f(1), float(arr.sum()), p.v, isinstance(p, P))",
    )
    .await;
    assert_eq!(
        back.value.as_deref(),
        Some("(11, 3.0, 2, True)"),
        "{back:?}"
    );
    let k = &back.kernel;
    let restored = k.restored.as_ref().expect("restored");
    assert_eq!(restored.from, RestoreFrom::Evicted);
    let skipped: Vec<&str> = restored.skipped.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(skipped, ["sock", "gen"]);
    assert!(
        k.state_lost,
        "something was skipped, so the state is not whole"
    );
    let note = k.note.as_deref().unwrap();
    assert!(
        note.contains("evicted to keep at most 1 kernels")
            && note.contains("restored from a snapshot")
            && note.contains("Not restored: sock (socket.socket), gen (generator)"),
        "{note}"
    );
    // Told once; the snapshot was consumed.
    let next = run(&m, "a", "n").await;
    assert!(next.kernel.restored.is_none() && next.kernel.note.is_none());
    assert_eq!(snapshot_files(&m), 2, "only b's (evicted by a) is left");
    m.shutdown().await;
}

#[tokio::test]
async fn a_whole_restore_does_not_claim_a_loss() {
    let dir = tempfile::tempdir().unwrap();
    let m = KernelManager::start(snap_options(&dir).max_kernels(1)).await;
    run(&m, "a", "rows = [1, 2, 3]").await;
    run(&m, "b", "1").await;
    let back = run(&m, "a", "sum(rows)").await;
    assert_eq!(back.value.as_deref(), Some("6"));
    assert!(!back.kernel.state_lost && !back.kernel.reused, "{back:?}");
    assert_eq!(back.kernel.restored.as_ref().unwrap().names, 1);
    m.shutdown().await;
}

#[tokio::test]
async fn a_manager_shutdown_and_a_new_manager_restore_the_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let m = KernelManager::start(snap_options(&dir)).await;
    run(&m, "s1", "x = 'kept'").await;
    run(&m, "s2", "y = 2").await;
    m.shutdown().await;
    let m = KernelManager::start(snap_options(&dir)).await;
    let r = run(&m, "s1", "x").await;
    assert_eq!(r.value.as_deref(), Some("'kept'"));
    let restored = r
        .kernel
        .restored
        .as_ref()
        .expect("restored after a restart");
    assert_eq!(restored.from, RestoreFrom::Restart);
    assert!(!r.kernel.state_lost);
    assert!(r
        .kernel
        .note
        .as_deref()
        .unwrap()
        .contains("daemon restarted"));
    // A session disposed before its first cell does not come back.
    m.dispose_owner("s2").await;
    let r = run(&m, "s2", "'y' in globals()").await;
    assert_eq!(r.value.as_deref(), Some("False"));
    assert!(r.kernel.restored.is_none());
    m.shutdown().await;
}

#[tokio::test]
async fn a_snapshot_on_request_after_a_kill_restores_and_says_how_old_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let m = KernelManager::start(snap_options(&dir)).await;
    run(&m, "s", "x = 1").await;
    let report = m.snapshot("s").await.expect("snapshot");
    assert_eq!(report.names, 1);
    assert!(report.bytes > 0);
    run(&m, "s", "x = 2").await; // after the snapshot: lost below
                                 // The host dies without its shutdown (the kernel with it).
    let pid = run(&m, "s", "import os\nos.getpid()")
        .await
        .kernel
        .pid
        .unwrap();
    drop(m);
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let m = KernelManager::start(snap_options(&dir)).await;
    let r = run(&m, "s", "x").await;
    assert_eq!(r.value.as_deref(), Some("1"));
    let restored = r.kernel.restored.as_ref().expect("restored");
    assert_eq!(restored.from, RestoreFrom::Snapshot);
    assert!(r.kernel.state_lost, "later cells' state is lost: {r:?}");
    assert!(r.kernel.note.as_deref().unwrap().contains("s ago"), "{r:?}");
    m.shutdown().await;
}

#[tokio::test]
async fn a_corrupt_snapshot_gives_a_fresh_kernel_and_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let m = KernelManager::start(snap_options(&dir).max_kernels(1)).await;
    run(&m, "a", "x = list(range(1000))").await;
    run(&m, "b", "1").await;
    let snap = std::fs::read_dir(m.options().snapshot_dir())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "zst"))
        .unwrap();
    let bytes = std::fs::read(&snap).unwrap();
    std::fs::write(&snap, &bytes[..bytes.len() / 3]).unwrap();
    let r = run(&m, "a", "'x' in globals()").await;
    assert_eq!(r.value.as_deref(), Some("False"));
    assert!(r.kernel.state_lost && r.kernel.restored.is_none());
    let note = r.kernel.note.as_deref().unwrap();
    assert!(
        note.contains("evicted") && note.contains("could not be restored"),
        "{note}"
    );
    m.shutdown().await;
}

#[tokio::test]
async fn a_reset_or_a_death_in_a_cell_never_brings_an_old_snapshot_back() {
    let dir = tempfile::tempdir().unwrap();
    let m = KernelManager::start(snap_options(&dir)).await;
    run(&m, "s", "x = 1").await;
    m.snapshot("s").await.unwrap();
    let died = run(&m, "s", "import os\nos._exit(1)").await;
    assert!(died.kernel.state_lost);
    let r = run(&m, "s", "'x' in globals()").await;
    assert_eq!(r.value.as_deref(), Some("False"));
    assert!(r.kernel.restored.is_none());
    m.shutdown().await;
}

#[tokio::test]
async fn snapshots_off_keep_the_old_contract() {
    let dir = tempfile::tempdir().unwrap();
    let m = KernelManager::start(snap_options(&dir).snapshots(None).max_kernels(1)).await;
    run(&m, "a", "x = 1").await;
    run(&m, "b", "1").await;
    let r = run(&m, "a", "'x' in globals()").await;
    assert_eq!(r.value.as_deref(), Some("False"));
    assert!(r.kernel.state_lost && r.kernel.restored.is_none());
    let err = m.snapshot("a").await.unwrap_err();
    assert!(err.to_string().contains("snapshots are off"), "{err}");
    m.shutdown().await;
}

/// The chaos run's "restored from a snapshot, yet the counter went from 1
/// to 3": a session whose next cell came in while its evicted kernel's
/// snapshot was still to be written started a fresh kernel, was told its
/// state was lost, and the snapshot then written stood for a state the
/// session no longer had (a later eviction without a snapshot brought it
/// back). The next kernel must wait for that snapshot and load it. On a
/// current-thread runtime the order is fixed: `b`'s call evicts `a` and
/// yields with the snapshot task queued behind `a`'s next call.
#[tokio::test]
async fn a_session_back_while_its_eviction_snapshot_is_written_waits_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let m = KernelManager::start(snap_options(&dir).max_kernels(1)).await;
    let count = "n = globals().get('n', 0) + 1\nn";
    assert_eq!(run(&m, "a", count).await.value.as_deref(), Some("1"));
    let evicts = tokio::spawn({
        let m = m.clone();
        async move { run(&m, "b", "1").await }
    });
    let back = tokio::spawn({
        let m = m.clone();
        async move { run(&m, "a", count).await }
    });
    assert!(evicts.await.unwrap().is_success());
    let back = back.await.unwrap();
    assert_eq!(m.stats().evictions, 1);
    assert_eq!(back.value.as_deref(), Some("2"), "{back:?}");
    let restored = back.kernel.restored.as_ref().expect("restored");
    assert_eq!(restored.from, RestoreFrom::Evicted);
    assert!(!back.kernel.state_lost, "{back:?}");
    m.shutdown().await;
}

/// A session disposed while its evicted kernel's snapshot is still to be
/// written: the snapshot must not land after the disposal removed the
/// session's files (a host started later would bring the disposed state
/// back, told as a restart).
#[tokio::test]
async fn a_disposal_during_an_eviction_snapshot_leaves_no_state_behind() {
    let dir = tempfile::tempdir().unwrap();
    let m = KernelManager::start(snap_options(&dir).max_kernels(1)).await;
    run(&m, "a", "secret = 42").await;
    let evicts = tokio::spawn({
        let m = m.clone();
        async move { run(&m, "b", "1").await }
    });
    let disposes = tokio::spawn({
        let m = m.clone();
        async move { m.dispose_owner("a").await }
    });
    assert!(evicts.await.unwrap().is_success());
    disposes.await.unwrap();
    assert_eq!(m.stats().evictions, 1);
    m.shutdown().await;
    let m = KernelManager::start(snap_options(&dir)).await;
    let r = run(&m, "a", "'secret' in globals()").await;
    assert_eq!(r.value.as_deref(), Some("False"), "{r:?}");
    assert!(r.kernel.restored.is_none(), "{r:?}");
    m.shutdown().await;
}

/// A kernel that dies in a snapshot on request (a global whose pickling
/// ends the process) told only the snapshot's caller: the session's next
/// cell says its state was lost, not just that its kernel is new.
#[tokio::test]
async fn a_kernel_dead_in_a_snapshot_on_request_makes_the_next_cell_say_state_lost() {
    let dir = tempfile::tempdir().unwrap();
    let m = KernelManager::start(snap_options(&dir)).await;
    let r = run(
        &m,
        "s1",
        "import os\nclass Bomb:\n    def __reduce__(self):\n        os._exit(3)\nb = Bomb()\nn = 1",
    )
    .await;
    assert!(r.is_success(), "{r:?}");
    assert!(m.snapshot("s1").await.is_err(), "the kernel died in it");
    let r = run(&m, "s1", "'n' in globals()").await;
    assert_eq!(r.value.as_deref(), Some("False"), "{r:?}");
    assert!(r.kernel.state_lost, "the loss is told: {r:?}");
    m.shutdown().await;
}

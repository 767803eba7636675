//! Snapshots of a live kernel's namespace and restores into a fresh one
//! (docs/snapshots.md): real kernels, real files.

mod common;

use cellhost::{Kernel, SnapshotError};

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
    k.run("a = list(range(100000))").await;
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
        // The kernel is still whole and empty.
        let r = fresh
            .execute(cellhost::Cell::new("'a' in globals()"))
            .await
            .unwrap();
        assert_eq!(r.value.as_deref(), Some("False"));
    }
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

//! Workspace volumes against real strict kernels and a real manager: the
//! quota stops a cell's own writes (ENOSPC), files survive a restart and a
//! dropped manager, and no mount or loop device is left after
//! disposal or shutdown; a strict kernel's mountinfo names neither the
//! data dir nor the session.

mod common;

use std::path::Path;

use cellhost::files::WriteLimits;
use cellhost::registry::{KernelManager, ManagerOptions};
use cellhost::{Cell, CellResult, Status, StrictSandbox};

const MIB: u64 = 1024 * 1024;

fn options(dir: &tempfile::TempDir, quota_mib: u64) -> ManagerOptions {
    ManagerOptions::new(dir.path().join("data"))
        .kernel(common::strict_options(dir, StrictSandbox::default()))
        .warm_pool(0)
        .idle_timeout(None)
        .workspace_quota(Some(quota_mib * MIB))
}

async fn run(m: &KernelManager, owner: &str, code: &str) -> CellResult {
    m.execute(owner, Cell::new(code)).await.expect("execute")
}

async fn ok(m: &KernelManager, owner: &str, code: &str) -> String {
    let r = run(m, owner, code).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    r.stdout
}

/// Mounts and loop devices anything under `dir` still holds, once a
/// dying sandbox's mount namespace has let go (a loop device clears itself
/// when its last mount goes, which may be a moment after the kernel died).
fn leftovers(dir: &Path) -> Vec<String> {
    let mut left = leftovers_now(dir);
    for _ in 0..50 {
        if left.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        left = leftovers_now(dir);
    }
    left
}

fn leftovers_now(dir: &Path) -> Vec<String> {
    let dir = dir.to_string_lossy().into_owned();
    let mut out: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.split(' ').nth(4).is_some_and(|m| m.starts_with(&dir)))
        .map(|l| format!("mount: {l}"))
        .collect();
    for e in std::fs::read_dir("/sys/block").unwrap().flatten() {
        let backing = e.path().join("loop/backing_file");
        if let Ok(file) = std::fs::read_to_string(&backing) {
            if file.starts_with(&dir) {
                out.push(format!("loop {:?}: {}", e.file_name(), file.trim()));
            }
        }
    }
    out
}

#[tokio::test]
async fn a_cells_writes_past_the_quota_get_enospc_and_the_next_cell_still_works() {
    common::require_bwrap();
    let dir = tempfile::tempdir().unwrap();
    let m = KernelManager::start(options(&dir, 16)).await;
    assert_eq!(
        m.workspace_fs_warning(),
        None,
        "this host is root with loop devices"
    );
    let r = run(
        &m,
        "s1",
        "import subprocess\n\
         p = subprocess.run(['dd', 'if=/dev/zero', 'of=/workspace/big', 'bs=1M', 'count=64'], capture_output=True, text=True)\n\
         print(p.returncode, p.stderr)\n\
         with open('/workspace/big2', 'wb') as f:\n    f.write(b'x' * (64 << 20))\n",
    )
    .await;
    assert_eq!(r.status, Status::Error, "{r:?}");
    assert!(
        r.stdout.contains("No space left on device"),
        "dd: {}",
        r.stdout
    );
    let error = format!("{:?}", r.error);
    assert!(
        error.contains("No space left on device") || error.contains("28"),
        "{error}"
    );
    // The next cell runs, sees what fitted, and can free space and write again.
    let out = ok(
        &m,
        "s1",
        "import os\nsize = os.path.getsize('/workspace/big')\nprint(size > 8 << 20, size <= 17 << 20)\n\
         os.remove('/workspace/big'); os.remove('/workspace/big2')\n\
         open('/workspace/small', 'w').write('fine')\nprint(open('/workspace/small').read())",
    )
    .await;
    assert_eq!(out, "True True\nfine\n");
    // An upload past what is left answers quota_exceeded, as before.
    let ws = m.workspace("s1").unwrap();
    ok(
        &m,
        "s1",
        "open('/workspace/fill', 'wb').write(b'y' * (15 << 20))",
    )
    .await;
    let err = ws
        .write("up.bin", &vec![1u8; 4 << 20][..], WriteLimits::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), "quota_exceeded", "{err}");
    let kernel = r.kernel.id.clone();
    m.dispose_owner("s1").await;
    // Nothing of the session stays: its volume, loop device and kernel's
    // staging dir are gone. (The warm template and its spare hold their
    // own staging dirs and the sandbox's /etc until shutdown.)
    let left = leftovers(dir.path());
    let of_session: Vec<_> = left
        .iter()
        .filter(|l| !l.contains(" - tmpfs cellhost ") || l.contains(&kernel))
        .collect();
    assert!(of_session.is_empty(), "after DELETE: {left:?}");
    m.shutdown().await;
    assert_eq!(leftovers(dir.path()), Vec::<String>::new());
}

#[tokio::test]
async fn files_survive_a_restart_and_a_dropped_manager_and_nothing_stays_mounted() {
    common::require_bwrap();
    let dir = tempfile::tempdir().unwrap();
    let m = KernelManager::start(options(&dir, 64)).await;
    // The workspace is a filesystem of its own, of the quota's size.
    let out = ok(
        &m,
        "s1",
        "import os\nv = os.statvfs('/workspace')\nprint(60 << 20 < v.f_bavail * v.f_frsize <= 64 << 20)\n\
         open('/workspace/kept.txt', 'w').write('kept')",
    )
    .await;
    assert_eq!(out, "True\n");
    ok(&m, "s2", "open('/workspace/other.txt', 'w').write('other')").await;
    m.shutdown().await;
    assert_eq!(
        leftovers(dir.path()),
        Vec::<String>::new(),
        "after shutdown"
    );
    // A restart mounts the volume again.
    let m = KernelManager::start(options(&dir, 64)).await;
    assert_eq!(
        ok(&m, "s1", "print(open('/workspace/kept.txt').read())").await,
        "kept\n"
    );
    // A manager dropped without shutdown (a panicking caller) detaches
    // its volumes too (a SIGKILLed daemon's are reused by the next one:
    // cellhost-cli/tests/files.rs); the next manager mounts them again,
    // on the loop device its dying kernels may still hold.
    drop(m);
    let mounts: Vec<String> = leftovers_now(dir.path())
        .into_iter()
        .filter(|l| l.starts_with("mount"))
        .collect();
    assert_eq!(mounts, Vec::<String>::new(), "after a drop");
    let m = KernelManager::start(options(&dir, 64)).await;
    assert_eq!(
        ok(&m, "s1", "print(open('/workspace/kept.txt').read())").await,
        "kept\n"
    );
    assert_eq!(
        ok(&m, "s2", "print(open('/workspace/other.txt').read())").await,
        "other\n"
    );
    m.dispose_owner("s2").await;
    assert!(
        !leftovers(dir.path()).iter().any(|l| l.contains("s2-")),
        "{:?}",
        leftovers(dir.path())
    );
    m.shutdown().await;
    assert_eq!(
        leftovers(dir.path()),
        Vec::<String>::new(),
        "after the second shutdown"
    );
}

#[tokio::test]
async fn a_strict_kernels_mountinfo_names_neither_the_data_dir_nor_the_session() {
    common::require_bwrap();
    let dir = tempfile::tempdir().unwrap();
    let m = KernelManager::start(options(&dir, 64)).await;
    let info = ok(&m, "conv-7", "print(open('/proc/self/mountinfo').read())").await;
    let data = dir.path().join("data");
    for (what, needle) in [
        ("the data dir", data.to_string_lossy().into_owned()),
        ("the session's dir name", "conv-7".to_owned()),
        ("the workspaces dir", "workspaces".to_owned()),
    ] {
        assert!(!info.contains(&needle), "mountinfo shows {what}:\n{info}");
    }
    // The workspace and the package dir are the volume's own dirs.
    assert!(info.contains(" /ws /workspace "), "{info}");
    assert!(info.contains(" /pkgs /run/cellhost/packages "), "{info}");
    m.shutdown().await;
    assert_eq!(leftovers(dir.path()), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manager_dropped_without_shutdown_leaves_no_pool_volume_mounted() {
    common::require_bwrap();
    let dir = tempfile::tempdir().unwrap();
    let m = KernelManager::start(options(&dir, 64).warm_pool(1)).await;
    // The handout refills the pool in the background; drop the manager
    // (no shutdown) with a pooled kernel ready or still starting.
    assert_eq!(ok(&m, "conv-1", "print(1)").await, "1\n");
    drop(m);
    // Its pool's volumes go with it (a refill still starting finds the
    // manager gone and takes its own).
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert_eq!(leftovers(dir.path()), Vec::<String>::new());
}

#[tokio::test]
async fn a_new_sessions_first_cell_does_not_wait_for_the_pools_refill() {
    common::require_bwrap();
    let dir = tempfile::tempdir().unwrap();
    // A slow refill: an `mkfs.ext4` (found on PATH, as the manager looks
    // for it) that takes 3 s, and a volume template the next refill must
    // make again. Set before any thread of ours reads the environment.
    let real = ["/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("e2fsprogs");
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let slow = bin.join("mkfs.ext4");
    std::fs::write(&slow, format!("#!/bin/sh\nsleep 3\nexec {real} \"$@\"\n")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&slow, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = std::env::var("PATH").unwrap_or_default();
    std::env::set_var("PATH", format!("{}:{path}", bin.display()));

    let m = KernelManager::start(options(&dir, 16).warm_pool(1)).await;
    assert_eq!(m.workspace_fs_warning(), None);
    let within = std::time::Duration::from_secs(60);
    assert!(common::registry::eventually(within, || m.pooled() == 1).await);
    let root = dir.path().join("data/workspaces");
    for e in std::fs::read_dir(&root).unwrap().flatten() {
        if e.file_name().to_string_lossy().starts_with(".template-") {
            std::fs::remove_file(e.path()).unwrap();
        }
    }

    let t = std::time::Instant::now();
    let out = ok(&m, "s", "print('hi')").await;
    let took = t.elapsed();
    assert_eq!(out, "hi\n");
    assert!(
        took < std::time::Duration::from_secs(2),
        "the first cell waited for the refill: {took:?}"
    );
    assert_eq!(m.pooled(), 0, "the refill is still making its volume");
    assert!(
        common::registry::eventually(within, || m.pooled() == 1).await,
        "the pool refills"
    );
    m.shutdown().await;
    assert_eq!(leftovers(dir.path()), Vec::<String>::new());
}

/// Whether a mount of `owner`'s volume (`…/<owner>-<hash>/vol/fs`) is in
/// this process's mount table.
fn volume_mounted(dir: &Path, owner: &str) -> bool {
    leftovers_now(dir)
        .iter()
        .any(|l| l.starts_with("mount") && l.contains(&format!("/{owner}-")))
}

async fn read(ws: &cellhost::files::Workspace, path: &str) -> String {
    let mut out = Vec::new();
    ws.read_to(path, None, &mut out).await.expect("read");
    String::from_utf8(out).unwrap()
}

#[tokio::test]
async fn an_evicted_sessions_volume_is_detached_and_its_next_cell_or_file_call_mounts_it_again() {
    common::require_bwrap();
    let dir = tempfile::tempdir().unwrap();
    let m = KernelManager::start(options(&dir, 16).max_kernels(1)).await;
    ok(&m, "s1", "open('/workspace/a.txt', 'w').write('one')").await;
    // A file handle taken while s1's volume is mounted, used after.
    let early = m.workspace("s1").unwrap();
    ok(&m, "s2", "print(2)").await; // evicts s1
    let within = std::time::Duration::from_secs(10);
    assert!(
        common::registry::eventually(within, || !volume_mounted(dir.path(), "s1")).await,
        "s1 has no kernel: its volume is detached ({:?})",
        leftovers_now(dir.path())
    );
    assert!(volume_mounted(dir.path(), "s2"));
    // The handle reads and writes the volume (mounted again), never the
    // empty mount point under it.
    assert_eq!(read(&early, "a.txt").await, "one");
    early
        .write("b.txt", &b"two"[..], WriteLimits::default())
        .await
        .expect("write");
    assert_eq!(
        ok(
            &m,
            "s1",
            "print(open('/workspace/a.txt').read() + open('/workspace/b.txt').read())"
        )
        .await,
        "onetwo\n"
    );
    assert!(
        common::registry::eventually(within, || !volume_mounted(dir.path(), "s2")).await,
        "s2 was evicted in turn"
    );
    m.shutdown().await;
    assert_eq!(leftovers(dir.path()), Vec::<String>::new());
    // Nothing was ever written beside a volume, on the data dir's own
    // filesystem under its mount point.
    let root = dir.path().join("data/workspaces");
    for e in std::fs::read_dir(&root).unwrap().flatten() {
        let fs = e.path().join("vol/fs");
        if fs.exists() {
            let under: Vec<_> = std::fs::read_dir(&fs).unwrap().flatten().collect();
            assert!(under.is_empty(), "{fs:?} holds {under:?}");
        }
    }
}

//! Forks of a live session (docs/snapshots.md): real kernels, real
//! workspaces. Each new session starts with an independent copy of the
//! source's state and files, and says it is a fork.

mod common;

use cellhost::registry::{child_owner, ForkError, KernelManager, ManagerError, ManagerOptions};
use cellhost::{Cell, CellResult, ForkPath, RestoreFrom, StrictSandbox};
use common::registry::manager_options;
use common::venv_python;

fn none_options(dir: &tempfile::TempDir) -> ManagerOptions {
    let o = manager_options(dir);
    let kernel = o.kernel.clone().python(venv_python());
    o.kernel(kernel)
}

async fn run(m: &KernelManager, owner: &str, code: &str) -> CellResult {
    m.execute(owner, Cell::new(code)).await.expect("execute")
}

async fn write(m: &KernelManager, owner: &str, path: &str, body: &str) {
    m.workspace(owner)
        .unwrap()
        .write(
            path,
            body.as_bytes(),
            cellhost::files::WriteLimits { max_bytes: None },
        )
        .await
        .expect("write");
}

async fn read(m: &KernelManager, owner: &str, path: &str) -> Option<String> {
    let mut out = Vec::new();
    m.workspace(owner)
        .unwrap()
        .read_to(path, None, &mut out)
        .await
        .ok()?;
    Some(String::from_utf8(out).unwrap())
}

/// The state and files a fork must carry, made in `owner` through cells
/// (a file the kernel wrote) and through the file API.
async fn make_source(m: &KernelManager, owner: &str) {
    let r = run(
        m,
        owner,
        "import json\nn = 1\nd = {'a': [1, 2]}\ndef f(x): return x + n\n\
         open('made.txt', 'w').write('by the kernel')",
    )
    .await;
    assert!(r.is_success(), "{r:?}");
    write(m, owner, "sub/dir/up.txt", "uploaded").await;
}

#[tokio::test]
async fn a_fork_is_independent_of_its_source_in_state_and_files() {
    let dir = tempfile::tempdir().unwrap();
    // Snapshots off: a fork is asked for, so it works all the same.
    let m = KernelManager::start(none_options(&dir)).await;
    make_source(&m, "s1").await;
    let mut watch = m.events().subscribe("s1");
    let report = m.fork("s1", &["s2".to_owned()]).await.expect("fork");
    let ev = watch.next().await.expect("an event");
    assert_eq!(ev.name, "kernel");
    assert!(
        ev.data.contains(r#""change":"forked""#) && ev.data.contains("forked into 1 new session"),
        "{}",
        ev.data
    );
    assert_eq!(report.from, "s1");
    let forked = &report.into[0];
    assert_eq!(forked.session, "s2");
    // A `none` kernel forks its process.
    assert_eq!(forked.path, ForkPath::Process, "{forked:?}");
    assert_eq!(forked.fallback_reason, None);
    assert!(forked.kernel_id.is_some());
    assert_eq!(forked.workspace_bytes, 13 + 8);

    let first = run(
        &m,
        "s2",
        "n += 10\nd['a'].append(3)\n(f(0), d, open('made.txt').read())",
    )
    .await;
    assert_eq!(
        first.value.as_deref(),
        Some("(11, {'a': [1, 2, 3]}, 'by the kernel')"),
        "{first:?}"
    );
    let k = &first.kernel;
    let restored = k.restored.as_ref().expect("restored");
    assert_eq!(restored.from, RestoreFrom::Fork);
    assert!(!k.state_lost && !k.state_reset, "{k:?}");
    assert_eq!(k.forked_from.as_deref(), Some("s1"));
    let note = k.note.as_deref().unwrap_or_default();
    assert!(note.contains("This session is a fork of s1"), "{note}");
    // Every result of the forked kernel says so; the source's never do.
    let again = run(&m, "s2", "open('s2.txt', 'w').write('mine')\nn").await;
    assert_eq!(again.value.as_deref(), Some("11"));
    assert_eq!(again.kernel.forked_from.as_deref(), Some("s1"));
    assert!(again.kernel.restored.is_none());

    // The source saw none of it, and its own changes stay its own.
    let src = run(
        &m,
        "s1",
        "import os\nn += 100\n(n, d, os.path.exists('s2.txt'))",
    )
    .await;
    assert_eq!(src.value.as_deref(), Some("(101, {'a': [1, 2]}, False)"));
    assert!(src.kernel.forked_from.is_none());
    write(&m, "s1", "sub/dir/up.txt", "changed in s1").await;
    assert_eq!(
        read(&m, "s2", "sub/dir/up.txt").await.as_deref(),
        Some("uploaded")
    );
    assert_eq!(read(&m, "s1", "s2.txt").await, None);
    let r = run(&m, "s2", "n").await;
    assert_eq!(r.value.as_deref(), Some("11"));
    m.shutdown().await;
}

#[tokio::test]
async fn a_fork_makes_several_sessions_and_children_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let m = KernelManager::start(none_options(&dir)).await;
    make_source(&m, "p").await;
    let child = child_owner("p", "worker").unwrap();
    let into = vec!["a".to_owned(), "b".to_owned(), child.clone()];
    let report = m.fork("p", &into).await.expect("fork");
    let names: Vec<&str> = report.into.iter().map(|f| f.session.as_str()).collect();
    assert_eq!(names, ["a", "b", child.as_str()]);
    let mut pids = Vec::new();
    for (i, t) in into.iter().enumerate() {
        let r = run(
            &m,
            t,
            &format!("n = {i}\nimport os\n(f(1), open('sub/dir/up.txt').read(), os.getpid())"),
        )
        .await;
        let v = r.value.clone().unwrap_or_default();
        assert!(
            v.starts_with(&format!("({}, 'uploaded'", i + 1)),
            "{t}: {r:?}"
        );
        assert_eq!(r.kernel.forked_from.as_deref(), Some("p"));
        pids.push(r.kernel.pid);
    }
    pids.sort();
    pids.dedup();
    assert_eq!(pids.len(), 3, "a kernel each");

    // A child forks too, into a new session.
    let r = m
        .fork(&child, &["c".to_owned()])
        .await
        .expect("fork a child");
    assert_eq!(r.into.len(), 1);
    let c = run(&m, "c", "n").await;
    assert_eq!(c.value.as_deref(), Some("2"), "the child's state as it was");
    assert_eq!(c.kernel.forked_from.as_deref(), Some(child.as_str()));
    m.shutdown().await;
}

#[tokio::test]
async fn a_fork_is_refused_with_reasons_and_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let m = KernelManager::start(none_options(&dir)).await;
    let fork = |src: &'static str, into: &[&str]| {
        let into: Vec<String> = into.iter().map(|s| s.to_string()).collect();
        let m = &m;
        async move { m.fork(src, &into).await.unwrap_err() }
    };
    // No live kernel to fork.
    let e = fork("ghost", &["x"]).await;
    assert!(matches!(e, ManagerError::Snapshot(_)), "{e}");
    make_source(&m, "s").await;
    run(&m, "busy", "1").await;
    write(&m, "files", "a.txt", "x").await;
    for (into, want) in [
        (&[][..], "at least one"),
        (&["s"][..], "named twice (or is the source)"),
        (&["x", "x"][..], "named twice"),
        (&["busy"][..], "has a kernel"),
        (&["files"][..], "has files in its workspace"),
        (&["ok", "bad\nname"][..], "control characters"),
    ] {
        let e = fork("s", into).await;
        let text = cellhost::error_chain(&e);
        assert!(text.contains(want), "{into:?}: {text}");
        assert!(
            !matches!(e, ManagerError::Fork(ForkError::Workspace { .. })),
            "{text}"
        );
    }
    let many: Vec<String> = (0..17).map(|i| format!("t{i}")).collect();
    let e = m.fork("s", &many).await.unwrap_err();
    assert!(
        matches!(e, ManagerError::Fork(ForkError::TooMany { .. })),
        "{e}"
    );
    // Nothing was made for the targets of refused forks.
    assert_eq!(read(&m, "ok", "sub/dir/up.txt").await, None);
    let ok = run(&m, "ok", "'n' in globals()").await;
    assert_eq!(ok.value.as_deref(), Some("False"));
    assert!(ok.kernel.forked_from.is_none() && ok.kernel.restored.is_none());
    // A fork's target disposed before its first cell starts fresh.
    m.fork("s", &["gone".to_owned()]).await.unwrap();
    m.dispose_owner("gone").await;
    let gone = run(&m, "gone", "'n' in globals()").await;
    assert_eq!(gone.value.as_deref(), Some("False"));
    assert_eq!(read(&m, "gone", "made.txt").await, None);
    m.shutdown().await;
}

/// A session at rest (its kernel evicted, its state in the snapshot
/// taken as the kernel stopped) forks from that snapshot, and the source
/// still gets its own state back on its next cell.
#[tokio::test]
async fn a_session_at_rest_forks_from_its_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let opts = none_options(&dir).snapshots(Some(64 << 20)).max_kernels(1);
    let m = KernelManager::start(opts).await;
    make_source(&m, "s").await;
    run(&m, "other", "1").await; // evicts s, snapshotting it
    assert_eq!(m.stats().evictions, 1);
    assert!(m.list().iter().all(|k| k.owner != "s"));
    let report = m.fork("s", &["t".to_owned()]).await.unwrap();
    let f = &report.into[0];
    assert_eq!(f.path, ForkPath::Snapshot);
    let why = f.fallback_reason.as_deref().unwrap_or_default();
    assert!(why.contains("no live kernel"), "{f:?}");
    let t = run(
        &m,
        "t",
        "n = n + 1
(n, f(1), d['a'], open('made.txt').read())",
    )
    .await;
    assert_eq!(
        t.value.as_deref(),
        Some("(2, 3, [1, 2], 'by the kernel')"),
        "{t:?}"
    );
    assert_eq!(t.kernel.forked_from.as_deref(), Some("s"));
    assert_eq!(t.kernel.restored.as_ref().unwrap().from, RestoreFrom::Fork);
    assert!(!t.kernel.state_lost, "{t:?}");
    assert_eq!(
        read(&m, "t", "sub/dir/up.txt").await.as_deref(),
        Some("uploaded")
    );
    // The source's own state, untouched by the fork's cell.
    let s = run(&m, "s", "n").await;
    assert_eq!(s.value.as_deref(), Some("1"), "{s:?}");
    let restored = s.kernel.restored.as_ref().expect("restored");
    assert_eq!(restored.from, RestoreFrom::Evicted);
    // Neither a kernel nor a snapshot: nothing to fork.
    let e = m.fork("ghost", &["x".to_owned()]).await.unwrap_err();
    assert!(matches!(e, ManagerError::Snapshot(_)), "{e}");
    m.shutdown().await;
}

#[tokio::test]
async fn a_strict_session_forks_into_its_own_sandbox_and_workspace() {
    common::require_bwrap();
    let dir = tempfile::tempdir().unwrap();
    let opts = ManagerOptions::new(dir.path().join("data"))
        .kernel(common::strict_options(&dir, StrictSandbox::default()))
        .warm_pool(0)
        .idle_timeout(None);
    let m = KernelManager::start(opts).await;
    let r = run(&m, "s1", "x = {'k': 7}\nopen('w.txt', 'w').write('strict')").await;
    assert!(r.is_success(), "{r:?}");
    let report = m.fork("s1", &["s2".to_owned()]).await.expect("fork");
    // Its process stays in its sandbox: the state is copied by snapshot.
    assert_eq!(report.into[0].path, ForkPath::Snapshot);
    let why = report.into[0]
        .fallback_reason
        .as_deref()
        .unwrap_or_default();
    assert!(
        why.contains("strict kernel's fork would stay in its source's sandbox"),
        "{why}"
    );
    let r = run(
        &m,
        "s2",
        "import os\n(x, open('w.txt').read(), os.getcwd())",
    )
    .await;
    assert_eq!(
        r.value.as_deref(),
        Some("({'k': 7}, 'strict', '/workspace')"),
        "{r:?}"
    );
    assert_eq!(r.kernel.forked_from.as_deref(), Some("s1"));
    run(&m, "s2", "open('w.txt', 'w').write('s2')").await;
    let src = run(&m, "s1", "open('w.txt').read()").await;
    assert_eq!(src.value.as_deref(), Some("'strict'"));
    m.shutdown().await;
}

#[tokio::test]
async fn a_fork_over_the_targets_quota_fails_whole() {
    let dir = tempfile::tempdir().unwrap();
    let m = KernelManager::start(
        none_options(&dir)
            .workspace_quota(Some(4096))
            .workspace_fs(false),
    )
    .await;
    // An unsandboxed kernel's own writes are not held to the quota; the
    // copy into a new session is.
    let r = run(
        &m,
        "s",
        "open('a.bin', 'wb').write(b'1' * 3000)\nopen('b.bin', 'wb').write(b'2' * 3000)\nn = 1",
    )
    .await;
    assert!(r.is_success(), "{r:?}");
    let into = vec!["t1".to_owned(), "t2".to_owned()];
    let e = m.fork("s", &into).await.unwrap_err();
    assert!(
        matches!(&e, ManagerError::Fork(ForkError::Workspace { target, .. }) if target == "t1"),
        "{e}"
    );
    assert!(
        cellhost::error_chain(&e).contains("quota"),
        "{}",
        cellhost::error_chain(&e)
    );
    for t in &into {
        assert_eq!(read(&m, t, "a.bin").await, None, "{t}: nothing is left");
        let r = run(&m, t, "'n' in globals()").await;
        assert_eq!(r.value.as_deref(), Some("False"));
        assert!(r.kernel.restored.is_none());
    }
    m.shutdown().await;
}

#[tokio::test]
async fn a_none_kernel_forks_its_process_into_a_kernel_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let m = KernelManager::start(none_options(&dir)).await;
    let src = run(
        &m,
        "s1",
        "import os\nbig = bytearray(50 << 20)\nbig[-1] = 7\nos.getpid(), os.getpgid(0)",
    )
    .await;
    assert!(src.is_success(), "{src:?}");
    let report = m.fork("s1", &["s2".to_owned()]).await.expect("fork");
    assert_eq!(report.into[0].path, ForkPath::Process, "{report:?}");
    let r = run(
        &m,
        "s2",
        "print('from the fork')\n(big[-1], os.getpid(), os.getpgid(0), os.getcwd())",
    )
    .await;
    assert_eq!(r.stdout, "from the fork\n", "{r:?}");
    let restored = r.kernel.restored.as_ref().expect("restored");
    assert_eq!(restored.from, RestoreFrom::Fork);
    assert!(restored.skipped.is_empty() && !r.kernel.state_lost);
    assert!(
        r.kernel
            .note
            .as_deref()
            .unwrap_or_default()
            .contains("a copy of s1's process"),
        "{r:?}"
    );
    assert_eq!(r.kernel.forked_from.as_deref(), Some("s1"));
    assert_eq!(Some(r.kernel.id.clone()), report.into[0].kernel_id);
    // Its own process and group, running in its own workspace.
    let value = r.value.clone().unwrap_or_default();
    let src_ids = src.value.clone().unwrap_or_default();
    let (src_pid, src_group) = src_ids
        .trim_matches(|c| c == '(' || c == ')')
        .split_once(", ")
        .unwrap();
    assert!(value.starts_with("(7, "), "{value}");
    assert!(
        !value.contains(src_pid) && !value.contains(src_group),
        "{value} vs {src_ids}"
    );
    let ws = m
        .workspace("s2")
        .unwrap()
        .root()
        .to_string_lossy()
        .into_owned();
    assert!(value.ends_with(&format!("'{ws}')")), "{value} vs {ws}");
    // The source's next cell sees none of the fork's output or state.
    let after = run(&m, "s1", "big[-1] = 1\nprint('source')").await;
    assert_eq!(after.stdout, "source\n");
    // The fork outlives its source, and goes with the manager.
    m.dispose_owner("s1").await;
    let r = run(&m, "s2", "big[-1]").await;
    assert_eq!(r.value.as_deref(), Some("7"), "{r:?}");
    let pid = r.kernel.pid.expect("pid");
    m.shutdown().await;
    assert!(
        !cellhost::sys::pid_alive(pid),
        "the forked kernel {pid} outlived the manager"
    );
}

#[tokio::test]
async fn a_kernel_with_threads_or_open_files_forks_by_snapshot_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let m = KernelManager::start(none_options(&dir)).await;
    let r = run(
        &m,
        "t",
        "import threading, time\nstop = threading.Event()\n\
         th = threading.Thread(target=stop.wait, name='waiter', daemon=True)\nth.start()\nn = 5",
    )
    .await;
    assert!(r.is_success(), "{r:?}");
    let report = m.fork("t", &["t2".to_owned()]).await.expect("fork");
    let f = &report.into[0];
    assert_eq!(f.path, ForkPath::Snapshot);
    let why = f.fallback_reason.as_deref().unwrap_or_default();
    assert!(why.contains("thread") && why.contains("waiter"), "{why}");
    assert_eq!(run(&m, "t2", "n").await.value.as_deref(), Some("5"));
    run(&m, "t", "stop.set()\nth.join()\nfh = open('held.txt', 'w')").await;
    let report = m.fork("t", &["t3".to_owned()]).await.expect("fork");
    let why = report.into[0]
        .fallback_reason
        .as_deref()
        .unwrap_or_default();
    assert!(why.contains("open file"), "{why}");
    // Once the file is closed, the process forks.
    run(&m, "t", "fh.close()").await;
    let report = m.fork("t", &["t4".to_owned()]).await.expect("fork");
    assert_eq!(report.into[0].path, ForkPath::Process, "{report:?}");
    assert_eq!(run(&m, "t4", "n").await.value.as_deref(), Some("5"));
    m.shutdown().await;
}

#[tokio::test]
async fn a_process_fork_evicted_before_its_first_cell_still_says_it_is_a_fork() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = none_options(&dir).snapshots(Some(1 << 30));
    o.max_kernels = 2;
    let m = KernelManager::start(o).await;
    assert!(run(&m, "s1", "n = 1").await.is_success());
    let report = m.fork("s1", &["s2".to_owned()]).await.expect("fork");
    assert_eq!(report.into[0].path, ForkPath::Process, "{report:?}");
    // s1 used after the fork: s2's kernel, never used, is the one evicted
    // when s3 starts (its state goes into the snapshot taken as it stops).
    assert!(run(&m, "s1", "n = 5").await.is_success());
    assert!(run(&m, "s3", "1").await.is_success());
    assert!(
        m.list().iter().all(|k| k.owner != "s2"),
        "s2 evicted: {:?}",
        m.list()
    );
    let r = run(&m, "s2", "n + 1").await;
    assert_eq!(r.value.as_deref(), Some("2"), "the fork's copy: {r:?}");
    assert_eq!(r.kernel.forked_from.as_deref(), Some("s1"), "{r:?}");
    let restored = r.kernel.restored.as_ref().expect("restored");
    assert_eq!(restored.from, RestoreFrom::Fork, "{r:?}");
    assert!(!r.kernel.state_lost);
    m.shutdown().await;
}

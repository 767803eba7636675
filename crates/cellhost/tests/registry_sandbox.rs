//! The manager under the strict sandbox: each session and each delegated
//! child gets its own workspace, files outlive evictions, disposal removes
//! them, and pooled kernels hand their workspace to the owner they serve.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use cellhost::registry::{child_owner, KernelManager, ManagerOptions};
use cellhost::{Cell, CellResult, Status, StrictSandbox};
use common::registry::eventually;

async fn strict_manager(
    dir: &tempfile::TempDir,
    f: impl FnOnce(ManagerOptions) -> ManagerOptions,
) -> KernelManager {
    let opts = ManagerOptions::new(dir.path().join("data"))
        .kernel(common::strict_options(dir, StrictSandbox::default()))
        .warm_pool(0)
        .idle_timeout(None);
    KernelManager::start(f(opts)).await
}

async fn run(m: &KernelManager, owner: &str, code: &str) -> CellResult {
    m.execute(owner, Cell::new(code)).await.expect("execute")
}

/// Every file named `name` under `root`, with its content.
fn find(root: &Path, name: &str) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else if p.file_name().is_some_and(|n| n == name) {
                out.push((p.clone(), std::fs::read_to_string(&p).unwrap_or_default()));
            }
        }
    }
    out
}

/// `owner`'s `mine.txt` as a new manager on the same data dir finds it
/// (its workspace may be a volume that is mounted only while in use).
async fn reread(dir: &tempfile::TempDir, owner: &str) -> Option<String> {
    let m = strict_manager(dir, |o| o).await;
    let mut out = Vec::new();
    let found = m
        .workspace(owner)
        .unwrap()
        .read_to("mine.txt", None, &mut out)
        .await
        .ok()
        .map(|_| String::from_utf8(out).unwrap());
    m.shutdown().await;
    found
}

const WRITE: &str =
    "import os\nopen('/workspace/mine.txt', 'w').write(os.environ.get('ME', '') or ME)\n";

#[tokio::test]
async fn sessions_and_children_get_their_own_workspaces_and_disposal_removes_them() {
    let dir = tempfile::tempdir().unwrap();
    let m = strict_manager(&dir, |o| o).await;
    let child = child_owner("a", "c").unwrap();
    for (owner, me) in [("a", "a"), ("b", "b"), (child.as_str(), "child")] {
        let r = run(&m, owner, &format!("ME = {me:?}\n{WRITE}")).await;
        assert_eq!(r.status, Status::Success, "{r:?}");
    }
    for (owner, me) in [("a", "a"), ("b", "b"), (child.as_str(), "child")] {
        let r = run(&m, owner, "open('/workspace/mine.txt').read()").await;
        assert_eq!(
            r.value,
            Some(format!("{me:?}").replace('"', "'")),
            "{owner}"
        );
        let r = run(&m, owner, "sorted(os.listdir('/workspace'))").await;
        assert_eq!(
            r.value.as_deref(),
            Some("['mine.txt']"),
            "{owner} sees only its own files"
        );
    }
    let root = dir.path().join("data/workspaces");
    assert_eq!(find(&root, "mine.txt").len(), 3);

    m.dispose_child("a", "c").await.unwrap();
    let left: Vec<String> = find(&root, "mine.txt")
        .into_iter()
        .map(|(_, c)| c)
        .collect();
    assert_eq!(left.len(), 2, "the child's workspace is gone: {left:?}");
    assert!(!left.contains(&"child".to_owned()));
    m.dispose_owner("a").await;
    let left: Vec<String> = find(&root, "mine.txt")
        .into_iter()
        .map(|(_, c)| c)
        .collect();
    assert_eq!(left, vec!["b".to_owned()]);
    m.shutdown().await;
    assert_eq!(
        reread(&dir, "b").await.as_deref(),
        Some("b"),
        "shutdown keeps sessions' files"
    );
    assert_eq!(reread(&dir, "a").await, None, "disposed");
}

#[tokio::test]
async fn files_outlive_an_eviction_though_state_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let m = strict_manager(&dir, |o| o.max_kernels(1)).await;
    run(&m, "a", &format!("ME = 'a'\n{WRITE}")).await;
    run(&m, "b", "1").await; // evicts a
    let back = run(&m, "a", "ME").await;
    assert!(back.kernel.state_lost, "{:?}", back.kernel);
    let file = run(&m, "a", "open('/workspace/mine.txt').read()").await;
    assert_eq!(file.value.as_deref(), Some("'a'"));
    m.shutdown().await;
}

#[tokio::test]
async fn a_pooled_sandboxed_kernel_hands_its_workspace_to_its_new_owner() {
    let dir = tempfile::tempdir().unwrap();
    let m = strict_manager(&dir, |o| o.warm_pool(1)).await;
    assert!(eventually(Duration::from_secs(20), || m.pooled() == 1).await);
    let r = run(&m, "new", &format!("ME = 'new'\n{WRITE}")).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(m.stats().pool_hits, 1);
    let root = dir.path().join("data/workspaces");
    let found = find(&root, "mine.txt");
    assert_eq!(found.len(), 1);
    let path = found[0].0.to_string_lossy().into_owned();
    assert!(
        path.contains("/new-") && path.ends_with("/ws/mine.txt"),
        "{path}"
    );
    assert!(eventually(Duration::from_secs(20), || m.pooled() == 1).await);
    m.shutdown().await;
    let pools: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".pool-"))
        .collect();
    assert!(
        pools.is_empty(),
        "pooled kernels' workspaces are removed at shutdown"
    );
    assert_eq!(reread(&dir, "new").await.as_deref(), Some("new"));
}

#[tokio::test]
async fn an_owner_with_files_never_takes_a_pooled_kernel_with_other_files() {
    let dir = tempfile::tempdir().unwrap();
    let m = strict_manager(&dir, |o| o.warm_pool(1).max_kernels(1)).await;
    assert!(eventually(Duration::from_secs(20), || m.pooled() == 1).await);
    run(&m, "a", &format!("ME = 'a'\n{WRITE}")).await; // takes the pooled kernel
    assert!(eventually(Duration::from_secs(20), || m.pooled() == 1).await);
    run(&m, "b", "1").await; // evicts a (b takes the refilled pool kernel)
    assert!(eventually(Duration::from_secs(20), || m.pooled() == 1).await);
    let hits = m.stats().pool_hits;
    let r = run(&m, "a", "open('/workspace/mine.txt').read()").await;
    assert_eq!(
        r.value.as_deref(),
        Some("'a'"),
        "a is back on its own files: {r:?}"
    );
    assert_eq!(
        m.stats().pool_hits,
        hits,
        "a pooled kernel could not serve a"
    );
    assert_eq!(m.pooled(), 1, "the pooled kernel went back to the pool");
    m.shutdown().await;
}

#[tokio::test]
async fn a_pooled_kernel_restarts_on_its_owners_workspace() {
    let dir = tempfile::tempdir().unwrap();
    let m = strict_manager(&dir, |o| o.warm_pool(1)).await;
    assert!(eventually(Duration::from_secs(20), || m.pooled() == 1).await);
    run(&m, "a", &format!("ME = 'a'\n{WRITE}")).await;
    assert_eq!(m.stats().pool_hits, 1);
    // The process dies; its replacement binds the renamed workspace.
    let died = run(&m, "a", "import os; os._exit(3)").await;
    assert!(died.kernel.ended || died.kernel.state_lost, "{died:?}");
    let r = run(&m, "a", "open('/workspace/mine.txt').read()").await;
    assert_eq!(r.value.as_deref(), Some("'a'"), "{r:?}");
    let r = m
        .execute(
            "a",
            Cell::new("open('/workspace/mine.txt').read()").reset(true),
        )
        .await
        .unwrap();
    assert_eq!(r.value.as_deref(), Some("'a'"), "after a reset too: {r:?}");
    m.shutdown().await;
}

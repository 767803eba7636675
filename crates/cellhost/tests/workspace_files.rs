//! The workspace handle against strict kernels: uploads a cell reads,
//! files a cell wrote downloaded byte-exact, every path attack a cell can
//! plant refused with nothing outside read or written, the quota, cut
//! output spilled where the next cell finds it, children apart.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use cellhost::files::{EntryType, FileError, Workspace, WriteLimits};
use cellhost::registry::{child_owner, KernelManager, ManagerOptions};
use cellhost::{Cell, CellResult, Status, StrictSandbox};

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
    let r = m.execute(owner, Cell::new(code)).await.expect("execute");
    assert_eq!(r.status, Status::Success, "{r:?}");
    r
}

async fn put(
    ws: &Workspace,
    path: &str,
    bytes: &[u8],
) -> Result<cellhost::files::Written, FileError> {
    ws.write(path, bytes, WriteLimits::default()).await
}

async fn get(ws: &Workspace, path: &str) -> Result<Vec<u8>, FileError> {
    let mut out = Vec::new();
    ws.read_to(path, None, &mut out).await?;
    Ok(out)
}

fn sha256_hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let out = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write as _;
            c.stdin.take().unwrap().write_all(bytes)?;
            c.wait_with_output()
        })
        .unwrap();
    let mut s = String::new();
    let _ = write!(s, "{}", String::from_utf8_lossy(&out.stdout[..64]));
    s
}

#[tokio::test]
async fn an_upload_before_the_first_cell_is_read_by_the_cell_and_a_cells_file_downloads_byte_exact()
{
    let dir = tempfile::tempdir().unwrap();
    let m = strict_manager(&dir, |o| o).await;
    let ws = m.workspace("s1").unwrap();
    let binary: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 256) as u8).collect();
    let w = put(&ws, "data/sales.bin", &binary).await.unwrap();
    assert!(w.created);
    assert_eq!(
        (w.size, w.sha256.as_str()),
        (300_000, sha256_hex(&binary).as_str())
    );
    let again = put(&ws, "data/sales.bin", &binary).await.unwrap();
    assert!(!again.created, "replaced");
    put(&ws, "empty.txt", b"").await.unwrap();
    let r = run(
        &m,
        "s1",
        "import hashlib\nb = open('/workspace/data/sales.bin','rb').read()\n\
         open('/workspace/out.bin','wb').write(bytes(range(256)) * 1000)\n\
         (len(b), hashlib.sha256(b).hexdigest(), open('empty.txt').read())",
    )
    .await;
    assert_eq!(
        r.value.unwrap(),
        format!("(300000, '{}', '')", sha256_hex(&binary))
    );
    let out = get(&ws, "out.bin").await.unwrap();
    let want: Vec<u8> = (0..=255u8).cycle().take(256_000).collect();
    assert_eq!(sha256_hex(&out), sha256_hex(&want));
    assert_eq!(get(&ws, "empty.txt").await.unwrap(), b"");
    // Owned by the workspace's owner (the kernel's uid), 0644, not setuid.
    let root_meta = std::fs::metadata(ws.root()).unwrap();
    let meta = std::fs::metadata(ws.root().join("data/sales.bin")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (root_meta.uid(), root_meta.gid()));
    assert_eq!(meta.mode() & 0o7777, 0o644);
    let d = std::fs::metadata(ws.root().join("data")).unwrap();
    assert_eq!((d.uid(), d.mode() & 0o7777), (root_meta.uid(), 0o755));
    // A range.
    let mut part = Vec::new();
    ws.read_to("data/sales.bin", Some((1000, 10)), &mut part)
        .await
        .unwrap();
    assert_eq!(part, &binary[1000..1010]);
    // Listing, recursive, bounded.
    let all = ws.list("", true, 100).await.unwrap();
    let names: Vec<_> = all.entries.iter().map(|e| e.path.as_str()).collect();
    assert!(
        names.contains(&"data/sales.bin") && names.contains(&"out.bin"),
        "{names:?}"
    );
    assert!(!all.truncated);
    let two = ws.list("", true, 2).await.unwrap();
    assert!(two.truncated && two.entries.len() == 2, "{two:?}");
    // Delete.
    let err = ws.remove("data", false).await.unwrap_err();
    assert_eq!(err.code(), "is_a_directory");
    ws.remove("data", true).await.unwrap();
    assert_eq!(
        get(&ws, "data/sales.bin").await.unwrap_err().code(),
        "not_found"
    );
    m.shutdown().await;
}

#[tokio::test]
async fn paths_a_cell_plants_never_lead_outside_the_workspace() {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "outside").unwrap();
    let m = strict_manager(&dir, |o| o).await;
    let ws = m.workspace("s1").unwrap();
    // Planted from inside the sandbox: the cell can name any host path.
    run(
        &m,
        "s1",
        &format!(
            "import os\nos.symlink('/etc/shadow', 'leak')\nos.symlink('/', 'root')\n\
             os.symlink({out:?}, 'out')\nos.symlink('/etc', 'etcdir')\nos.mkfifo('fifo')\n\
             os.mkdir('real')\nos.symlink('/etc/passwd', 'real/pw')",
            out = outside.path().display().to_string()
        ),
    )
    .await;
    let shadow_before = std::fs::read("/etc/shadow").ok();
    for (path, code) in [
        ("leak", "invalid_path"),
        ("root/etc/passwd", "invalid_path"),
        ("etcdir/passwd", "invalid_path"),
        ("out/secret", "invalid_path"),
        ("real/pw", "invalid_path"),
        ("../etc/passwd", "invalid_path"),
        ("/etc/passwd", "invalid_path"),
        ("a\0b", "invalid_path"),
        ("fifo", "not_a_regular_file"),
    ] {
        let got = tokio::time::timeout(Duration::from_secs(5), get(&ws, path))
            .await
            .expect("a planted FIFO never hangs the daemon");
        assert_eq!(got.unwrap_err().code(), code, "GET {path:?}");
    }
    let long = "n".repeat(4096);
    assert_eq!(get(&ws, &long).await.unwrap_err().code(), "invalid_path");
    for path in [
        "out/new",
        "root/tmp/new",
        "etcdir/new",
        "../new",
        "/tmp/new",
        long.as_str(),
    ] {
        let err = put(&ws, path, b"evil").await.unwrap_err();
        assert_eq!(err.code(), "invalid_path", "PUT {path:?}: {err}");
    }
    assert!(!outside.path().join("new").exists() && !Path::new("/tmp/new").exists());
    for path in ["root", "out", "etcdir"] {
        assert_eq!(
            ws.list(path, false, 10).await.unwrap_err().code(),
            "invalid_path",
            "list {path}"
        );
    }
    let listing = ws.list("", true, 1000).await.unwrap();
    let kind = |p: &str| listing.entries.iter().find(|e| e.path == p).map(|e| e.kind);
    assert_eq!(kind("leak"), Some(EntryType::Symlink));
    assert_eq!(kind("root"), Some(EntryType::Symlink));
    assert_eq!(kind("fifo"), Some(EntryType::Other));
    assert!(
        listing
            .entries
            .iter()
            .all(|e| !e.path.starts_with("root/") && !e.path.starts_with("out/")),
        "never listed through a symlink"
    );
    // An upload to a symlink's name replaces the link, never its target.
    put(&ws, "leak", b"mine").await.unwrap();
    assert_eq!(std::fs::read("/etc/shadow").ok(), shadow_before);
    assert_eq!(get(&ws, "leak").await.unwrap(), b"mine");
    // Deletes remove the link itself, never what it points to.
    for path in ["out/secret", "real/pw/x", "etcdir/passwd"] {
        assert!(ws.remove(path, true).await.is_err(), "DELETE {path}");
    }
    ws.remove("out", true).await.unwrap();
    ws.remove("root", true).await.unwrap();
    ws.remove("real", true).await.unwrap();
    assert_eq!(
        std::fs::read_to_string(outside.path().join("secret")).unwrap(),
        "outside"
    );
    assert!(Path::new("/etc/passwd").exists());
    m.shutdown().await;
}

#[tokio::test]
async fn the_quota_refuses_an_upload_and_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let m = strict_manager(&dir, |o| o.workspace_quota(Some(1024 * 1024))).await;
    let ws = m.workspace("s1").unwrap();
    put(&ws, "a.bin", &vec![1u8; 600_000]).await.unwrap();
    let err = put(&ws, "b.bin", &vec![2u8; 600_000]).await.unwrap_err();
    assert_eq!(err.code(), "quota_exceeded", "{err}");
    assert!(err.to_string().contains("workspace_mib"), "{err}");
    // Replacing a file counts its old size out.
    put(&ws, "a.bin", &vec![3u8; 900_000]).await.unwrap();
    let err = ws
        .write(
            "c.bin",
            &vec![0u8; 10_000][..],
            WriteLimits {
                max_bytes: Some(5_000),
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), "too_large");
    let names: Vec<_> = std::fs::read_dir(ws.root())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["a.bin"], "no temporary file stays");
    m.shutdown().await;
}

#[tokio::test]
async fn cut_output_is_readable_by_the_next_cell_and_downloadable() {
    let dir = tempfile::tempdir().unwrap();
    let m = strict_manager(&dir, |o| o).await;
    let r = run(&m, "s1", "print('x' * 200_000)").await;
    assert!(r.truncated.stdout);
    let spill = r.truncated.spill_path.clone().unwrap();
    assert_eq!(spill, "/workspace/.cellhost/output/cell-1.stdout.txt");
    assert!(
        r.stdout.contains(&spill),
        "the marker names it: {:.200}",
        &r.stdout[19_000..21_000]
    );
    assert!(r
        .stdout
        .contains("files/.cellhost/output/cell-1.stdout.txt"));
    let next = run(&m, "s1", &format!("len(open({spill:?}).read())")).await;
    assert_eq!(next.value.as_deref(), Some("200001"));
    let ws = m.workspace("s1").unwrap();
    let got = get(&ws, ".cellhost/output/cell-1.stdout.txt")
        .await
        .unwrap();
    assert_eq!(got.len(), 200_001);
    let runtime_spill = dir.path().join("run/spill");
    let left: Vec<_> = std::fs::read_dir(&runtime_spill)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "nothing under the runtime dir: {left:?}");
    m.dispose_owner("s1").await;
    assert!(!ws.root().exists(), "gone with the session");
    m.shutdown().await;
}

#[tokio::test]
async fn a_childs_files_are_invisible_to_its_parent_and_survive_a_reset() {
    let dir = tempfile::tempdir().unwrap();
    let m = strict_manager(&dir, |o| o).await;
    let child = child_owner("p", "c").unwrap();
    let (pw, cw) = (m.workspace("p").unwrap(), m.workspace(&child).unwrap());
    put(&cw, "child.txt", b"c").await.unwrap();
    put(&pw, "parent.txt", b"p").await.unwrap();
    assert_eq!(get(&pw, "child.txt").await.unwrap_err().code(), "not_found");
    assert_eq!(
        get(&cw, "parent.txt").await.unwrap_err().code(),
        "not_found"
    );
    let r = run(&m, &child, "import os\nsorted(os.listdir('/workspace'))").await;
    assert_eq!(r.value.as_deref(), Some("['child.txt']"));
    let reset = m
        .execute(
            "p",
            Cell {
                reset: true,
                ..Cell::new("open('/workspace/parent.txt').read()")
            },
        )
        .await
        .unwrap();
    assert_eq!(reset.value.as_deref(), Some("'p'"), "{reset:?}");
    m.shutdown().await;
    // A restarted manager finds the files.
    let m = strict_manager(&dir, |o| o).await;
    let r = run(&m, "p", "open('/workspace/parent.txt').read()").await;
    assert_eq!(r.value.as_deref(), Some("'p'"));
    assert_eq!(
        get(&m.workspace("p").unwrap(), "parent.txt").await.unwrap(),
        b"p"
    );
    m.shutdown().await;
}

#[tokio::test]
async fn a_none_kernel_served_by_the_manager_runs_in_its_workspace() {
    let dir = tempfile::tempdir().unwrap();
    let m = KernelManager::start(
        ManagerOptions::new(dir.path().join("data"))
            .kernel(common::options(&dir))
            .warm_pool(1)
            .idle_timeout(None),
    )
    .await;
    let ws = m.workspace("s1").unwrap();
    let r = run(
        &m,
        "s1",
        "import os\nopen('made.txt','w').write('hi')\nos.getcwd()",
    )
    .await;
    assert_eq!(
        r.value.unwrap(),
        format!("{:?}", ws.root().display().to_string()).replace('"', "'")
    );
    assert_eq!(get(&ws, "made.txt").await.unwrap(), b"hi");
    let r = run(&m, "s1", "print('y' * 100_000)").await;
    let spill = r.truncated.spill_path.unwrap();
    assert_eq!(
        Path::new(&spill),
        ws.root().join(".cellhost/output/cell-2.stdout.txt")
    );
    // After a reset (a new process) the kernel is still in its workspace.
    let r = m
        .execute(
            "s1",
            Cell {
                reset: true,
                ..Cell::new("open('made.txt').read()")
            },
        )
        .await
        .unwrap();
    assert_eq!(r.value.as_deref(), Some("'hi'"), "{r:?}");
    m.shutdown().await;
}

#[tokio::test]
async fn a_pooled_none_kernels_cut_output_is_kept_in_its_owners_workspace() {
    let dir = tempfile::tempdir().unwrap();
    let m = KernelManager::start(
        ManagerOptions::new(dir.path().join("data"))
            .kernel(common::options(&dir))
            .warm_pool(1)
            .idle_timeout(None),
    )
    .await;
    let end = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while m.pooled() < 1 && std::time::Instant::now() < end {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(m.pooled(), 1, "the pool filled");
    let r = run(&m, "s1", "print('y' * 100_000)").await;
    assert_eq!(m.stats().pool_hits, 1, "served by the pooled kernel");
    let ws = m.workspace("s1").unwrap();
    assert_eq!(
        r.truncated.spill_path.as_deref().map(Path::new),
        Some(
            ws.root()
                .join(".cellhost/output/cell-1.stdout.txt")
                .as_path()
        ),
        "{r:?}"
    );
    let kept = get(&ws, ".cellhost/output/cell-1.stdout.txt")
        .await
        .unwrap();
    assert_eq!(kept.len(), 100_001);
    m.shutdown().await;
}

//! Workspace files on remote backends, over the real sshd and dockerd of
//! the test environment (scripts/testenv-up): the same handle the HTTP
//! routes use, its bytes over the backend's exec transport, its path rules
//! enforced on the remote side.

mod common;

use cellhost::config::BackendConfig;
use cellhost::files::{EntryType, FileError, Workspace, WriteLimits};
use cellhost::{CellResult, Status};
use common::registry::TestManager;
use common::remote::{docker, docker_sh, env, kubectl_standin, remote_manager, ssh, ssh_sh};

async fn run(m: &TestManager, code: &str) -> CellResult {
    let r = m.run("s", code).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    r
}

async fn get(ws: &Workspace, path: &str, range: Option<(u64, u64)>) -> Result<Vec<u8>, FileError> {
    let mut out = Vec::new();
    ws.read_to(path, range, &mut out).await?;
    Ok(out)
}

/// Download through `open` + `range`, as the HTTP route does.
async fn get_range(ws: &Workspace, path: &str, start: u64, len: u64) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let cellhost::files::Opened::File(f) = ws.open(path).await.unwrap() else {
        panic!("{path} is a directory")
    };
    let mut r = f.range(start, len).await.unwrap();
    let mut out = Vec::new();
    r.read_to_end(&mut out).await.unwrap();
    out
}

/// The whole contract on one backend; `sh` runs a command on its far side.
async fn files_round_trip(name: &str, backend: BackendConfig, sh: impl Fn(&str) -> String) {
    let m = remote_manager(name, backend, |o| o).await;
    let ws = m.manager.workspace("s").unwrap();
    assert!(
        ws.as_remote().is_some(),
        "a remote session's workspace is remote"
    );

    // Upload before the first cell; the cell (whose cwd is the workspace) reads it.
    let binary: Vec<u8> = (0..700_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let w = ws
        .write("data/in.bin", &binary[..], WriteLimits::default())
        .await
        .unwrap();
    assert!(w.created && w.size == binary.len() as u64, "{w:?}");
    let r = run(
        &m,
        "import hashlib, os\nprint(hashlib.sha256(open('data/in.bin','rb').read()).hexdigest())\nos.getcwd()",
    )
    .await;
    assert_eq!(
        r.stdout.trim(),
        w.sha256,
        "the cell read the upload byte-exact"
    );
    let cwd = r.value.unwrap().trim_matches('\'').to_owned();
    assert!(
        cwd.contains("cellhost-ws-") && cwd.ends_with("/ws"),
        "{cwd}"
    );

    // Replacing answers "not created".
    let w2 = ws
        .write("data/in.bin", &b"x"[..], WriteLimits::default())
        .await
        .unwrap();
    assert!(!w2.created);

    // A file a cell wrote downloads byte-exact, whole and by ranges.
    run(
        &m,
        "open('out.bin','wb').write(bytes(i % 253 for i in range(1_000_003)))",
    )
    .await;
    let want: Vec<u8> = (0..1_000_003u32).map(|i| (i % 253) as u8).collect();
    assert_eq!(get(&ws, "out.bin", None).await.unwrap(), want);
    assert_eq!(get_range(&ws, "out.bin", 10, 5).await, want[10..15]);
    assert_eq!(
        get_range(&ws, "out.bin", 999_990, 13).await,
        want[999_990..]
    );
    assert_eq!(get(&ws, "out.bin", Some((5, 3))).await.unwrap(), want[5..8]);

    // Listing.
    let l = ws.list("", false, 100).await.unwrap();
    let names: Vec<_> = l
        .entries
        .iter()
        .map(|e| (e.name.as_str(), e.kind))
        .collect();
    assert!(names.contains(&("data", EntryType::Dir)), "{names:?}");
    assert!(names.contains(&("out.bin", EntryType::File)), "{names:?}");
    let l = ws.list("", true, 100).await.unwrap();
    assert!(l
        .entries
        .iter()
        .any(|e| e.path == "data/in.bin" && e.size == 1));
    let l = ws.list("", true, 1).await.unwrap();
    assert!(l.truncated && l.entries.len() == 1);

    // Planted symlinks and a FIFO: refused, nothing read through them.
    run(
        &m,
        "import os\nos.symlink('/etc/shadow', 'leak')\nos.symlink('/', 'root')\nos.mkfifo('pipe')\nos.symlink('/etc', 'data/etc')",
    )
    .await;
    for p in ["leak", "root/etc/passwd", "data/etc/passwd"] {
        let e = get(&ws, p, None).await.unwrap_err();
        assert_eq!(e.code(), "invalid_path", "{p}: {e}");
        let e = ws.open(p).await.unwrap_err();
        assert_eq!(e.code(), "invalid_path", "{p}: {e}");
    }
    let e = ws
        .write("root/tmp/evil", &b"x"[..], WriteLimits::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), "invalid_path", "{e}");
    assert!(sh("ls /tmp/evil 2>/dev/null; echo done").trim() == "done");
    let e = ws.list("root", false, 10).await.unwrap_err();
    assert_eq!(e.code(), "invalid_path", "{e}");
    // A planted FIFO does not hang the transfer: it is refused.
    let e = tokio::time::timeout(std::time::Duration::from_secs(20), get(&ws, "pipe", None))
        .await
        .expect("a FIFO must not block")
        .unwrap_err();
    assert_eq!(e.code(), "not_a_regular_file", "{e}");
    // An upload onto the link replaces the link, never its target.
    ws.write("leak", &b"mine"[..], WriteLimits::default())
        .await
        .unwrap();
    assert_eq!(get(&ws, "leak", None).await.unwrap(), b"mine");
    let l = ws.list("", false, 100).await.unwrap();
    let kinds: Vec<_> = l
        .entries
        .iter()
        .map(|e| (e.name.as_str(), e.kind))
        .collect();
    assert!(kinds.contains(&("root", EntryType::Symlink)), "{kinds:?}");
    assert!(kinds.contains(&("pipe", EntryType::Other)), "{kinds:?}");
    // `..` and absolute paths never leave the host.
    for p in ["../x", "/etc/passwd", "a/../../x"] {
        assert_eq!(get(&ws, p, None).await.unwrap_err().code(), "invalid_path");
    }

    // Errors in the API's codes.
    assert_eq!(
        get(&ws, "nope", None).await.unwrap_err().code(),
        "not_found"
    );
    assert_eq!(
        ws.write("data", &b"x"[..], WriteLimits::default())
            .await
            .unwrap_err()
            .code(),
        "is_a_directory"
    );
    assert_eq!(
        get(&ws, "out.bin/x", None).await.unwrap_err().code(),
        "not_a_directory"
    );
    let e = ws
        .write(
            "big",
            &vec![0u8; 3 << 20][..],
            WriteLimits {
                max_bytes: Some(1 << 20),
            },
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), "too_large", "{e}");
    assert!(
        !ws.list("", false, 100)
            .await
            .unwrap()
            .entries
            .iter()
            .any(|e| e.name.starts_with(".cellhost-upload")),
        "a refused upload leaves no temporary file"
    );

    // Delete: a file, the link itself, a directory only with recursive.
    ws.remove("out.bin", false).await.unwrap();
    assert_eq!(
        get(&ws, "out.bin", None).await.unwrap_err().code(),
        "not_found"
    );
    ws.remove("root", false).await.unwrap();
    assert_eq!(sh("test -d /etc && echo yes").trim(), "yes");
    assert_eq!(
        ws.remove("data", false).await.unwrap_err().code(),
        "is_a_directory"
    );
    ws.remove("data", true).await.unwrap();
    assert_eq!(
        sh("test -e /etc/passwd && echo yes").trim(),
        "yes",
        "the symlinked /etc survived"
    );
    let r = run(&m, "import os\nsorted(os.listdir('.'))").await;
    assert_eq!(r.value.as_deref(), Some("['leak', 'pipe']"), "{r:?}");

    // The files outlive the runner (a reset) and go with the session.
    m.manager.dispose_owner("s").await;
    assert!(
        sh(&format!("test -e '{cwd}' && echo there || echo gone")).trim() == "gone",
        "DELETE of the session removes its remote workspace"
    );
    m.manager.shutdown().await;
}

#[tokio::test]
async fn files_on_an_ssh_backend() {
    files_round_trip("box", ssh(), |s| ssh_sh(&env("CELLHOST_TEST_SSH_HOST"), s)).await;
}

#[tokio::test]
async fn files_on_a_docker_backend() {
    let c = env("CELLHOST_TEST_DOCKER_CONTAINER");
    files_round_trip("ctr", docker(), |s| docker_sh(&c, s)).await;
}

#[tokio::test]
async fn files_on_a_kubectl_backend_through_the_standin() {
    let dir = tempfile::tempdir().unwrap();
    let c = env("CELLHOST_TEST_DOCKER_CONTAINER");
    files_round_trip("pod", kubectl_standin(dir.path()), |s| docker_sh(&c, s)).await;
}

#[tokio::test]
async fn files_survive_a_runner_restart_and_the_quota_holds_on_the_remote_side() {
    let m = remote_manager("box", ssh(), |o| o.workspace_quota(Some(2 << 20))).await;
    let ws = m.manager.workspace("s").unwrap();
    ws.write("a.bin", &vec![1u8; 1 << 20][..], WriteLimits::default())
        .await
        .unwrap();
    let e = ws
        .write("b.bin", &vec![2u8; 3 << 19][..], WriteLimits::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), "quota_exceeded", "{e}");
    assert!(ws.usage().await.unwrap() == 1 << 20);
    let r = m.run("s", "import os; os.path.getsize('a.bin')").await;
    assert_eq!(r.value.as_deref(), Some("1048576"), "{r:?}");
    let pid = r.kernel.pid.unwrap();
    ssh_sh(&env("CELLHOST_TEST_SSH_HOST"), &format!("kill -9 {pid}"));
    let r = m.run("s", "import os; os.path.getsize('a.bin')").await;
    assert!(r.kernel.state_lost, "{:?}", r.kernel);
    assert_eq!(
        r.value.as_deref(),
        Some("1048576"),
        "a fresh runner starts in the same workspace"
    );
    m.manager.shutdown().await;
}

#[tokio::test]
async fn an_image_mode_docker_backend_says_it_has_no_workspace() {
    let m = remote_manager("img", common::remote::docker_image(), |o| o).await;
    let ws = m.manager.workspace("s").unwrap();
    let e = ws.list("", false, 10).await.unwrap_err();
    let e = cellhost::error_chain(&e);
    assert!(e.contains("image mode"), "{e}");
    m.manager.shutdown().await;
}

//! Process hygiene: groups, teardown, staging dirs, no orphans.
mod common;

use std::time::Duration;

use cellhost::Status;
use common::*;

#[tokio::test]
async fn the_staging_dir_is_private_and_removed_at_shutdown() {
    let k = kernel().await;
    k.run("x = 1").await;
    let dirs = k.staging_dirs();
    assert_eq!(dirs.len(), 1);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&dirs[0]).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
    k.kernel.shutdown().await;
    assert!(k.staging_dirs().is_empty());
}

/// A start given up part way (its caller hung up, the host shut down:
/// the future is dropped before the runner's hello) leaves no staging dir
/// behind.
#[tokio::test]
async fn a_start_given_up_part_way_leaves_no_staging_dir() {
    let dir = tempfile::tempdir().unwrap();
    let kernels = dir.path().join("kernels");
    let listed = || -> Vec<_> {
        std::fs::read_dir(&kernels)
            .map(|rd| rd.map(|e| e.unwrap().file_name()).collect())
            .unwrap_or_default()
    };
    // Given up as soon as its dir exists: the interpreter takes far longer
    // than the 1 ms poll to say hello.
    let mut start = Box::pin(cellhost::Kernel::spawn(options(&dir)));
    loop {
        tokio::select! {
            r = &mut start => panic!("started before its dir was seen (ok: {})", r.is_ok()),
            () = tokio::time::sleep(Duration::from_millis(1)) => {
                if !listed().is_empty() {
                    break;
                }
            }
        }
    }
    drop(start);
    assert!(listed().is_empty(), "staging dirs left: {:?}", listed());
}

#[tokio::test]
async fn shutdown_kills_the_kernel_and_its_children() {
    let k = kernel().await;
    let r = k
        .run("import subprocess\np = subprocess.Popen(['sleep', '1000'])\np.pid")
        .await;
    let child: u32 = r.value.unwrap().parse().unwrap();
    let pid = k.kernel.pid().unwrap();
    assert!(pid_alive(child));
    k.kernel.shutdown().await;
    assert!(!pid_alive(pid), "runner reaped");
    assert!(
        wait_gone(child, Duration::from_secs(2)),
        "child killed with the group"
    );
    // A shut-down kernel says so.
    assert!(k.kernel.execute(cellhost::Cell::new("1")).await.is_err());
}

#[tokio::test]
async fn each_kernel_runs_in_its_own_process_group() {
    let k = kernel().await;
    let r = k
        .run("import os\n(os.getpgid(0) == os.getpid(), os.getsid(0) == os.getpid())")
        .await;
    assert_eq!(r.value.as_deref(), Some("(True, True)"));
}

#[tokio::test]
async fn dropping_every_handle_tears_the_kernel_down() {
    let dir = tempfile::tempdir().unwrap();
    let kernel = cellhost::Kernel::spawn(options(&dir)).await.unwrap();
    let pid = kernel.pid().unwrap();
    drop(kernel);
    // The actor needs runtime turns to tear down: wait asynchronously.
    let end = std::time::Instant::now() + Duration::from_secs(3);
    while pid_alive(pid) && std::time::Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!pid_alive(pid));
}

#[tokio::test]
async fn a_killed_cell_leaves_no_orphans_behind() {
    let k = kernel().await;
    let pidfile = k.dir.path().join("child.pid");
    let code = format!(
        "import subprocess, signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\np = subprocess.Popen(['sleep', '1000'])\nopen({:?}, 'w').write(str(p.pid))\ntime.sleep(60)",
        pidfile.display().to_string()
    );
    let r = k
        .run_cell(cellhost::Cell::new(code).timeout(Duration::from_millis(300)))
        .await;
    assert_eq!(r.status, Status::Timeout);
    assert!(r.kernel.state_lost);
    let child: u32 = std::fs::read_to_string(&pidfile).unwrap().parse().unwrap();
    assert!(wait_gone(child, Duration::from_secs(2)));
}

#[tokio::test]
async fn the_interpreter_is_a_real_binary_not_a_shim() {
    let k = kernel().await;
    let r = k.run("import sys\nsys.executable").await;
    let exe = r.value.unwrap();
    let exe = exe.trim_matches('\'');
    let head = std::fs::read(exe).unwrap();
    assert_eq!(&head[..4], b"\x7fELF", "{exe}");
}

#[tokio::test]
async fn a_venv_interpreter_keeps_its_site_packages_importable() {
    let dir = tempfile::tempdir().unwrap();
    let base = cellhost::Interpreter::resolve(None).unwrap();
    let venv = dir.path().join("venv");
    let st = std::process::Command::new(base.path())
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .status()
        .unwrap();
    assert!(st.success(), "venv creation failed");
    let site = std::fs::read_dir(venv.join("lib"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path()
        .join("site-packages");
    std::fs::write(site.join("cellhost_probe_mod.py"), "ANSWER = 42\n").unwrap();
    let opts = options(&dir).python(venv.join("bin").join("python"));
    let k = kernel_with(opts, dir).await;
    let r = k.run("import sys, cellhost_probe_mod\n(cellhost_probe_mod.ANSWER, sys.prefix != sys.base_prefix)").await;
    assert_eq!(r.value.as_deref(), Some("(42, True)"), "{r:?}");
}

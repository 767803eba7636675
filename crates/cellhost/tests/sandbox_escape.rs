//! The strict sandbox, attacked from inside: every attempt must fail.
//! Real bubblewrap, real processes; the test venv's Python.
mod common;

use std::time::Duration;

use cellhost::{Cell, Status, StrictSandbox};
use common::*;

/// Run `code`, which must print `blocked` (each attempt caught).
async fn assert_blocked(k: &TestKernel, code: &str) {
    let r = k.run(code).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(
        r.stdout.lines().all(|l| l.starts_with("blocked")) && !r.stdout.is_empty(),
        "an escape attempt succeeded: {r:?}"
    );
}

/// A cell that tries `attempt` (Python statements) and prints `blocked`
/// when it raises, `ESCAPED` otherwise.
fn attempt(label: &str, attempt: &str) -> String {
    format!(
        "try:\n    {attempt}\n    print('ESCAPED {label}')\nexcept Exception as e:\n    print('blocked {label}:', type(e).__name__)\n"
    )
}

#[tokio::test]
async fn files_in_the_hosts_home_cannot_be_read() {
    let home = std::path::PathBuf::from(std::env::var_os("HOME").expect("HOME is set"));
    let secret = home.join(format!(".cellhost-escape-{}", std::process::id()));
    std::fs::write(&secret, "the operator's secret").unwrap();
    let k = strict_kernel().await;
    let code = attempt(
        "read",
        &format!("open({:?}).read()", secret.display().to_string()),
    ) + &attempt(
        "list",
        &format!(
            "assert {:?} in __import__('os').listdir({:?})",
            secret.file_name().unwrap().to_str().unwrap(),
            home.display().to_string()
        ),
    );
    let r = k.run(&code).await;
    std::fs::remove_file(&secret).unwrap();
    assert!(r.stdout.matches("blocked").count() == 2, "{r:?}");
}

#[tokio::test]
async fn the_data_dir_and_spill_files_cannot_be_read() {
    let k = strict_kernel().await;
    // The runtime dir holds staging dirs and spill files: the host's data.
    let data = k.dir.path().join("spill").join("secret.txt");
    std::fs::create_dir_all(data.parent().unwrap()).unwrap();
    std::fs::write(&data, "spilled output of another cell").unwrap();
    let code = attempt(
        "spill",
        &format!("open({:?}).read()", data.display().to_string()),
    ) + &attempt(
        "root",
        &format!(
            "__import__('os').listdir({:?})",
            k.dir.path().display().to_string()
        ),
    );
    assert_blocked(&k, &code).await;
}

#[tokio::test]
async fn writes_outside_the_workspace_fail_and_tmp_is_private() {
    let k = strict_kernel().await;
    let host_tmp_marker = format!("/tmp/cellhost-escape-{}", std::process::id());
    let mut code = String::new();
    for path in [
        "/usr/escape",
        "/etc/escape",
        "/escape",
        "/run/cellhost/kernel/escape",
    ] {
        code += &attempt(path, &format!("open({path:?}, 'w').write('x')"));
    }
    code += &attempt(
        "staging",
        &format!(
            "open({:?}, 'w').write('x')",
            k.staging_dirs()[0].join("escape").display().to_string()
        ),
    );
    assert_blocked(&k, &code).await;
    // The workspace and /tmp are writable, and /tmp is not the host's.
    let r = k
        .run(&format!(
            "open('/workspace/ok', 'w').write('1'); open({host_tmp_marker:?}, 'w').write('1')"
        ))
        .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(
        !std::path::Path::new(&host_tmp_marker).exists(),
        "the sandbox's /tmp is the host's"
    );
}

#[tokio::test]
async fn a_loopback_listener_of_the_host_cannot_be_reached() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let k = strict_kernel().await;
    let code = attempt(
        "tcp",
        &format!("__import__('socket').create_connection(('127.0.0.1', {port}), timeout=2)"),
    );
    assert_blocked(&k, &code).await;
    assert_eq!(
        listener.accept().unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock,
        "the listener got a connection from the sandbox"
    );
}

#[tokio::test]
async fn another_sessions_workspace_and_staging_dir_are_out_of_reach() {
    let a = strict_kernel().await;
    let b = strict_kernel().await;
    let r = b
        .run("open('/workspace/mine.txt', 'w').write('b only'); 1")
        .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    let b_ws: Vec<_> = std::fs::read_dir(b.dir.path().join("kernels"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            // `ws-<id>`, not its package dir `ws-<id>.pkgs`.
            let name = p.file_name().unwrap().to_str().unwrap();
            name.starts_with("ws-") && !name.ends_with(".pkgs")
        })
        .collect();
    assert_eq!(b_ws.len(), 1);
    let b_file = b_ws[0].join("mine.txt");
    assert!(b_file.exists());
    let b_staging = b
        .staging_dirs()
        .into_iter()
        .find(|p| p.file_name().unwrap().to_str().unwrap().starts_with("k-"))
        .unwrap();
    let code = attempt(
        "workspace",
        &format!("open({:?}).read()", b_file.display().to_string()),
    ) + &attempt(
        "staging",
        &format!(
            "__import__('os').listdir({:?})",
            b_staging.display().to_string()
        ),
    ) + &attempt(
        "runner",
        &format!(
            "open({:?}).read()",
            b_staging.join("runner.py").display().to_string()
        ),
    ) + &attempt(
        "own-ws",
        "assert 'mine.txt' in __import__('os').listdir('/workspace')",
    );
    assert_blocked(&a, &code).await;
}

#[tokio::test]
async fn host_processes_are_invisible_in_proc() {
    let k = strict_kernel().await;
    let host = std::process::id();
    let r = k
        .run("import os\nsorted(int(p) for p in os.listdir('/proc') if p.isdigit())")
        .await;
    let pids = r.value.unwrap();
    // Only the sandbox's init and the runner (and nothing of the host).
    assert_eq!(pids, "[1, 2]", "the sandbox sees other processes");
    let code = attempt("kill", &format!("__import__('os').kill({host}, 0)"));
    assert_blocked(&k, &code).await;
}

#[tokio::test]
async fn another_kernel_cannot_be_ptraced_or_its_memory_read() {
    let a = strict_kernel().await;
    let b = strict_kernel().await;
    b.run("secret = 'b-secret'").await;
    let victim = b.kernel.pid().unwrap();
    let code = attempt("mem", &format!("open('/proc/{victim}/mem', 'rb').read(1)"))
        + &attempt(
            "ptrace",
            &format!(
                "import ctypes; libc = ctypes.CDLL(None, use_errno=True); r = libc.ptrace(16, {victim}, None, None); assert r == 0, ctypes.get_errno()"
            ),
        )
        + &attempt("ptrace-ns-pid-2", "import ctypes; assert ctypes.CDLL(None).ptrace(16, 1, None, None) == 0");
    assert_blocked(&a, &code).await;
    assert_eq!(b.run("secret").await.value.as_deref(), Some("'b-secret'"));
}

#[tokio::test]
async fn kernels_run_as_an_unprivileged_uid_without_capabilities() {
    let k = strict_kernel().await;
    let r = k
        .run("import os\nst = open('/proc/self/status').read()\ncaps = [l.split()[1] for l in st.splitlines() if l.startswith(('CapEff', 'CapPrm', 'CapBnd'))]\n(os.getuid(), os.getgid(), os.getgroups(), caps)")
        .await;
    assert_eq!(
        r.value.as_deref(),
        Some("(65534, 65534, [], ['0000000000000000', '0000000000000000', '0000000000000000'])"),
        "{r:?}"
    );
    // The host sees the same: the runner's real uid is not root.
    let status =
        std::fs::read_to_string(format!("/proc/{}/status", k.kernel.pid().unwrap())).unwrap();
    let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert!(
        uid.split_whitespace().skip(1).all(|u| u == "65534"),
        "{uid}"
    );
}

/// Teardown kills every process of the sandbox, `setsid` grandchildren
/// included (they stay in the pid namespace). The host being SIGKILLed is
/// tested end to end in cellhost-cli/tests/run.rs.
#[tokio::test]
async fn shutdown_kills_every_process_of_the_sandbox_even_setsid_ones() {
    let k = strict_kernel().await;
    let r = k
        .run("import subprocess\np = subprocess.Popen(['sh', '-c', 'setsid sleep 1000 & sleep 1000'])\n1")
        .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    let runner = k.kernel.pid().unwrap();
    let bwrap = parent_of(parent_of(runner).unwrap()).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let all: Vec<u32> = std::iter::once(bwrap).chain(descendants(bwrap)).collect();
    assert!(all.len() >= 5, "{all:?}");
    k.kernel.shutdown().await;
    for p in all {
        assert!(
            wait_gone(p, Duration::from_secs(2)),
            "pid {p} survived shutdown"
        );
    }
}

#[tokio::test]
async fn an_interrupt_inside_the_sandbox_keeps_state() {
    let k = strict_kernel().await;
    k.run("x = 7").await;
    let r = k
        .run_cell(Cell::new("import time\ntime.sleep(30)").timeout(Duration::from_millis(300)))
        .await;
    assert_eq!(r.status, Status::Timeout, "{r:?}");
    assert!(!r.kernel.state_lost, "{r:?}");
    assert_eq!(k.run("x").await.value.as_deref(), Some("7"));
}

#[tokio::test]
async fn numpy_and_pandas_work_in_the_sandbox_and_state_persists() {
    let k = strict_kernel().await;
    let r = k
        .run("import numpy as np, pandas as pd\ndf = pd.DataFrame({'a': np.arange(5)})\ndf.to_csv('/workspace/df.csv')\nint(df.a.sum())")
        .await;
    assert_eq!(r.value.as_deref(), Some("10"), "{r:?}");
    let r = k
        .run("df2 = pd.read_csv('df.csv', index_col=0)\n(int((df2.a * 2).sum()), float(np.mean(df.a)))")
        .await;
    assert_eq!(r.value.as_deref(), Some("(20, 2.0)"), "{r:?}");
}

#[tokio::test]
async fn pid_means_the_python_runner_and_rss_is_its_own() {
    let k = strict_kernel().await;
    let pid = k.kernel.pid().unwrap();
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    assert!(
        exe.to_str().unwrap().contains("python"),
        "{}",
        exe.display()
    );
    let rss = cellhost::kernel::rss_bytes(pid).unwrap();
    assert!(rss > 4 << 20 && rss < 200 << 20, "rss {rss}");
}

#[tokio::test]
async fn a_callers_workspace_is_created_kept_and_a_default_one_removed() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("sessions").join("s1");
    let opts = strict_options(&dir, StrictSandbox::default().workspace(&ws));
    let k = kernel_with(opts, dir).await;
    k.run("open('kept.txt', 'w').write('1')").await;
    k.kernel.shutdown().await;
    assert!(
        ws.join("kept.txt").exists(),
        "a caller's workspace was deleted"
    );

    let k = strict_kernel().await;
    k.run("open('gone.txt', 'w').write('1')").await;
    assert!(k.staging_dirs().iter().any(|p| p.join("gone.txt").exists()));
    k.kernel.shutdown().await;
    assert!(k.staging_dirs().is_empty(), "{:?}", k.staging_dirs());
}

/// The tool RPC will be a Unix socket in the kernel's staging dir: the
/// kernel reaches its own (through the read-only bind at
/// /run/cellhost/kernel), and no other kernel reaches it.
#[tokio::test]
async fn a_socket_in_the_staging_dir_is_reachable_by_its_kernel_only() {
    let a = strict_kernel().await;
    let b = strict_kernel().await;
    let b_staging = b
        .staging_dirs()
        .into_iter()
        .find(|p| p.file_name().unwrap().to_str().unwrap().starts_with("k-"))
        .unwrap();
    let sock = b_staging.join("rpc.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    // Owner-only, owned by the kernel's uid (what the RPC will do).
    std::os::unix::fs::chown(&sock, Some(65534), Some(65534)).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o600)).unwrap();
    let r = b
        .run("import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect('/run/cellhost/kernel/rpc.sock')\ns.sendall(b'hi')\n'connected'")
        .await;
    assert_eq!(r.value.as_deref(), Some("'connected'"), "{r:?}");
    let (mut conn, _) = listener.accept().unwrap();
    let mut got = [0u8; 2];
    std::io::Read::read_exact(&mut conn, &mut got).unwrap();
    assert_eq!(&got, b"hi");
    let code = attempt(
        "other-rpc",
        &format!(
            "import socket; s = socket.socket(socket.AF_UNIX); s.connect({:?})",
            sock.display().to_string()
        ),
    );
    assert_blocked(&a, &code).await;
}

#[tokio::test]
async fn an_fd_the_host_inherited_never_reaches_the_kernel() {
    // A host started from a shell that left `/` open without CLOEXEC
    // (`exec 77</`): the kernel must not get it, or it could fchdir out.
    let root = std::fs::File::open("/").unwrap();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&root);
    // SAFETY: dup2 onto an fd number this test owns; no CLOEXEC on the copy.
    assert_eq!(unsafe { libc::dup2(fd, 77) }, 77);
    let k = strict_kernel().await;
    let r = k
        .run("import os\ntry:\n    os.fstat(77)\n    leaked = True\nexcept OSError:\n    leaked = False\nleaked")
        .await;
    assert_eq!(r.value.as_deref(), Some("False"), "{r:?}");
    // Every fd left is stdio or a pipe of ours (the runner keeps copies
    // of fds 1 and 2); none names a file or directory of the host.
    let fds = k
        .run("links = []\nfor f in os.listdir('/proc/self/fd'):\n    try:\n        links.append(os.readlink('/proc/self/fd/' + f))\n    except OSError:\n        pass  # the listing's own fd\nsorted(set(l.split(':')[0] for l in links))")
        .await;
    assert_eq!(
        fds.value.as_deref(),
        Some("['/dev/null', 'pipe']"),
        "{fds:?}"
    );
    // SAFETY: closing the fd this test opened.
    unsafe { libc::close(77) };
}

#[tokio::test]
async fn an_interpreter_linked_from_a_private_dir_shows_the_link_not_the_dir() {
    require_bwrap();
    // `~/bin/python -> /usr/bin/python3` next to a secret: the sandbox
    // needs the link, never the directory around it.
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    std::fs::write(bin.join(".env"), "API_KEY=sk-secret\n").unwrap();
    let python = bin.join("python");
    std::os::unix::fs::symlink("/usr/bin/python3", &python).unwrap();
    let opts = options(&dir)
        .python(&python)
        .sandbox(cellhost::Sandbox::Strict(StrictSandbox::default()));
    let k = kernel_with(opts, dir).await;
    let r = k.run("import sys; sys.version_info[0]").await;
    assert_eq!(r.value.as_deref(), Some("3"), "the kernel runs: {r:?}");
    let bin = bin.to_str().unwrap();
    assert_blocked(
        &k,
        &(attempt("read the secret", &format!("open('{bin}/.env').read()"))
            + &attempt(
                "list the dir",
                &format!("import os; assert os.listdir('{bin}') != ['python']"),
            )),
    )
    .await;
}

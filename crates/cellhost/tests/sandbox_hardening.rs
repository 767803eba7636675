//! The strict sandbox's hardening, attacked from inside a strict kernel
//! (never unsandboxed): the minimal `/etc`, the seccomp filter, one uid per
//! session, and memory that rlimit mode cannot count (memfd, /dev/shm).
//! Real bubblewrap, real processes, the test venv's Python.
mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cellhost::registry::{KernelManager, ManagerOptions};
use cellhost::{Cell, CellResult, ResourceLimits, Status, StrictSandbox};
use common::*;

const MIB: u64 = 1024 * 1024;

async fn ok(k: &TestKernel, code: &str) -> CellResult {
    let r = k.run(code).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    r
}

#[tokio::test]
async fn a_config_file_in_the_hosts_etc_cannot_be_read() {
    // What `serve --config /etc/cellhost/cellhost.toml` leaves at 0644.
    let conf = PathBuf::from(format!(
        "/etc/cellhost-hardening-{}.toml",
        std::process::id()
    ));
    std::fs::write(&conf, "[server]\ntoken = \"the-daemon-token\"\n").unwrap();
    let k = strict_kernel().await;
    let code = format!(
        "import os\ntry:\n    print('READ', open({c:?}).read())\nexcept OSError as e:\n    print('blocked', type(e).__name__)\nprint(sorted(os.listdir('/etc')))",
        c = conf.display().to_string()
    );
    let r = k.run(&code).await;
    std::fs::remove_file(&conf).unwrap();
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(
        r.stdout.starts_with("blocked") && !r.stdout.contains("the-daemon-token"),
        "{r:?}"
    );
    assert!(
        !r.stdout.contains("cellhost-hardening"),
        "the host's /etc is listed: {r:?}"
    );
}

#[tokio::test]
async fn the_built_etc_names_the_kernel_and_keeps_python_and_tls_working() {
    let k = strict_kernel().await;
    let r = ok(
        &k,
        "import os, pwd, grp, socket\nme = pwd.getpwuid(os.getuid())\nprint(me.pw_name, me.pw_dir, grp.getgrgid(os.getgid()).gr_name)\nprint(socket.gethostbyname('localhost'))\nprint(sorted(p.pw_name for p in pwd.getpwall()))",
    )
    .await;
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines[1], "127.0.0.1", "{r:?}");
    // Only the accounts the sandbox needs, none of the host's.
    let host_users = std::fs::read_to_string("/etc/passwd").unwrap();
    for user in host_users.lines().filter_map(|l| l.split(':').next()) {
        if !["root", "nobody"].contains(&user) {
            assert!(
                !lines[2].contains(&format!("'{user}'")),
                "host account {user} is visible: {r:?}"
            );
        }
    }
    if Path::new("/etc/ssl/certs/ca-certificates.crt").exists() {
        let r = ok(
            &k,
            "import ssl\nssl.create_default_context().cert_store_stats()['x509_ca'] > 0",
        )
        .await;
        assert_eq!(
            r.value.as_deref(),
            Some("True"),
            "no CA certificates: {r:?}"
        );
    }
    // Debian's sitecustomize and the time zone link come along.
    let r = ok(
        &k,
        "import os, time\n(os.path.realpath('/etc/localtime'), time.tzname[0] != '')",
    )
    .await;
    assert!(r.value.unwrap().contains("/usr/share/zoneinfo"));
}

/// Mount points under `dir` in the test's own mount namespace.
fn mounts_under(dir: &Path) -> Vec<String> {
    let dir = dir.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.split(' ').nth(4).is_some_and(|m| m.starts_with(&dir)))
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn mountinfo_shows_no_host_path_no_kernel_id_and_no_session_and_nothing_stays_mounted() {
    let dir = tempfile::tempdir().unwrap();
    // A pooled kernel, handed over to the session, then a fresh one.
    let m = KernelManager::start(strict_manager_options(&dir).warm_pool(1)).await;
    let pooled = || m.pooled() == 1;
    assert!(common::registry::eventually(Duration::from_secs(20), pooled).await);
    let read = "print(open('/proc/self/mountinfo').read())";
    let mut seen = vec![run_in(&m, "mount-sess-q7", read).await.stdout];
    assert_eq!(m.stats().pool_hits, 1);
    seen.push(run_in(&m, "other-sess-z3", read).await.stdout);
    let ids: Vec<String> = std::fs::read_dir(dir.path().join("kernels"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("k-"))
        .collect();
    assert!(!ids.is_empty());
    let runtime = dir.path().to_string_lossy().into_owned();
    for info in &seen {
        let mut needles = vec![
            ("the runtime and data dirs", runtime.clone()),
            ("a session", "mount-sess-q7".into()),
            ("a session", "other-sess-z3".into()),
            ("the staging root", "kernels".into()),
            ("the /etc template", "sandbox-etc".into()),
        ];
        needles.extend(ids.iter().map(|id| ("a kernel id", id.clone())));
        for (what, needle) in needles {
            assert!(!info.contains(&needle), "mountinfo shows {what}:\n{info}");
        }
        for line in info.lines().filter(|l| !l.is_empty()) {
            let f: Vec<&str> = line.split(' ').collect();
            let (root, at) = (f[3], f[4]);
            assert!(
                root != "/etc" && !root.starts_with("/etc/"),
                "the host's /etc, or a part of it, is mounted: {line}"
            );
            if at == "/etc" || at == "/run/cellhost/kernel" {
                assert!(root == "/" && line.contains(" - tmpfs cellhost "), "{line}");
            }
        }
    }
    m.shutdown().await;
    assert_eq!(mounts_under(dir.path()), Vec::<String>::new());
}

#[tokio::test]
async fn a_strict_kernel_leaves_no_tmpfs_mounted_once_it_is_gone() {
    let k = strict_kernel().await;
    let staging: Vec<PathBuf> = k
        .staging_dirs()
        .into_iter()
        .filter(|d| d.file_name().unwrap().to_string_lossy().starts_with("k-"))
        .collect();
    assert_eq!(staging.len(), 1, "{staging:?}");
    let mounted = mounts_under(k.dir.path());
    assert_eq!(
        mounted.len(),
        2,
        "the staging dir and the /etc template: {mounted:?}"
    );
    ok(&k, "1").await;
    k.kernel.shutdown().await;
    assert_eq!(mounts_under(k.dir.path()), Vec::<String>::new());
    assert!(!staging[0].exists());
}

#[tokio::test]
async fn recovery_detaches_the_staging_tmpfs_a_dead_host_left() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("kernels");
    std::fs::create_dir_all(&root).unwrap();
    let stale = root.join("k-0123456789ab");
    std::fs::create_dir(&stale).unwrap();
    let status = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "cellhost"])
        .arg(&stale)
        .status()
        .unwrap();
    assert!(status.success());
    // A host that is gone: pid 1's start time never matches 1.
    std::fs::write(stale.join(".host"), "1 1").unwrap();
    let m = KernelManager::start(strict_manager_options(&dir)).await;
    let left = mounts_under(dir.path());
    if !left.is_empty() {
        std::process::Command::new("umount")
            .arg(&stale)
            .status()
            .unwrap();
    }
    assert_eq!(left, Vec::<String>::new());
    assert!(!stale.exists());
    m.shutdown().await;
}

#[tokio::test]
async fn nested_user_namespaces_cannot_be_made() {
    let k = strict_kernel().await;
    let r = ok(
        &k,
        "import subprocess\np = subprocess.run(['unshare', '-Urn', 'true'], capture_output=True, text=True)\nprint(p.returncode, p.stderr.strip())",
    )
    .await;
    assert!(!r.stdout.starts_with("0 "), "unshare -Urn succeeded: {r:?}");
    assert!(
        r.stdout.contains("Operation not permitted"),
        "not refused by the filter: {r:?}"
    );
    // Threads, fork and exec still work (clone3 falls back to clone).
    let r = ok(
        &k,
        "import threading, subprocess, os\nout = []\nt = threading.Thread(target=lambda: out.append(1)); t.start(); t.join()\npid = os.fork()\nif pid == 0:\n    os._exit(7)\n(out, os.waitpid(pid, 0)[1] >> 8, subprocess.run(['true']).returncode)",
    )
    .await;
    assert_eq!(r.value.as_deref(), Some("([1], 7, 0)"), "{r:?}");
}

/// Probes, each in a child process (a `ptrace(TRACEME)` that works must
/// not leave the runner traced): `name=errno` or `name=ok`.
const PROBES: &str = r#"
import ctypes, errno, os, platform, subprocess, sys
probe = r'''
import ctypes, errno, platform
libc = ctypes.CDLL(None, use_errno=True)
x86 = platform.machine() == 'x86_64'
NR = dict(
    unshare=272 if x86 else 97, keyctl=250 if x86 else 219, add_key=248 if x86 else 217,
    userfaultfd=323 if x86 else 282, ptrace=101 if x86 else 117,
    personality=135 if x86 else 92, io_uring_setup=425, mount=165 if x86 else 40,
    bpf=321 if x86 else 280, fsopen=430, memfd_create=319 if x86 else 279,
)
buf = ctypes.create_string_buffer(256)
def call(name, *args):
    ctypes.set_errno(0)
    args = [a if isinstance(a, ctypes.Array) else ctypes.c_long(a) for a in args]
    r = libc.syscall(NR[name], *args)
    print(name + '=' + ('ok' if r >= 0 else errno.errorcode[ctypes.get_errno()]))
call('unshare', 0x10000000)
call('keyctl', 0, -3, 1)
call('add_key', ctypes.create_string_buffer(b'user'), ctypes.create_string_buffer(b'k'), buf, 1, -3)
call('userfaultfd', 1)
call('personality', 0x0040000)
call('io_uring_setup', 1, buf)
call('fsopen', ctypes.create_string_buffer(b'tmpfs'), 0)
call('ptrace', 0, 0, 0, 0)
if x86:
    NR['x32_unshare'] = 0x40000000 | 272
    call('x32_unshare', 0x10000000)
'''
p = subprocess.run([sys.executable, '-c', probe], capture_output=True, text=True)
print(p.stdout + p.stderr)
"#;

#[tokio::test]
async fn the_kernel_runs_under_a_seccomp_filter_that_refuses_kernel_surface() {
    let k = strict_kernel().await;
    let r = ok(
        &k,
        "print([l for l in open('/proc/self/status') if l.startswith('Seccomp:')][0].strip())",
    )
    .await;
    assert_eq!(r.stdout.trim(), "Seccomp:\t2", "{r:?}");
    let r = ok(&k, PROBES).await;
    for name in [
        "unshare",
        "keyctl",
        "add_key",
        "userfaultfd",
        "personality",
        "io_uring_setup",
        "fsopen",
        "ptrace",
    ] {
        assert!(
            r.stdout.contains(&format!("{name}=EPERM")),
            "{name} is not refused with EPERM: {}",
            r.stdout
        );
    }
    if std::env::consts::ARCH == "x86_64" {
        assert!(
            r.stdout.contains("x32_unshare=EPERM"),
            "the x32 syscall numbers pass: {}",
            r.stdout
        );
    }
}

/// Every dir named `ws` under `root` (the sessions' workspaces).
fn workspaces(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() && !p.is_symlink() {
                if p.file_name().is_some_and(|n| n == "ws") {
                    out.push(p.clone());
                } else {
                    todo.push(p);
                }
            }
        }
    }
    out
}

fn strict_manager_options(dir: &tempfile::TempDir) -> ManagerOptions {
    ManagerOptions::new(dir.path().join("data"))
        .kernel(strict_options(dir, StrictSandbox::default()))
        .warm_pool(0)
        .idle_timeout(None)
}

async fn run_in(m: &KernelManager, owner: &str, code: &str) -> CellResult {
    let r = m.execute(owner, Cell::new(code)).await.expect("execute");
    assert_eq!(r.status, Status::Success, "{owner}: {r:?}");
    r
}

const UID_RANGE: std::ops::RangeInclusive<u32> = 200_000..=265_535;

#[tokio::test]
async fn two_sessions_get_their_own_uids_so_one_exhausting_inotify_leaves_the_other_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let m = KernelManager::start(strict_manager_options(&dir)).await;
    let mine = "import os\nopen('/workspace/me', 'w').write(str(os.getuid()))\nos.getuid()";
    let a: u32 = run_in(&m, "a", mine).await.value.unwrap().parse().unwrap();
    let b: u32 = run_in(&m, "b", mine).await.value.unwrap().parse().unwrap();
    assert_ne!(a, b, "both sessions run as uid {a}");
    assert!(UID_RANGE.contains(&a) && UID_RANGE.contains(&b), "{a} {b}");
    // Each workspace, and what its kernel wrote, belongs to its uid.
    let root = dir.path().join("data/workspaces");
    for ws in workspaces(&root) {
        let me: u32 = std::fs::read_to_string(ws.join("me"))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(
            std::fs::metadata(&ws).unwrap().uid(),
            me,
            "{}",
            ws.display()
        );
        assert_eq!(std::fs::metadata(ws.join("me")).unwrap().uid(), me);
    }
    let hog = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nheld = []\nwhile len(held) < 4096:\n    fd = libc.inotify_init()\n    if fd < 0:\n        break\n    held.append(fd)\nlen(held)";
    let taken: usize = run_in(&m, "a", hog).await.value.unwrap().parse().unwrap();
    assert!(taken < 4096, "no per-uid inotify limit to exhaust: {taken}");
    let r = run_in(
        &m,
        "b",
        "import ctypes\nctypes.CDLL(None).inotify_init() >= 0",
    )
    .await;
    assert_eq!(
        r.value.as_deref(),
        Some("True"),
        "session a's inotify instances starved session b"
    );
    m.shutdown().await;
    // The uid is recorded on disk: a restarted manager gives it back.
    let m = KernelManager::start(strict_manager_options(&dir)).await;
    let again: u32 = run_in(&m, "a", "import os\nos.getuid()")
        .await
        .value
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(again, a, "session a's uid changed across a restart");
    m.shutdown().await;
}

#[tokio::test]
async fn a_pooled_kernel_hands_its_own_uid_to_the_session_it_serves() {
    let dir = tempfile::tempdir().unwrap();
    let m = KernelManager::start(strict_manager_options(&dir).warm_pool(1)).await;
    let pooled = || m.pooled() == 1;
    assert!(common::registry::eventually(Duration::from_secs(20), pooled).await);
    let r = run_in(
        &m,
        "new",
        "import os\nopen('/workspace/f', 'w').write('x')\nos.getuid()",
    )
    .await;
    assert_eq!(m.stats().pool_hits, 1);
    let uid: u32 = r.value.unwrap().parse().unwrap();
    assert!(UID_RANGE.contains(&uid), "{uid}");
    let ws: Vec<PathBuf> = workspaces(&dir.path().join("data/workspaces"));
    let owned: Vec<&PathBuf> = ws.iter().filter(|w| w.join("f").exists()).collect();
    assert_eq!(owned.len(), 1, "{ws:?}");
    assert_eq!(std::fs::metadata(owned[0]).unwrap().uid(), uid);
    // The next pooled kernel has a uid of its own.
    assert!(common::registry::eventually(Duration::from_secs(20), pooled).await);
    let other: u32 = run_in(&m, "other", "import os\nos.getuid()")
        .await
        .value
        .unwrap()
        .parse()
        .unwrap();
    assert_ne!(other, uid);
    m.shutdown().await;
}

async fn rlimit_kernel(memory_mib: u64) -> TestKernel {
    let dir = tempfile::tempdir().unwrap();
    let limits = ResourceLimits::default()
        .memory_bytes(Some(memory_mib * MIB))
        .cgroups(false);
    let opts = strict_options(&dir, StrictSandbox::default()).limits(limits);
    kernel_with(opts, dir).await
}

#[tokio::test]
async fn in_rlimit_mode_memfd_cannot_hold_more_than_the_memory_limit() {
    let k = rlimit_kernel(256).await;
    let r = k
        .run("import os\nheld = 0\ntry:\n    fd = os.memfd_create('x')\n    for _ in range(64):\n        os.write(fd, b'\\0' * (16 << 20))\n        held += 16\nexcept OSError as e:\n    print('stopped', type(e).__name__)\nheld")
        .await;
    let held: u64 = r.value.clone().unwrap_or_default().parse().unwrap_or(0);
    assert!(
        held <= 256,
        "memfd held {held} MiB past the 256 MiB limit: {r:?}"
    );
}

#[tokio::test]
async fn in_rlimit_mode_dev_shm_and_tmp_are_bounded_by_the_memory_limit() {
    let k = rlimit_kernel(256).await;
    for dir in ["/dev/shm", "/tmp"] {
        let code = format!(
            "held = 0\ntry:\n    with open('{dir}/fill', 'wb') as f:\n        for _ in range(64):\n            f.write(b'\\0' * (16 << 20)); f.flush()\n            held += 16\nexcept OSError as e:\n    print('stopped', e.errno)\nimport os\nos.unlink('{dir}/fill')\nheld"
        );
        let r = k.run(&code).await;
        let held: u64 = r.value.clone().unwrap_or_default().parse().unwrap_or(0);
        assert!(held <= 256, "{dir} held {held} MiB past the limit: {r:?}");
    }
}

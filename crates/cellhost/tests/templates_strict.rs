//! Strict kernels forked from a warm template (docs/templates.md, "Strict
//! kernels"): the template runs as root with five capabilities and runs
//! no cell; each fork enters namespaces of its own and drops to its
//! session's uid, as a spawned strict kernel does. Real processes, read
//! from /proc. (The sandbox escape, hardening and limits suites run
//! against forked kernels too: `CELLHOST_TEST_KERNELS=forked` in
//! scripts/test.)

mod common;

use std::time::Duration;

use cellhost::registry::{KernelManager, ManagerOptions};
use cellhost::{Cell, CellResult, StrictSandbox};
use common::parent_of;
use common::registry::{eventually, manager_options};

fn options(dir: &tempfile::TempDir) -> ManagerOptions {
    manager_options(dir).kernel(common::strict_options(dir, StrictSandbox::default()))
}

async fn value(m: &KernelManager, owner: &str, code: &str) -> String {
    let r = m.execute(owner, Cell::new(code)).await.expect("execute");
    assert!(r.is_success(), "{owner}: {r:?}");
    r.value.expect("a value")
}

/// The runner's host pid (what results report).
async fn runner_of(m: &KernelManager, owner: &str) -> u32 {
    let r: CellResult = m.execute(owner, Cell::new("1")).await.unwrap();
    r.kernel.pid.expect("a pid")
}

/// A `/proc/<pid>/status` field's first word.
fn status(pid: u32, field: &str) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in {pid}'s status"))
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned()
}

fn namespace(pid: u32, ns: &str) -> String {
    std::fs::read_link(format!("/proc/{pid}/ns/{ns}"))
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

fn caps(names: &[&str]) -> u64 {
    let bit = |n: &str| match n {
        "CAP_SETGID" => 6,
        "CAP_SETUID" => 7,
        "CAP_SETPCAP" => 8,
        "CAP_NET_ADMIN" => 12,
        "CAP_SYS_ADMIN" => 21,
        other => panic!("{other}"),
    };
    names.iter().map(|n| 1u64 << bit(n)).sum()
}

#[tokio::test]
async fn new_strict_kernels_are_forks_of_a_root_template_each_sandboxed_on_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let m = KernelManager::start(options(&dir)).await;
    let (a, b) = (runner_of(&m, "a").await, runner_of(&m, "b").await);
    let stats = m.stats();
    assert_eq!((stats.templates, stats.template_forks), (1, 2), "{stats:?}");
    // The runner, its pid namespace's init, the fork the host watches,
    // the template (as bwrap started it, no pid namespace of its own).
    let up = |pid: u32| parent_of(pid).unwrap();
    let (init_a, leader_a) = (up(a), up(up(a)));
    let template = up(leader_a);
    assert_eq!(up(up(up(b))), template, "b is a fork of the same template");
    assert_eq!(
        std::fs::read_to_string(format!("/proc/{template}/comm"))
            .unwrap()
            .trim(),
        "cellhost-tmpl"
    );
    assert_eq!(
        std::fs::read_to_string(format!("/proc/{}/comm", up(template)))
            .unwrap()
            .trim(),
        "bwrap"
    );
    assert_eq!(up(up(template)), std::process::id());
    // The template: root with its forks' five capabilities (effective and
    // bounding: nothing it executes gets more), no_new_privs, no filter.
    assert_eq!(status(template, "Uid"), "0");
    let want = caps(&[
        "CAP_SYS_ADMIN",
        "CAP_NET_ADMIN",
        "CAP_SETUID",
        "CAP_SETGID",
        "CAP_SETPCAP",
    ]);
    assert_eq!(
        u64::from_str_radix(&status(template, "CapEff"), 16).unwrap(),
        want
    );
    assert_eq!(
        u64::from_str_radix(&status(template, "CapBnd"), 16).unwrap(),
        want
    );
    assert_eq!(status(template, "NoNewPrivs"), "1");
    assert_eq!(status(template, "Seccomp"), "0");
    // Each runner: its session's uid (a and b differ), nothing else.
    let uid_a: u32 = status(a, "Uid").parse().unwrap();
    let uid_b: u32 = status(b, "Uid").parse().unwrap();
    assert!(uid_a >= 200_000 && uid_b >= 200_000 && uid_a != uid_b);
    for (pid, what) in [
        (a, "runner"),
        (init_a, "its namespace's init"),
        (leader_a, "its leader"),
    ] {
        for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
            assert_eq!(status(pid, set), "0000000000000000", "{what} {set}");
        }
        assert_eq!(status(pid, "NoNewPrivs"), "1", "{what}");
    }
    assert_eq!(status(a, "Seccomp"), "2", "the runner is filtered");
    assert_eq!(status(init_a, "Uid"), "65534", "the init runs as nobody");
    assert_eq!(
        status(leader_a, "Uid"),
        "65534",
        "the leader runs as nobody"
    );
    // Namespaces of its own: none shared with b or the template.
    for ns in ["mnt", "pid", "net", "ipc", "uts", "cgroup"] {
        let (na, nb) = (namespace(a, ns), namespace(b, ns));
        assert_ne!(na, nb, "{ns}: a and b");
        assert_ne!(na, namespace(template, ns), "{ns}: a and the template");
    }
    // As a spawned strict kernel sees itself.
    assert_eq!(
        value(
            &m,
            "a",
            "import os, socket; k = os.listdir('/run/cellhost/kernel'); (os.getpid(), os.getcwd(), \
             socket.gethostname(), 'runner.py' in k, [n for n in k if n.startswith('rehome')])"
        )
        .await,
        "(2, '/workspace', 'cellhost', True, [])",
        "its own staging dir, not the template's"
    );
    // A private /tmp, /dev/shm and workspace each.
    value(
        &m,
        "a",
        "[open(p, 'w').write('a') for p in ('/tmp/a', '/dev/shm/a', '/workspace/a')]",
    )
    .await;
    assert_eq!(
        value(
            &m,
            "b",
            "import os; [os.path.exists(p) for p in ('/tmp/a', '/dev/shm/a', '/workspace/a')]"
        )
        .await,
        "[False, False, False]"
    );
    // Nothing of the template shows: no host pid, no other session's files.
    assert_eq!(
        value(
            &m,
            "b",
            "sorted(int(p) for p in __import__('os').listdir('/proc') if p.isdigit())"
        )
        .await,
        "[1, 2]"
    );
    m.shutdown().await;
}

#[tokio::test]
async fn a_forked_strict_kernels_exit_status_reaches_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let m = KernelManager::start(options(&dir)).await;
    let first = runner_of(&m, "a").await;
    let up = |pid: u32| parent_of(pid).unwrap();
    let template = up(up(up(first)));
    assert!(common::registry::is_template(template), "a fork");
    let r = m
        .execute("a", Cell::new("import os; os._exit(3)"))
        .await
        .unwrap();
    assert!(r.kernel.state_lost, "{r:?}");
    let note = r.kernel.note.clone().unwrap_or_default();
    // Its parent is the template, so only its init's status pipe can say.
    assert!(note.contains("exited with status 3"), "{note}");
    let again = runner_of(&m, "a").await;
    assert_ne!(again, first);
    m.shutdown().await;
}

#[tokio::test]
async fn a_killed_strict_template_costs_no_kernel_and_shutdown_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let m = KernelManager::start(options(&dir)).await;
    value(&m, "a", "x = 1; x").await;
    let a = runner_of(&m, "a").await;
    let up = |pid: u32| parent_of(pid).unwrap();
    let template = up(up(up(a)));
    // Every process of it (fork, init, runner), and the spare's.
    let mut all: Vec<u32> = vec![a, up(a), up(up(a))];
    assert!(
        eventually(Duration::from_secs(5), || common::descendants(template)
            .len()
            >= 6)
        .await,
        "the spare was forked ahead"
    );
    all.extend(common::descendants(template));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(template as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    assert!(eventually(Duration::from_secs(5), || !common::pid_alive(template)).await);
    assert_eq!(value(&m, "a", "x").await, "1", "a's kernel lives on");
    // New sessions still get kernels (the spare, then plain spawns).
    assert_eq!(value(&m, "b", "1 + 1").await, "2");
    assert_eq!(value(&m, "c", "2 + 2").await, "4");
    all.push(runner_of(&m, "b").await);
    all.push(runner_of(&m, "c").await);
    m.shutdown().await;
    assert!(
        eventually(Duration::from_secs(5), || all
            .iter()
            .all(|p| !common::pid_alive(*p)))
        .await,
        "left running: {:?}",
        all.iter()
            .filter(|p| common::pid_alive(**p))
            .collect::<Vec<_>>()
    );
}

/// `[sandbox] network = "host"`: the forks keep the host's network (no
/// namespace of their own) and the template holds no CAP_NET_ADMIN (it
/// would be over the host's network).
#[tokio::test]
async fn with_the_hosts_network_a_fork_reaches_the_host_and_its_template_has_no_net_admin() {
    let dir = tempfile::tempdir().unwrap();
    let o = manager_options(&dir).kernel(common::strict_options(
        &dir,
        StrictSandbox::default().network(true),
    ));
    let m = KernelManager::start(o).await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        use std::io::Write;
        let (mut s, _) = listener.accept().unwrap();
        s.write_all(b"hi").unwrap();
    });
    let got = value(
        &m,
        "a",
        &format!(
            "import socket; s = socket.create_connection(('127.0.0.1', {port}), timeout=10); s.recv(2)"
        ),
    )
    .await;
    assert_eq!(got, "b'hi'");
    server.join().unwrap();
    let a = runner_of(&m, "a").await;
    let up = |pid: u32| parent_of(pid).unwrap();
    let template = up(up(up(a)));
    assert!(common::registry::is_template(template), "a fork");
    let me = std::process::id();
    assert_eq!(
        namespace(a, "net"),
        namespace(me, "net"),
        "the host's network"
    );
    assert_ne!(namespace(a, "mnt"), namespace(me, "mnt"));
    let eff = u64::from_str_radix(&status(template, "CapEff"), 16).unwrap();
    assert_eq!(
        eff,
        caps(&["CAP_SYS_ADMIN", "CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP"]),
        "no CAP_NET_ADMIN over the host's network"
    );
    m.shutdown().await;
}

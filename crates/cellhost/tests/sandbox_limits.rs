//! Resource limits: each breach fails the cell with an error that names
//! the limit, and `state_lost` says whether the kernel died of it.
mod common;

use std::time::Duration;

use cellhost::{Cell, ResourceLimits, Status, StrictSandbox};
use common::*;

const MIB: u64 = 1024 * 1024;

async fn strict_with(limits: ResourceLimits) -> TestKernel {
    let dir = tempfile::tempdir().unwrap();
    let opts = strict_options(&dir, StrictSandbox::default()).limits(limits);
    kernel_with(opts, dir).await
}

#[tokio::test]
async fn a_memory_bomb_is_killed_and_named_and_the_next_cell_gets_a_fresh_kernel() {
    let k = strict_with(ResourceLimits::default().memory_bytes(Some(256 * MIB))).await;
    k.run("x = 1").await;
    let r = k
        .run("hog = []\nwhile True:\n    hog.append(bytearray(16 * 2**20))")
        .await;
    assert_eq!(r.status, Status::Error, "{r:?}");
    let err = r.error.clone().unwrap();
    assert!(
        err.contains("memory limit 256 MiB exceeded"),
        "the error does not name the limit: {err}"
    );
    assert!(r.kernel.state_lost, "{r:?}");
    let r = k.run("'x' in globals()").await;
    assert_eq!(r.value.as_deref(), Some("False"));
    assert!(!r.kernel.reused && r.kernel.note.unwrap().contains("memory limit"));
}

#[tokio::test]
async fn a_fork_bomb_is_contained_and_named() {
    let k = strict_with(ResourceLimits::default().max_processes(Some(32))).await;
    k.run("x = 1").await;
    let code = "import os, time\nkids = 0\nwhile True:\n    pid = os.fork()\n    if pid == 0:\n        time.sleep(60)\n        os._exit(0)\n    kids += 1";
    let r = k
        .run_cell(Cell::new(code).timeout(Duration::from_secs(20)))
        .await;
    assert_eq!(r.status, Status::Error, "{r:?}");
    let err = r.error.clone().unwrap();
    assert!(err.contains("process limit 32 exceeded"), "{err}");
    assert!(
        !r.kernel.state_lost,
        "the kernel survives a refused fork: {r:?}"
    );
    let kids: u32 = k.run("kids").await.value.unwrap().parse().unwrap();
    assert!((1..32).contains(&kids), "{kids} children forked");
    // The host can still start processes, and teardown takes them all.
    assert!(std::process::Command::new("true")
        .status()
        .unwrap()
        .success());
    let runner = k.kernel.pid().unwrap();
    let bwrap = parent_of(parent_of(runner).unwrap()).unwrap();
    let all = descendants(bwrap);
    assert!(all.len() as u32 >= kids, "{all:?}");
    k.kernel.shutdown().await;
    for p in all {
        assert!(wait_gone(p, Duration::from_secs(2)), "pid {p} survived");
    }
}

#[tokio::test]
async fn writing_past_the_file_size_limit_fails_the_cell_and_keeps_state() {
    let k = strict_with(ResourceLimits::default().max_file_size_bytes(Some(10 * MIB))).await;
    k.run("x = 5").await;
    let r = k
        .run("with open('/workspace/big', 'wb') as f:\n    f.write(b'0' * (20 * 2**20))")
        .await;
    assert_eq!(r.status, Status::Error, "{r:?}");
    let err = r.error.clone().unwrap();
    assert!(err.contains("file size limit 10 MiB exceeded"), "{err}");
    assert!(!r.kernel.state_lost);
    assert_eq!(k.run("x").await.value.as_deref(), Some("5"));
}

#[tokio::test]
async fn a_cell_over_its_cpu_seconds_is_killed_and_named() {
    let k = strict_with(ResourceLimits::default().cpu_seconds_per_cell(Some(1))).await;
    let r = k
        .run_cell(Cell::new("while True:\n    pass").timeout(Duration::from_secs(30)))
        .await;
    assert_eq!(r.status, Status::Error, "{r:?}");
    let err = r.error.clone().unwrap();
    assert!(
        err.contains("killed: CPU limit 1 s per cell exceeded"),
        "{err}"
    );
    assert!(r.kernel.state_lost);
}

#[tokio::test]
async fn the_cpu_limit_is_per_cell_not_per_kernel() {
    let k = strict_with(ResourceLimits::default().cpu_seconds_per_cell(Some(1))).await;
    // Each cell burns ~0.6 s of CPU: three of them exceed 1 s in total.
    let burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6:\n    pass\n'ok'";
    for _ in 0..3 {
        let r = k.run(burn).await;
        assert_eq!(r.value.as_deref(), Some("'ok'"), "{r:?}");
    }
}

#[tokio::test]
async fn too_many_open_files_fail_the_cell_with_the_limit_named() {
    let k = strict_with(ResourceLimits::default().max_open_files(Some(64))).await;
    let r = k
        .run("fs = []\nwhile True:\n    fs.append(open('/dev/null'))")
        .await;
    assert_eq!(r.status, Status::Error, "{r:?}");
    assert!(
        r.error
            .as_deref()
            .unwrap()
            .contains("open files limit 64 exceeded"),
        "{r:?}"
    );
    assert!(!r.kernel.state_lost);
}

#[tokio::test]
async fn limits_apply_without_a_sandbox_too() {
    let dir = tempfile::tempdir().unwrap();
    let opts = options(&dir).limits(ResourceLimits::default().max_file_size_bytes(Some(MIB)));
    let k = kernel_with(opts, dir).await;
    let path = k.dir.path().join("big");
    let r = k
        .run(&format!(
            "open({:?}, 'wb').write(b'0' * (2 * 2**20))",
            path.display().to_string()
        ))
        .await;
    assert!(
        r.error
            .as_deref()
            .unwrap_or("")
            .contains("file size limit 1 MiB exceeded"),
        "{r:?}"
    );
}

/// Without a sandbox a `setsid` grandchild leaves the process group; the
/// kernel's cgroup still holds it, and teardown kills it. (This host has
/// a writable cgroup hierarchy; scripts/test runs as root.)
#[tokio::test]
async fn a_grandchild_that_left_the_group_is_killed_at_teardown() {
    let k = kernel().await;
    let pidfile = k.dir.path().join("escapee.pid");
    let r = k
        .run(&format!(
            "import subprocess\nsubprocess.run(['sh', '-c', 'setsid sleep 1000 & echo $! > {}'])",
            pidfile.display()
        ))
        .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    std::thread::sleep(Duration::from_millis(100));
    let escapee: u32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(pid_alive(escapee));
    k.kernel.shutdown().await;
    assert!(
        wait_gone(escapee, Duration::from_secs(2)),
        "a setsid grandchild outlived its kernel"
    );
}

/// Without cgroups, memory is `RLIMIT_AS`: the allocation fails inside
/// Python, the kernel survives, and the error names the limit.
#[tokio::test]
async fn without_cgroups_a_memory_bomb_is_a_named_memory_error_and_state_is_kept() {
    let limits = ResourceLimits::default()
        .memory_bytes(Some(512 * MIB))
        .cgroups(false);
    let k = strict_with(limits).await;
    k.run("x = 3").await;
    let r = k.run("hog = bytearray(2 * 2**30)").await;
    assert_eq!(r.status, Status::Error, "{r:?}");
    let err = r.error.clone().unwrap();
    assert!(
        err.starts_with("MemoryError") && err.contains("memory limit 512 MiB exceeded"),
        "{err}"
    );
    assert!(!r.kernel.state_lost, "{r:?}");
    assert_eq!(k.run("x").await.value.as_deref(), Some("3"));
}

/// Every process of a sandboxed kernel is in the kernel's own cgroups
/// (they are joined in the background while the kernel starts, and the
/// sandbox waits for that before it runs anything).
#[tokio::test]
async fn every_process_of_a_sandboxed_kernel_is_in_its_cgroups() {
    let k = strict_with(ResourceLimits::default()).await;
    k.run("import subprocess\np = subprocess.Popen(['sleep', '100'])")
        .await;
    let runner = k.kernel.pid().unwrap();
    let bwrap = parent_of(parent_of(runner).unwrap()).unwrap();
    let all: Vec<u32> = std::iter::once(bwrap).chain(descendants(bwrap)).collect();
    assert!(all.len() >= 4, "{all:?}");
    for p in all {
        let cg = std::fs::read_to_string(format!("/proc/{p}/cgroup")).unwrap();
        for controller in ["memory", "pids"] {
            // A v1 hierarchy with the controller, else the v2 line.
            let line = cg
                .lines()
                .find(|l| {
                    l.split(':')
                        .nth(1)
                        .is_some_and(|c| c.split(',').any(|c| c == controller))
                })
                .or_else(|| cg.lines().find(|l| l.starts_with("0::")))
                .unwrap_or_else(|| panic!("no {controller} line: {cg}"));
            assert!(
                line.contains("/cellhost-k-"),
                "pid {p} is not in the kernel's {controller} cgroup: {line}"
            );
        }
    }
}

/// A runtime shut down with a live kernel runs no async teardown: the
/// backstop still kills the kernel and removes its cgroups.
#[test]
fn a_kernel_dropped_with_its_runtime_leaves_no_cgroup_behind() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let opts = strict_options(&dir, StrictSandbox::default());
    let (kernel, id, pid) = rt.block_on(async {
        let k = cellhost::Kernel::spawn(opts).await.unwrap();
        let r = k.execute(Cell::new("1")).await.unwrap();
        (k, r.kernel.id, r.kernel.pid.unwrap())
    });
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    assert!(cgroups.contains(&format!("cellhost-{id}")), "{cgroups}");
    drop(rt);
    drop(kernel);
    assert!(wait_gone(pid, Duration::from_secs(2)));
    let leftovers: Vec<String> = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .iter()
        .flat_map(|root| {
            let out = std::process::Command::new("find")
                .args([root, "-maxdepth", "6", "-type", "d", "-name"])
                .arg(format!("cellhost-{id}"))
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(leftovers.is_empty(), "cgroups left behind: {leftovers:?}");
}

/// With rlimits only, EAGAIN is the process limit only where a fork was
/// refused; a non-blocking read that would block is not a breach.
#[tokio::test]
async fn eagain_is_blamed_on_the_process_limit_only_for_a_fork() {
    let limits = ResourceLimits::default()
        .max_processes(Some(32))
        .cgroups(false);
    let k = strict_with(limits).await;
    let r = k
        .run("import os\nr, w = os.pipe()\nos.set_blocking(r, False)\nos.read(r, 1)")
        .await;
    let err = r.error.clone().unwrap();
    assert!(err.starts_with("BlockingIOError"), "{err}");
    assert!(
        !err.contains("process limit"),
        "a read is not a fork: {err}"
    );
    let r = k
        .run_cell(
            Cell::new("import time\nwhile True:\n    if os.fork() == 0:\n        time.sleep(30)\n        os._exit(0)")
                .timeout(Duration::from_secs(20)),
        )
        .await;
    let err = r.error.clone().unwrap();
    assert!(err.contains("process limit 32 exceeded"), "{err}");
    k.kernel.shutdown().await;
}

/// The private /tmp is memory (a tmpfs) that RLIMIT_AS does not count:
/// it is capped at the memory limit, so it is no way around it.
#[tokio::test]
async fn the_private_tmp_cannot_outgrow_the_memory_limit() {
    let limits = ResourceLimits::default()
        .memory_bytes(Some(128 * MIB))
        .cgroups(false);
    let k = strict_with(limits).await;
    let r = k
        .run("chunk = b'x' * 2**20\nwith open('/tmp/big', 'wb') as f:\n    for _ in range(300):\n        f.write(chunk)")
        .await;
    assert_eq!(r.status, Status::Error, "300 MiB fit in /tmp: {r:?}");
    assert!(
        r.error.unwrap().contains("No space left"),
        "{:?}",
        r.traceback
    );
    k.kernel.shutdown().await;
}

/// A child OOM-killed in one cell is that cell's story: a later SIGKILL
/// of the kernel is not blamed on the memory limit.
#[tokio::test]
async fn an_old_oom_kill_is_not_blamed_for_a_later_death() {
    let k = strict_with(ResourceLimits::default().memory_bytes(Some(128 * MIB))).await;
    let r = k
        .run("import subprocess, sys\nsubprocess.run([sys.executable, '-c', 'b = bytearray(400 * 2**20)']).returncode")
        .await;
    assert_eq!(
        r.value.as_deref(),
        Some("-9"),
        "the child was OOM-killed: {r:?}"
    );
    tokio::time::sleep(Duration::from_millis(100)).await; // the kernel sits idle
    let r = k
        .run("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
        .await;
    assert!(r.kernel.state_lost, "{r:?}");
    let err = r.error.unwrap_or_default();
    assert!(
        !err.contains("memory limit"),
        "blamed on an old OOM kill: {err}"
    );
    k.kernel.shutdown().await;
}

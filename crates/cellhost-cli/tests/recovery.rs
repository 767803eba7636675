//! Crash recovery end to end: a host is SIGKILLed mid-cell with its
//! kernel's death-pipe watcher gone too, and a new manager on the same data
//! dir reaps the orphan.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cellhost::registry::{KernelManager, ManagerOptions};
use cellhost::KernelOptions;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

fn alive(pid: u32) -> bool {
    cellhost::kernel::pid_alive(pid)
}

fn wait_gone(pid: u32, within: Duration) -> bool {
    let end = Instant::now() + within;
    while alive(pid) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(10));
    }
    !alive(pid)
}

fn only_record(live: &Path) -> serde_json::Value {
    let files: Vec<_> = std::fs::read_dir(live)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    assert_eq!(files.len(), 1, "one live kernel, one record: {files:?}");
    serde_json::from_slice(&std::fs::read(&files[0]).unwrap()).unwrap()
}

/// Kills the orphan if the test fails before recovery does.
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.0 as i32), Signal::SIGKILL);
    }
}

#[test]
fn a_new_manager_reaps_the_orphan_of_a_host_sigkilled_mid_cell() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let runtime = dir.path().join("run");
    let script = dir.path().join("crash.py");
    // The second cell holds the GIL in C code, so the runner's own
    // death-watch thread cannot run: only the `sh` watcher or recovery can
    // end it, and the test kills the watcher.
    std::fs::File::create(&script)
        .unwrap()
        .write_all(b"# %%\nimport os\nos.getpid()\n# %%\nsum(range(10**14))\n")
        .unwrap();
    let mut host = Command::new(env!("CARGO_BIN_EXE_cellhost"))
        .args(["run", "--json", "--data-dir"])
        .arg(&data)
        .arg(&script)
        .env("XDG_RUNTIME_DIR", &runtime)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(host.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let first: serde_json::Value = serde_json::from_str(&line).unwrap();
    let runner: u32 = first["value"].as_str().unwrap().parse().unwrap();
    let _cleanup = KillOnDrop(runner);
    std::thread::sleep(Duration::from_millis(300)); // the busy cell is running

    let record = only_record(&data.join("live"));
    assert_eq!(record["runner"]["pid"], runner);
    let staging = std::path::PathBuf::from(record["staging"].as_str().unwrap());
    assert!(staging.starts_with(&runtime) && staging.is_dir());
    let watcher = record["watcher"]["pid"].as_u64().unwrap() as i32;
    kill(Pid::from_raw(watcher), Signal::SIGKILL).unwrap();
    assert!(wait_gone(watcher as u32, Duration::from_secs(5)));
    host.kill().unwrap();
    host.wait().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        alive(runner),
        "the setup made an orphan: the runner outlived its host"
    );

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let report = rt.block_on(async {
        let opts = ManagerOptions::new(&data)
            .kernel(KernelOptions::default().runtime_dir(runtime.join("cellhost")))
            .warm_pool(0);
        let manager = KernelManager::start(opts).await;
        let report = manager.recovery().clone();
        manager.shutdown().await;
        report
    });
    assert_eq!(report.orphans_killed, 1, "{report:?}");
    assert!(
        wait_gone(runner, Duration::from_secs(5)),
        "the orphan was reaped"
    );
    assert!(!staging.exists(), "its staging dir was removed");
    assert_eq!(std::fs::read_dir(data.join("live")).unwrap().count(), 0);
}

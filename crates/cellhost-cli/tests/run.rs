//! `cellhost run` end to end, as a user runs it.

use cellhost::sys::parent_pid;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The binary, with its data dir (live-kernel records) kept out of the
/// user's home.
fn cellhost() -> Command {
    static DATA: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    let data = DATA.get_or_init(|| tempfile::tempdir().unwrap());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cellhost"));
    cmd.env("XDG_DATA_HOME", data.path());
    cmd
}

fn script(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn run(args: &[&str]) -> Output {
    cellhost().args(args).stdin(Stdio::null()).output().unwrap()
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn pid_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !s.rsplit_once(')')
                .unwrap()
                .1
                .trim_start()
                .starts_with(['Z', 'X'])
        })
        .unwrap_or(false)
}

#[test]
fn cells_share_one_kernel_and_print_like_a_notebook() {
    let dir = tempfile::tempdir().unwrap();
    let p = script(
        dir.path(),
        "a.py",
        "# %% setup\nx = 20\nprint('set')\n\n# %% [markdown]\n# Some prose\n\n# %%\nx * 2 + 2\n",
    );
    let o = run(&["run", p.to_str().unwrap()]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    assert!(
        out.contains("── cell 1 (line 2) · setup ──\nset\n"),
        "{out}"
    );
    assert!(out.contains("── cell 2 (line 9) ──\nOut[2]: 42\n"), "{out}");
    assert!(!out.contains("Some prose"));
}

#[test]
fn json_mode_prints_one_result_per_line() {
    let dir = tempfile::tempdir().unwrap();
    let p = script(
        dir.path(),
        "a.py",
        "# %%\nx = 1\n# %%\nx + 1\n# %%\nprint('hi')\n",
    );
    let o = run(&["run", "--json", p.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0));
    let lines: Vec<serde_json::Value> = String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[1]["value"], "2");
    assert_eq!(lines[2]["stdout"], "hi\n");
    assert_eq!(lines[2]["kernel"]["execution_count"], 3);
    assert_eq!(lines[2]["kernel"]["reused"], true);
}

#[test]
fn a_failing_cell_stops_the_run_with_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let p = script(dir.path(), "a.py", "# %%\n1/0\n# %%\nprint('never')\n");
    let o = run(&["run", p.to_str().unwrap()]);
    let (out, _) = text(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(out.contains("ZeroDivisionError: division by zero"), "{out}");
    assert!(out.contains("Traceback"), "{out}");
    assert!(!out.contains("never"));
}

#[test]
fn keep_going_runs_every_cell_but_still_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let p = script(dir.path(), "a.py", "# %%\n1/0\n# %%\nprint('still')\n");
    let o = run(&["run", "--keep-going", p.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).0.contains("still"));
}

#[test]
fn a_script_without_markers_is_one_cell_and_stdin_works() {
    let mut child = cellhost()
        .args(["run", "--json", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"a = 2\nb = 3\na * b\n")
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["value"], "6");
}

#[test]
fn the_timeout_flag_interrupts_and_reports() {
    let dir = tempfile::tempdir().unwrap();
    let p = script(dir.path(), "a.py", "import time\ntime.sleep(30)\n");
    let t = Instant::now();
    let o = run(&["run", "--json", "--timeout", "0.3", p.to_str().unwrap()]);
    assert!(t.elapsed() < Duration::from_secs(10));
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["status"], "timeout");
    assert_eq!(v["kernel"]["state_lost"], false);
}

#[test]
fn bad_inputs_get_one_clear_line_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let empty = script(
        dir.path(),
        "empty.py",
        "\n  \n# %% [markdown]\n# prose only\n",
    );
    let binary = dir.path().join("bin.py");
    std::fs::write(&binary, b"x = '\xff\xfe'\n").unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![
                "run".into(),
                dir.path().join("missing.py").display().to_string(),
            ],
            "no such file",
        ),
        (
            vec!["run".into(), empty.display().to_string()],
            "no code to run",
        ),
        (
            vec!["run".into(), binary.display().to_string()],
            "not UTF-8",
        ),
        (
            vec!["run".into(), dir.path().display().to_string()],
            "is a directory",
        ),
        (
            vec![
                "run".into(),
                "--timeout".into(),
                "-1".into(),
                empty.display().to_string(),
            ],
            "positive number",
        ),
        (
            vec![
                "run".into(),
                "--python".into(),
                "/nonexistent/python".into(),
                empty.display().to_string(),
            ],
            "",
        ),
        (vec!["frobnicate".into()], "unrecognized subcommand"),
    ];
    for (args, expect) in cases {
        let o = cellhost()
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(expect), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn a_missing_interpreter_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = script(dir.path(), "a.py", "1\n");
    let o = run(&[
        "run",
        "--python",
        "/nonexistent/python3",
        p.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).1.contains("--python"), "{}", text(&o).1);
}

#[test]
fn ctrl_c_interrupts_the_running_cell_and_stops_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("started");
    let p = script(
        dir.path(),
        "a.py",
        &format!(
            "# %%\nprint('started', flush=True)\nopen({:?}, 'w').close()\nimport time\ntime.sleep(30)\n# %%\nprint('never')\n",
            marker.display().to_string()
        ),
    );
    let child = cellhost()
        .args(["run", "--json", p.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while !marker.exists() && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(marker.exists(), "the cell started");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::SIGINT,
    )
    .unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    let out = String::from_utf8(o.stdout).unwrap();
    let v: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(v["status"], "interrupted");
    assert_eq!(v["stdout"], "started\n");
    assert_eq!(out.lines().count(), 1, "the run stopped: {out}");
}

/// The kernel dies with its host, by any means, even mid-cell.
#[test]
fn the_kernel_dies_within_a_second_when_its_host_is_sigkilled_mid_cell() {
    kernel_dies_with_its_host("while True:\n    pass\n");
}

/// A cell busy in C code holds the GIL, so no Python thread can run: the
/// kernel must still die with its host.
#[test]
fn the_kernel_dies_with_its_host_even_while_c_code_holds_the_gil() {
    kernel_dies_with_its_host("sum(range(10**13))\n");
}

fn kernel_dies_with_its_host(busy_cell: &str) {
    let dir = tempfile::tempdir().unwrap();
    let p = script(
        dir.path(),
        "a.py",
        &format!("# %%\nimport os, subprocess\nchild = subprocess.Popen(['sleep', '1000'])\nprint(os.getpid(), child.pid)\n# %%\n{busy_cell}"),
    );
    let mut host = cellhost()
        .args(["run", "--json", p.to_str().unwrap()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (_, v) = first_result(&mut host);
    let pids: Vec<u32> = v["stdout"]
        .as_str()
        .unwrap()
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    assert!(pids.iter().all(|&p| pid_alive(p)));
    sigkill_host_and_expect_gone(&mut host, &pids);
    remove_cgroups(v["kernel"]["id"].as_str().unwrap());
}

/// With the strict sandbox the host's child is bwrap and the runner its
/// grandchild: every process of the sandbox still dies with the host.
#[test]
fn a_sandboxed_kernel_dies_with_its_host_when_the_host_is_sigkilled() {
    assert!(
        Path::new("/usr/bin/bwrap").exists(),
        "bubblewrap is missing; run scripts/test, which installs it"
    );
    let dir = tempfile::tempdir().unwrap();
    let p = script(
        dir.path(),
        "a.py",
        "# %%\nimport subprocess\nchild = subprocess.Popen(['sleep', '1000'])\n# %%\nsum(range(10**13))\n",
    );
    let mut host = cellhost()
        .args(["run", "--sandbox", "strict", "--json", p.to_str().unwrap()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (line, v) = first_result(&mut host);
    assert_eq!(v["status"], "success", "{line}");
    let runner = v["kernel"]["pid"].as_u64().unwrap() as u32;
    let bwrap = parent_pid(parent_pid(runner).unwrap()).unwrap();
    let mut pids = vec![bwrap];
    let mut i = 0;
    while i < pids.len() {
        let p = pids[i];
        let kids =
            std::fs::read_to_string(format!("/proc/{p}/task/{p}/children")).unwrap_or_default();
        pids.extend(kids.split_whitespace().map(|k| k.parse::<u32>().unwrap()));
        i += 1;
    }
    assert!(pids.len() >= 4, "bwrap, init, runner, sleep: {pids:?}");
    std::thread::sleep(Duration::from_millis(200));
    sigkill_host_and_expect_gone(&mut host, &pids);
    remove_cgroups(v["kernel"]["id"].as_str().unwrap());
}

/// The first cell result a `run --json` host prints, as text and JSON.
fn first_result(host: &mut std::process::Child) -> (String, serde_json::Value) {
    let mut line = String::new();
    BufReader::new(host.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let v = serde_json::from_str(&line).unwrap();
    (line, v)
}

/// SIGKILL the host (no cleanup code runs in it), then every one of
/// `pids` must be gone within a second.
fn sigkill_host_and_expect_gone(host: &mut std::process::Child, pids: &[u32]) {
    host.kill().unwrap();
    host.wait().unwrap();
    let killed = Instant::now();
    while pids.iter().any(|&p| pid_alive(p)) && killed.elapsed() < Duration::from_secs(1) {
        std::thread::sleep(Duration::from_millis(10));
    }
    for &p in pids {
        assert!(!pid_alive(p), "pid {p} outlived its host by a second");
    }
}

#[test]
fn a_bad_sandbox_profile_or_config_file_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = script(dir.path(), "a.py", "1\n");
    let o = run(&["run", "--sandbox", "loose", p.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).1.contains("use `strict` or `none`"),
        "{:?}",
        text(&o)
    );
    let cfg = script(dir.path(), "cellhost.toml", "[limits]\nmemory = 5\n");
    let o = run(&[
        "run",
        "--config",
        cfg.to_str().unwrap(),
        p.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).1.contains("memory"), "{:?}", text(&o));
}

#[test]
fn the_config_file_sets_the_sandbox_and_limits() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = script(
        dir.path(),
        "cellhost.toml",
        "[sandbox]\nprofile = \"strict\"\n[limits]\nmax_file_size_mib = 1\n",
    );
    let p = script(
        dir.path(),
        "a.py",
        "import os\nprint(os.getuid(), os.getcwd())\nopen('big', 'wb').write(b'0' * 2**21)\n",
    );
    let o = run(&[
        "run",
        "--json",
        "--config",
        cfg.to_str().unwrap(),
        p.to_str().unwrap(),
    ]);
    let v: serde_json::Value = serde_json::from_str(text(&o).0.trim()).unwrap();
    // Its own uid from [sandbox] uid_range (the host is root here).
    let out = v["stdout"].as_str().unwrap_or_default();
    let uid: u32 = out.split(' ').next().unwrap().parse().unwrap();
    assert!(
        out.ends_with(" /workspace\n") && (200_000..=265_535).contains(&uid),
        "{v}"
    );
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("file size limit 1 MiB exceeded"),
        "{v}"
    );
}

/// A SIGKILLed host cannot remove its kernels' (empty) cgroup dirs: the
/// test does, so runs leave nothing behind (see docs/known-limits.md).
fn remove_cgroups(kernel_id: &str) {
    let out = Command::new("find")
        .args(["/sys/fs/cgroup", "-maxdepth", "6", "-type", "d", "-name"])
        .arg(format!("cellhost-{kernel_id}"))
        .output()
        .unwrap();
    for dir in String::from_utf8_lossy(&out.stdout).lines() {
        let _ = std::fs::remove_dir(dir);
    }
}

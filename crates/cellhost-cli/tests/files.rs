//! `cellhost cp|ls|rm` against a real strict daemon: files in and out
//! byte-exact, path attacks a cell plants refused, files surviving a
//! daemon restart and gone with the session.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

mod common;
use common::daemon::Daemon;

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn sha(path: &Path) -> String {
    let o = Command::new("sha256sum").arg(path).output().unwrap();
    String::from_utf8_lossy(&o.stdout)[..64].to_owned()
}

fn ok(o: &Output) -> String {
    let (out, err) = text(o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    out
}

fn vm(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

#[test]
fn files_go_in_and_out_of_a_strict_session_and_survive_a_restart() {
    let data = tempfile::tempdir().unwrap();
    let local = tempfile::tempdir().unwrap();
    let csv = local.path().join("sales.csv");
    std::fs::write(&csv, "region,amount\nnorth,10\nsouth,32\n").unwrap();
    let d = Daemon::start(data.path(), &[], &[]);
    let out = ok(&d.cli(&["cp", csv.to_str().unwrap(), "s1:data/sales.csv"]));
    assert!(out.contains("s1:data/sales.csv"), "{out}");
    let out = ok(&d.cli(&[
        "exec",
        "-s",
        "s1",
        "import csv\nrows = list(csv.DictReader(open('/workspace/data/sales.csv')))\n\
         open('/workspace/total.bin','wb').write(bytes(range(256)) * 4)\n\
         sum(int(r['amount']) for r in rows)",
    ]));
    assert_eq!(out, "Out[1]: 42\n");
    let back = local.path().join("back");
    std::fs::create_dir(&back).unwrap();
    ok(&d.cli(&["cp", "s1:total.bin", back.to_str().unwrap()]));
    let got = std::fs::read(back.join("total.bin")).unwrap();
    assert_eq!(got, (0..=255u8).cycle().take(1024).collect::<Vec<_>>());
    let out = ok(&d.cli(&["ls", "s1", "-r"]));
    assert!(
        out.contains("data/sales.csv") && out.contains("total.bin"),
        "{out}"
    );
    ok(&d.cli(&["rm", "s1:total.bin"]));
    let o = d.cli(&["cp", "s1:total.bin", back.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{:?}", text(&o));
    assert!(text(&o).1.contains("does not exist"), "{:?}", text(&o));
    // A restarted daemon serves the same files to a new kernel.
    assert_eq!(d.stop(), Some(0));
    let d = Daemon::start(data.path(), &[], &[]);
    let out = ok(&d.cli(&[
        "exec",
        "-s",
        "s1",
        "print(open('data/sales.csv').read().count('\\n'))",
    ]));
    assert!(out.starts_with("3\n"), "{out}");
    // Gone with the session.
    ok(&d.cli(&["reset", "s1"]));
    let out = ok(&d.cli(&["ls", "s1"]));
    assert_eq!(out, "", "no files left");
}

#[test]
fn links_and_fifos_a_strict_cell_plants_are_refused_over_http() {
    let data = tempfile::tempdir().unwrap();
    let local = tempfile::tempdir().unwrap();
    let d = Daemon::start(data.path(), &[], &[]);
    ok(&d.cli(&[
        "exec",
        "-s",
        "evil",
        "import os\nos.symlink('/etc/shadow', 'leak')\nos.symlink('/', 'root')\n\
         os.symlink('/etc', 'etc')\nos.mkfifo('fifo')\nprint('planted')",
    ]));
    let dst = local.path().to_str().unwrap();
    for src in [
        "evil:leak",
        "evil:root/etc/passwd",
        "evil:etc/passwd",
        "evil:fifo",
        "evil:../../../etc/passwd",
    ] {
        let started = Instant::now();
        let o = d.cli(&["cp", src, dst]);
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(2), "{src}: {out}{err}");
        assert!(
            err.contains("symlink") || err.contains("not a regular file") || err.contains("`..`"),
            "{src}: {err}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never hangs on a FIFO"
        );
    }
    assert_eq!(
        std::fs::read_dir(local.path()).unwrap().count(),
        0,
        "nothing came out"
    );
    let evil = local.path().join("evil.txt");
    std::fs::write(&evil, "x").unwrap();
    for dst in [
        "evil:root/tmp/planted-by-upload",
        "evil:etc/planted-by-upload",
    ] {
        let o = d.cli(&["cp", evil.to_str().unwrap(), dst]);
        assert_eq!(o.status.code(), Some(2), "{dst}: {:?}", text(&o));
    }
    assert!(!Path::new("/tmp/planted-by-upload").exists());
    assert!(!Path::new("/etc/planted-by-upload").exists());
    ok(&d.cli(&["rm", "-r", "evil:root"]));
    assert!(Path::new("/etc/passwd").exists(), "the link went, not /");
}

#[test]
fn a_one_gib_file_streams_through_the_daemon_in_bounded_memory() {
    let data = tempfile::tempdir().unwrap();
    let local = tempfile::tempdir().unwrap();
    let big = local.path().join("big.bin");
    let o = Command::new("dd")
        .args(["if=/dev/urandom", "bs=1M", "count=1024", "status=none"])
        .arg(format!("of={}", big.display()))
        .output()
        .unwrap();
    assert!(o.status.success());
    let d = Daemon::start(data.path(), &["--sandbox", "none"], &[]);
    ok(&d.cli(&["exec", "-s", "g", "1"]));
    let pid = d.child.id();
    let before = vm(pid, "VmRSS:");
    ok(&d.cli(&["cp", big.to_str().unwrap(), "g:big.bin"]));
    let back = local.path().join("back.bin");
    ok(&d.cli(&["cp", "g:big.bin", back.to_str().unwrap()]));
    let peak = vm(pid, "VmHWM:");
    assert_eq!(sha(&big), sha(&back), "byte-exact");
    assert!(
        peak.saturating_sub(before) < 64 * 1024,
        "daemon RSS grew {} KiB (from {before} KiB to a peak of {peak} KiB)",
        peak - before
    );
}

#[test]
fn a_sigkilled_daemon_leaves_no_mount_and_the_next_finds_the_files() {
    let data = tempfile::tempdir().unwrap();
    let mut d = Daemon::start(data.path(), &[], &[]);
    // The workspace is a filesystem of the quota's size (4096 MiB).
    let out = ok(&d.cli(&[
        "exec",
        "-s",
        "s1",
        "import os\nv = os.statvfs('/workspace')\nprint(v.f_blocks * v.f_frsize <= 4300 << 20)\n\
         n = open('/workspace/kept.txt', 'w').write('kept')",
    ]));
    assert_eq!(out, "True\n");
    d.child.kill().unwrap(); // SIGKILL: no clean-up at all
    d.child.wait().unwrap();
    // Its volumes were mounted in its own mount namespace, which went
    // with it (and its kernels): nothing stays mounted or attached.
    let left = common::daemon::leftovers(data.path());
    assert!(left.is_empty(), "the killed daemon left {left:?}");
    std::mem::forget(d); // already dead
    let d = Daemon::start(data.path(), &[], &[]);
    let out = ok(&d.cli(&[
        "exec",
        "-s",
        "s1",
        "print(open('/workspace/kept.txt').read())",
    ]));
    assert!(out.starts_with("kept\n"), "{out}");
    // Stopped cleanly, the daemon leaves no mount and no loop device
    // (checked by `Daemon`'s drop).
    assert_eq!(d.stop(), Some(0));
}

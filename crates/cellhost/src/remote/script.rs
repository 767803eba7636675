//! The remote side's commands: what each exec runs, as text.
//!
//! Every script prints a status word on its first line so the host can
//! tell the script's verdict from a transport failure (no word at all).
//! Paths and pids come from the remote side itself (mkdtemp, the runner's
//! own pid) and are quoted anyway; no script ever carries a secret.

use std::time::Duration;

use super::transport::shell_quote;

/// Ship and spawn in one exec: a Python bootstrap (in argv; no secrets)
/// reads a JSON bundle from stdin (files base64-encoded, the env file),
/// makes the 0700 kernel dir under the remote temp dir with owner-only
/// files, then starts the runner detached (new session, SIGHUP ignored,
/// stdio on a log file) and waits for its `ready` file. Prints
/// `SHIPPED DIR` then `SPAWNED PID`, or `SHIPFAIL why` / `SPAWNFAIL why`.
const BOOT: &str = r#"
import sys, os, json, base64, tempfile, subprocess, time, shutil, signal
a = json.loads(sys.stdin.buffer.read())
d = None
try:
    os.umask(0o077)
    d = tempfile.mkdtemp(prefix="cellhost-k.", dir=a["tmp"] or None)
    os.chmod(d, 0o700)
    for name, data in sorted(a["files"].items()):
        fd = os.open(os.path.join(d, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        v = memoryview(base64.b64decode(data))
        while v:
            v = v[os.write(fd, v):]
        os.close(fd)
except Exception as e:
    if d:
        shutil.rmtree(d, ignore_errors=True)
    print("SHIPFAIL %s: %s" % (type(e).__name__, e), flush=True)
    sys.exit(0)
print("SHIPPED " + d, flush=True)
try:
    log = os.open(os.path.join(d, "runner.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    p = subprocess.Popen([sys.executable, os.path.join(d, "remote.py"), "serve", d] + a["args"],
        stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    os.close(log)
    deadline = time.time() + a["spawn_timeout"]
    while not os.path.exists(os.path.join(d, "ready")):
        if p.poll() is not None:
            with open(os.path.join(d, "runner.log"), "rb") as f:
                tail = f.read()[-300:].decode("utf-8", "replace").strip().splitlines()
            raise RuntimeError("the runner exited with status %s%s" % (p.returncode, (": " + tail[-1]) if tail else ""))
        if time.time() > deadline:
            os.killpg(p.pid, 9)
            raise RuntimeError("the runner did not start within %ss" % a["spawn_timeout"])
        time.sleep(0.002)
    print("SPAWNED %d" % p.pid, flush=True)
except Exception as e:
    print("SPAWNFAIL %s" % (e,), flush=True)
"#;

/// `alive PID`: `kill -0`, and on Linux not a zombie (a detached runner
/// whose new parent has not reaped it yet still answers `kill -0`).
/// Builtins only.
const ALIVE: &str = r#"alive() { kill -0 $1 2>/dev/null || return 1; [ -r /proc/$1/stat ] || return 0; read -r _ _ st _ < /proc/$1/stat; [ "$st" != Z ]; }
"#;

/// Room for the `{"result": …}` / `{"error": …}` around a tool's
/// payload in a reply.
pub(super) const REPLY_ENVELOPE: u64 = 4096;

/// `now`: milliseconds of a monotonic clock into `ms`, so the timeout
/// counts real time however slow each `sleep` is. `/proc/uptime` through
/// the `read` builtin (centiseconds; leading zeros stripped so the shell
/// does not read octal), else `date +%s`.
const NOW: &str = r#"now() { if [ -r /proc/uptime ] && read -r up _ < /proc/uptime; then c=${up%.*}${up#*.}; c=${c#"${c%%[!0]*}"}; ms=$(( ${c:-0} * 10 )); else ms=$(( $(date +%s) * 1000 )); fi; }
"#;

/// The ship-and-spawn command.
pub(super) fn boot(python: &str) -> String {
    format!("exec {} -c {}", shell_quote(python), shell_quote(BOOT))
}

/// How one waiting exec starts: a new cell, or the answer to the
/// cell's tool request `respond` (then the cell waits on).
#[derive(Debug, Clone, Copy)]
pub(super) struct Wait {
    pub dir_seq: u64,
    pub pid: u32,
    /// Time left in the current phase (before SIGINT, or of the grace
    /// once it was sent); `None`: no timeout.
    pub left: Option<Duration>,
    /// SIGINT was sent already (the phase is the grace).
    pub interrupted: bool,
    pub grace: Duration,
    /// The cell has tools: also watch for tool requests.
    pub tools: bool,
    pub respond: Option<u64>,
    /// Bytes of a tool request or reply the remote side passes on (one
    /// more is read, so the host can tell an over-long one).
    pub max_tool_payload: u64,
}

/// One cell, one exec: write the request atomically, wake the runner,
/// then wait on the remote side (builtins in a short spin, then sleeps
/// growing to 20 ms: no round trips) until the result file appears, the
/// runner dies, the timeout passes (SIGINT, then after `grace` kill the
/// process group), or the cell asks for a tool. First line: `RESULT STOP`
/// (then the blob), `TOOL K STOP LEFT_MS SIZE` (then at most
/// `max_tool_payload + 1` bytes of the request), `DEAD` (the
/// runner was gone: the cell never ran), `GONE` (no kernel dir), `DIED
/// STOP` or `KILLED STOP` (then the end of the cell's stderr).
pub(super) fn cell(dir: &str, w: Wait) -> String {
    let (n, pid) = (w.dir_seq, w.pid);
    let t = w.left.map_or(0, |t| t.as_millis().max(1));
    let g = w.grace.as_millis();
    let d = shell_quote(dir);
    let stop = if w.interrupted { "timeout" } else { "none" };
    // Before `mv` the request is not delivered: GONE/DEAD let the host
    // run the cell on a fresh kernel. Once a cell is out (a tool reply),
    // any loss of the dir or runner is the running cell's death: `DIED`,
    // never a word that would make the host send the cell again.
    let gone = if w.respond.is_some() {
        format!("DIED {stop}")
    } else {
        "GONE".to_owned()
    };
    let start = match w.respond {
        None => format!(
            "cat > tmp.req.{n} && mv -f tmp.req.{n} req.{n} || {{ echo GONE; exit 0; }}\n\
             if ! alive {pid} || ! kill -USR1 {pid} 2>/dev/null; then\n\
             \x20 [ -e run.{n} ] || [ -e res.{n} ] || {{ rm -f req.{n}; echo DEAD; exit 0; }}\n\
             fi"
        ),
        Some(k) => format!(
            "head -c {max_reply} > tmp.toolres.{k} && mv -f tmp.toolres.{k} toolres.{k} || {{ echo 'DIED {stop}'; exit 0; }}",
            max_reply = w.max_tool_payload.saturating_add(REPLY_ENVELOPE + 1)
        ),
    };
    // A runner that died without claiming the request (idle self-exit
    // racing this cell) never ran it: DEAD, like a runner found gone.
    let never_ran = if w.respond.is_none() {
        format!("[ -e run.{n} ] || [ -e res.{n} ] || {{ rm -f req.{n}; echo DEAD; exit 0; }}\n    ")
    } else {
        String::new()
    };
    let tools = if w.tools {
        r#"  for f in toolreq.*; do
    [ -e "$f" ] || break
    if [ $t -gt 0 ]; then r=$((t-e)); [ $r -lt 1 ] && r=1; else r=0; fi
    sz=$(($(wc -c < "$f")))
    echo "TOOL ${f#toolreq.} $stop $r $sz"; head -c $((maxreq+1)) "$f"; rm -f "$f"; exit 0
  done
"#
    } else {
        ""
    };
    let maxreq = w.max_tool_payload;
    format!(
        r#"{ALIVE}{NOW}cd {d} 2>/dev/null || {{ echo '{gone}'; exit 0; }}
umask 077
{start}
t={t}; g={g}; e=0; i=0; stop={stop}; maxreq={maxreq}; now; t0=$ms
while [ ! -e res.{n} ]; do
{tools}  if ! alive {pid}; then
    [ -e res.{n} ] && break
    {never_ran}echo "DIED $stop"; tail -c 2000 err.{n} 2>/dev/null; exit 0
  fi
  i=$((i+1))
  [ $i -le 300 ] && continue
  if [ $i -le 320 ]; then s=0.001; elif [ $i -le 360 ]; then s=0.005; else s=0.02; fi
  sleep $s; now; e=$((ms-t0))
  if [ $t -gt 0 ] && [ $e -ge $t ]; then
    if [ $stop = none ]; then kill -INT {pid} 2>/dev/null; stop=timeout; t=$g; e=0; t0=$ms
    else kill -KILL -{pid} 2>/dev/null; kill -KILL {pid} 2>/dev/null
      echo "KILLED $stop"; tail -c 2000 err.{n} 2>/dev/null; exit 0
    fi
  fi
done
echo "RESULT $stop"; cat res.{n}; rm -f res.{n}
"#
    )
}

/// One cell run in a fresh process (fail-open after a failed spawn); the
/// kernel dir goes with it. Prints `RESULT none` then the blob.
pub(super) fn oneshot(python: &str, dir: &str, max_stream: u64, cwd: Option<&str>) -> String {
    let d = shell_quote(dir);
    let chdir = cwd.map(shell_quote).unwrap_or_default();
    format!(
        "echo 'RESULT none'; {} {d}/remote.py oneshot {d} {max_stream} {chdir}; rc=$?; rm -rf {d}; exit $rc",
        shell_quote(python)
    )
}

/// SIGINT to the runner (the cell gets KeyboardInterrupt).
pub(super) fn interrupt(pid: u32) -> String {
    format!("kill -INT {pid} 2>/dev/null; echo OK")
}

/// Kill the runner's process group now (after an ignored interrupt).
pub(super) fn kill_now(pid: u32) -> String {
    format!("kill -KILL -{pid} 2>/dev/null; kill -KILL {pid} 2>/dev/null; echo OK")
}

/// Teardown: SIGTERM to the process group, up to `grace`, SIGKILL, then
/// remove the kernel dir.
pub(super) fn kill(dir: &str, pid: Option<u32>, grace: Duration) -> String {
    let d = shell_quote(dir);
    let ticks = (grace.as_millis() / 50).max(1);
    match pid {
        Some(p) => format!(
            "{ALIVE}kill -TERM -{p} 2>/dev/null; i=0; while alive {p} && [ $i -lt {ticks} ]; do sleep 0.05; i=$((i+1)); done; kill -KILL -{p} 2>/dev/null; rm -rf {d}; echo OK"
        ),
        None => format!("rm -rf {d}; echo OK"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};
    use std::time::Instant;

    fn wait(pid: u32, left: Option<Duration>, respond: Option<u64>) -> Wait {
        Wait {
            dir_seq: 1,
            pid,
            left,
            interrupted: false,
            grace: Duration::from_secs(5),
            tools: false,
            respond,
            max_tool_payload: 1000,
        }
    }

    /// Run a cell script locally with `sh`, `path` first on PATH.
    fn run(script: &str, stdin: &[u8], path: Option<&std::path::Path>) -> String {
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        if let Some(p) = path {
            cmd.env(
                "PATH",
                format!("{}:{}", p.display(), std::env::var("PATH").unwrap()),
            );
        }
        let mut child = cmd.spawn().unwrap();
        use std::io::Write;
        let _ = child.stdin.take().unwrap().write_all(stdin);
        let out = child.wait_with_output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    #[test]
    fn a_tool_reply_that_cannot_be_written_is_a_death_never_a_resend() {
        let gone = tempfile::tempdir().unwrap().path().join("gone");
        let s = cell(gone.to_str().unwrap(), wait(1, None, Some(1)));
        let out = run(&s, b"{}", None);
        assert!(out.starts_with("DIED none"), "{out:?}");
        // Before delivery the same loss is GONE (the cell never ran).
        let s = cell(gone.to_str().unwrap(), wait(1, None, None));
        assert!(run(&s, b"x", None).starts_with("GONE"));
    }

    #[test]
    fn a_runner_that_exits_without_claiming_the_cell_is_dead_not_died() {
        let dir = tempfile::tempdir().unwrap();
        // SIGUSR1 (the wake-up) kills it before it claims anything, as
        // an idle self-exit racing the cell would.
        let mut runner = Command::new("/bin/sleep").arg("30").spawn().unwrap();
        let s = cell(dir.path().to_str().unwrap(), wait(runner.id(), None, None));
        let out = run(&s, b"req", None);
        let _ = runner.wait();
        assert!(out.starts_with("DEAD"), "{out:?}");
        assert!(!dir.path().join("req.1").exists());
    }

    #[test]
    fn a_runner_that_claimed_the_cell_and_died_at_once_is_died_not_dead() {
        let dir = tempfile::tempdir().unwrap();
        // The cell was claimed (run.1) by a runner that is gone by the
        // time the script checks it: the cell may have run.
        std::fs::write(dir.path().join("run.1"), b"").unwrap();
        let mut gone = Command::new("/bin/true").spawn().unwrap();
        let pid = gone.id();
        gone.wait().unwrap();
        let s = cell(dir.path().to_str().unwrap(), wait(pid, None, None));
        let out = run(&s, b"req", None);
        assert!(out.starts_with("DIED none"), "{out:?}");
    }

    #[test]
    fn the_remote_timeout_counts_real_time_however_slow_sleep_is() {
        let dir = tempfile::tempdir().unwrap();
        let bin = tempfile::tempdir().unwrap();
        let sleep = bin.path().join("sleep");
        std::fs::write(&sleep, "#!/bin/sh\nexec /bin/sleep 0.2\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&sleep, std::fs::Permissions::from_mode(0o755)).unwrap();
        // A runner that has claimed the cell and exits on SIGINT.
        std::fs::write(dir.path().join("run.1"), b"").unwrap();
        let mut runner = Command::new("/bin/sh")
            .args([
                "-c",
                "trap '' USR1; trap 'exit 0' INT; while :; do /bin/sleep 0.05; done",
            ])
            .spawn()
            .unwrap();
        let s = cell(
            dir.path().to_str().unwrap(),
            wait(runner.id(), Some(Duration::from_millis(300)), None),
        );
        let started = Instant::now();
        let out = run(&s, b"req", Some(bin.path()));
        let took = started.elapsed();
        let _ = runner.kill();
        let _ = runner.wait();
        assert!(out.starts_with("DIED timeout"), "{out:?}");
        assert!(took < Duration::from_millis(2500), "SIGINT after {took:?}");
    }
}

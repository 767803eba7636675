//! A real `cellhost serve` for the CLI's tests: started on a free port,
//! its banner read, its stdout drained, stopped by SIGTERM (and killed on
//! drop if it has not stopped).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub(crate) struct Daemon {
    pub(crate) child: Child,
    pub(crate) url: String,
    pub(crate) banner: String,
    data: std::path::PathBuf,
}

impl Daemon {
    pub(crate) fn start(data: &Path, extra: &[&str], env: &[(&str, &str)]) -> Daemon {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_cellhost"));
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data)
            .args(extra)
            .env_remove("CELLHOST_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut banner = String::new();
        let url = loop {
            let mut line = String::new();
            if out.read_line(&mut line).unwrap() == 0 {
                panic!("serve exited before listening: {banner}");
            }
            banner.push_str(&line);
            if let Some(rest) = line.split("listening on ").nth(1) {
                break rest.split_whitespace().next().unwrap().to_owned();
            }
        };
        // The next line names the dashboard.
        out.read_line(&mut banner).unwrap();
        // Keep draining stdout so the daemon never blocks on a full pipe.
        std::thread::spawn(move || {
            let mut sink = String::new();
            let _ = out.read_to_string(&mut sink);
        });
        Daemon {
            child,
            url,
            banner,
            data: data.to_path_buf(),
        }
    }

    pub(crate) fn none(data: &Path) -> Daemon {
        Daemon::start(data, &["--sandbox", "none"], &[])
    }

    pub(crate) fn cli(&self, args: &[&str]) -> Output {
        self.cli_env(args, &[])
    }

    pub(crate) fn cli_env(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_cellhost"));
        cmd.args(args)
            .env("CELLHOST_URL", &self.url)
            .env_remove("CELLHOST_TOKEN")
            .stdin(Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    }

    /// SIGTERM and wait; returns the exit code.
    pub(crate) fn stop(mut self) -> Option<i32> {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let end = Instant::now() + Duration::from_secs(60);
        while Instant::now() < end {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("serve did not stop after SIGTERM");
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let end = Instant::now() + Duration::from_secs(20);
            while Instant::now() < end && matches!(self.child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if !std::thread::panicking() {
            let left = leftovers(&self.data);
            assert!(left.is_empty(), "the daemon left {left:?}");
        }
    }
}

/// Mounts and loop devices under `data` (workspace volumes) a stopped
/// daemon left, after a moment for its dead kernels' namespaces to go.
pub(crate) fn leftovers(data: &Path) -> Vec<String> {
    let data = data.to_string_lossy().into_owned();
    let now = || {
        let mut out: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|m| m.starts_with(&format!("{data}/")))
            .map(|m| format!("mount {m}"))
            .collect();
        for e in std::fs::read_dir("/sys/block")
            .into_iter()
            .flatten()
            .flatten()
        {
            if let Ok(f) = std::fs::read_to_string(e.path().join("loop/backing_file")) {
                if f.starts_with(&data) {
                    out.push(format!("loop {}", f.trim()));
                }
            }
        }
        out
    };
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let left = now();
        if left.is_empty() || Instant::now() > end {
            return left;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

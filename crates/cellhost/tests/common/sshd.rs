//! An sshd of the test's own (the shared test host's config on another
//! port), which the test may stop and start again: an outage of the
//! server a live session runs on. The shared sshd is never touched.
#![allow(dead_code)]

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use super::remote::env;

pub struct OwnSshd {
    pub port: u16,
    config: PathBuf,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

/// A local port nothing listens on (bound, then released).
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

impl OwnSshd {
    /// Start it on a free port of 127.0.0.1.
    pub fn start() -> OwnSshd {
        let key = env("CELLHOST_TEST_SSH_KEY");
        let shared = PathBuf::from(&key).parent().unwrap().join("sshd_config");
        let text = std::fs::read_to_string(&shared).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let mut config: String = text
            .lines()
            .filter(|l| !l.starts_with("Port ") && !l.starts_with("PidFile "))
            .map(|l| format!("{l}\n"))
            .collect();
        config.push_str(&format!(
            "Port {port}\nPidFile {}\n",
            dir.path().join("sshd.pid").display()
        ));
        let path = dir.path().join("sshd_config");
        std::fs::write(&path, config).unwrap();
        let mut s = OwnSshd {
            port,
            config: path,
            dir,
            child: None,
        };
        s.up();
        s
    }

    /// (Re)start the listener and wait until it accepts.
    pub fn up(&mut self) {
        assert!(self.child.is_none(), "already up");
        let log = self.dir.path().join("sshd.log");
        let child = Command::new("/usr/sbin/sshd")
            .args(["-D", "-f"])
            .arg(&self.config)
            .arg("-E")
            .arg(&log)
            .spawn()
            .expect("start sshd");
        self.child = Some(child);
        let end = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < end,
                "own sshd on {} did not start",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stop the listener and every connection it serves (as a stopped
    /// service or a restarted host would): the port refuses from now on.
    /// Processes that left the listener's tree (a detached runner) live.
    pub fn down(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let listener = child.id();
        let mut doomed = descendants(listener);
        doomed.push(listener);
        for pid in doomed {
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        let _ = child.wait();
        let end = Instant::now() + Duration::from_secs(5);
        while TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
            assert!(Instant::now() < end, "own sshd still accepts");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for OwnSshd {
    fn drop(&mut self) {
        self.down();
    }
}

/// Every process below `pid`, from /proc.
fn descendants(pid: u32) -> Vec<u32> {
    let mut parent_of = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(p) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        // pid (comm) state ppid …: comm may hold spaces, so split after ')'.
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        if let Some(ppid) = rest
            .split_whitespace()
            .nth(1)
            .and_then(|x| x.parse::<u32>().ok())
        {
            parent_of.push((p, ppid));
        }
    }
    let mut found = vec![pid];
    let mut i = 0;
    while i < found.len() {
        let q = found[i];
        found.extend(parent_of.iter().filter(|(_, pp)| *pp == q).map(|(p, _)| *p));
        i += 1;
    }
    found.remove(0);
    found
}

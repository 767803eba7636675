//! A real `cellhost serve` process for the reliability runs: started on a
//! fixed port (so a restart keeps the clients' address), a private data
//! dir and a private runtime dir, SIGKILLed or SIGTERMed on demand; and the
//! /proc facts the runs check (its fd count, processes it left behind).

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// Where a daemon runs and how it is started.
pub struct DaemonSetup {
    pub bin: PathBuf,
    /// Everything of this run lives under here; its path marks the
    /// processes the daemon started (in their environment or argv).
    pub root: PathBuf,
    pub addr: SocketAddr,
    pub sandbox: String,
    pub config: String,
}

impl DaemonSetup {
    /// A setup under a fresh dir in /tmp, on a free loopback port.
    pub fn new(bin: PathBuf, sandbox: &str, config: &str) -> Result<DaemonSetup> {
        let root = std::env::temp_dir().join(format!(
            "cellhost-rel-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_millis()
        ));
        std::fs::create_dir_all(root.join("run"))?;
        let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        Ok(DaemonSetup {
            bin,
            root,
            addr,
            sandbox: sandbox.to_owned(),
            config: config.to_owned(),
        })
    }

    pub fn data_dir(&self) -> PathBuf {
        self.root.join("data")
    }

    /// The kernels' staging dirs live here (`$XDG_RUNTIME_DIR/cellhost/kernels`).
    pub fn staging_root(&self) -> PathBuf {
        self.root.join("run/cellhost/kernels")
    }

    /// Start `cellhost serve` and wait until it listens.
    pub fn start(&self) -> Result<Daemon> {
        let config = self.root.join("cellhost.toml");
        std::fs::write(&config, &self.config)?;
        let mut child = Command::new(&self.bin)
            .args([
                "serve",
                "--listen",
                &self.addr.to_string(),
                "--sandbox",
                &self.sandbox,
            ])
            .arg("--data-dir")
            .arg(self.data_dir())
            .arg("--config")
            .arg(&config)
            .env("XDG_RUNTIME_DIR", self.root.join("run"))
            .env_remove("CELLHOST_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", self.bin.display()))?;
        let mut out = BufReader::new(child.stdout.take().context("no stdout")?);
        let mut line = String::new();
        let end = Instant::now() + Duration::from_secs(30);
        // The port may still be held by the previous (killed) daemon's
        // lingering sockets for a moment: the daemon then exits, and we retry.
        while !line.contains("listening on ") {
            line.clear();
            if out.read_line(&mut line)? == 0 {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ = e.read_to_string(&mut err);
                }
                let _ = child.wait();
                if Instant::now() < end && err.contains("in use") {
                    std::thread::sleep(Duration::from_millis(200));
                    return self.start();
                }
                bail!("cellhost serve exited before listening: {err}");
            }
        }
        drain(out);
        if let Some(e) = child.stderr.take() {
            // Kept for the run's report (what the daemon said of a kernel
            // whose staging dir it left).
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.root.join("daemon.log"))?;
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut BufReader::new(e), &mut { log });
            });
        }
        Ok(Daemon { child })
    }

    /// Processes (other than `except`) whose argv or environment names
    /// this run's root: kernels, watchers and what cells started.
    pub fn marked_processes(&self, except: Option<u32>) -> Vec<u32> {
        let needle = self.root.to_string_lossy().into_owned().into_bytes();
        let me = std::process::id();
        let mut found = Vec::new();
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return found;
        };
        for e in dir.filter_map(Result::ok) {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if pid == me || Some(pid) == except || is_zombie(pid) {
                continue;
            }
            let hit = ["cmdline", "environ"].iter().any(|f| {
                std::fs::read(e.path().join(f))
                    .is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle.as_slice()))
            });
            if hit {
                found.push(pid);
            }
        }
        found
    }

    /// Wait up to `within` for every marked process but `except` to go;
    /// SIGKILL and return those still there.
    pub fn orphans_after(&self, except: Option<u32>, within: Duration) -> Vec<u32> {
        let end = Instant::now() + within;
        loop {
            let left = self.marked_processes(except);
            if left.is_empty() || Instant::now() >= end {
                for &p in &left {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(p as i32),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                return left;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Entries left in the kernels' staging root, each with what is in it
    /// and what the daemons' stderr said of it.
    pub fn staging_left(&self) -> Vec<String> {
        let log = std::fs::read_to_string(self.root.join("daemon.log")).unwrap_or_default();
        list(&self.staging_root())
            .into_iter()
            .map(|name| {
                let dir = self.staging_root().join(&name);
                let mut files = list(&dir);
                files.sort();
                let host = std::fs::read_to_string(dir.join(".host")).unwrap_or_default();
                let said: Vec<&str> = log.lines().filter(|l| l.contains(&name)).take(5).collect();
                format!(
                    "{name} (files {files:?}, .host {:?}, daemon said {said:?})",
                    host.trim()
                )
            })
            .collect()
    }

    /// Remove everything this run created.
    pub fn remove(&self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.starts_with('Z')))
        .unwrap_or(true)
}

fn list(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn drain(mut r: impl Read + Send + 'static) {
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut r, &mut std::io::sink());
    });
}

/// A running daemon.
pub struct Daemon {
    child: Child,
}

impl Daemon {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Open file descriptors of the daemon process.
    pub fn fd_count(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid())).map_or(0, |d| d.count())
    }

    pub fn rss_kib(&self) -> u64 {
        crate::procfs::vm_rss_kib(self.pid()).unwrap_or(0)
    }

    /// SIGKILL and reap.
    pub fn sigkill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM and wait for a graceful exit; its exit code.
    pub fn stop(mut self) -> Result<Option<i32>> {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )?;
        let end = Instant::now() + Duration::from_secs(60);
        while Instant::now() < end {
            if let Some(st) = self.child.try_wait()? {
                return Ok(st.code());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        bail!("cellhost serve did not stop within 60 s of SIGTERM")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

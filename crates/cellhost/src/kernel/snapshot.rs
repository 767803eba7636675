//! Snapshots of a live kernel's namespace, and loading one into a fresh
//! kernel (docs/snapshots.md): the host's end.
//!
//! The runner (`runner/snapshot.py`) writes or reads the snapshot stream
//! through a FIFO the host makes in the kernel's staging dir, which a
//! strict sandbox sees too (read-only bind: a FIFO opens for writing on a
//! read-only mount). A blocking thread here compresses what comes out of
//! the FIFO into the snapshot file (zstd; written beside it and renamed
//! into place, so a reader sees a whole file or none), or feeds a snapshot
//! file into it. The stream is capped while it is read: past the cap the
//! thread stops reading, the runner's write fails, and nothing is kept.
//! The bytes are the cell's, so hostile: the host never parses them, only
//! counts, compresses and decompresses them (with a cap on the output).

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cellhost_protocol::Skipped;

/// The bounds of one snapshot or restore: the stream's size before
/// compression, and the time the runner has for it (past it, the runner
/// is interrupted, then killed after the interrupt grace, as a cell is).
/// A bare byte count means the default timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotLimits {
    /// At most this many bytes of stream.
    pub max_bytes: u64,
    /// At most this long.
    pub timeout: Duration,
}

impl SnapshotLimits {
    /// The default timeout (`[snapshots] timeout_seconds`): 60 s, well
    /// over a 1 GB state's few seconds.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
}

impl From<u64> for SnapshotLimits {
    fn from(max_bytes: u64) -> Self {
        SnapshotLimits {
            max_bytes,
            timeout: SnapshotLimits::DEFAULT_TIMEOUT,
        }
    }
}

/// What to do with a kernel's namespace.
#[derive(Debug, Clone)]
pub(crate) enum Job {
    /// Write it to `dest` (compressed), at most `max` bytes before
    /// compression.
    Take { dest: PathBuf, max: u64 },
    /// Load the snapshot at `src` into the namespace.
    Restore { src: PathBuf, max: u64 },
}

impl Job {
    pub(crate) fn op(&self) -> &'static str {
        match self {
            Job::Take { .. } => "snapshot",
            Job::Restore { .. } => "restore",
        }
    }

    /// The file name a remote runner keeps this job's snapshot under.
    pub(crate) fn file_name(&self) -> String {
        let path = match self {
            Job::Take { dest, .. } => dest,
            Job::Restore { src, .. } => src,
        };
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    pub(crate) fn max(&self) -> u64 {
        match self {
            Job::Take { max, .. } | Job::Restore { max, .. } => *max,
        }
    }
}

/// What a snapshot or a restore did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Globals kept (or loaded).
    pub names: u64,
    /// Globals that could not be kept (or loaded), and why.
    pub skipped: Vec<Skipped>,
    /// The stream's size before compression.
    pub raw_bytes: u64,
    /// The snapshot file's size (after compression); 0 for a restore.
    pub bytes: u64,
}

/// Why a snapshot or a restore did not happen.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    /// Snapshots are off (`[lifecycle] snapshots = "off"`).
    #[error(
        "snapshots are off on this host; turn them on with [lifecycle] snapshots = \"on_stop\""
    )]
    Off,
    /// The session has no live kernel to snapshot.
    #[error("the session has no live kernel: there is no state to snapshot")]
    NoKernel,
    /// The kernel's backend cannot take snapshots.
    #[error("snapshots of {backend} kernels are not supported yet; only local kernels (strict and none) take them")]
    Unsupported {
        /// The backend's name.
        backend: String,
    },
    /// The state is larger than the cap.
    #[error("the state is over the snapshot cap of {max_mib} MiB (`[snapshots] max_mib`); no snapshot was kept")]
    TooLarge {
        /// The cap.
        max_mib: u64,
    },
    /// The runner could not write or load it (its reason).
    #[error("{0}")]
    Runner(String),
    /// The runner did not finish within the timeout (it was interrupted
    /// or, past the interrupt grace, killed).
    #[error("the {op} did not finish within {seconds} s (`[snapshots] timeout_seconds`); nothing was kept")]
    TimedOut {
        /// `snapshot` or `restore`.
        op: &'static str,
        /// The timeout.
        seconds: u64,
    },
    /// The kernel died or was stopped while it ran.
    #[error("the kernel went away during the snapshot: {0}")]
    KernelGone(String),
    /// A host-side file operation failed.
    #[error("could not {about}")]
    Io {
        /// What was being done.
        about: &'static str,
        /// The failure.
        #[source]
        err: io::Error,
    },
}

fn io_err(about: &'static str) -> impl FnOnce(io::Error) -> SnapshotError {
    move |err| SnapshotError::Io { about, err }
}

/// A FIFO in `dir` (the staging dir) and the blocking task that pumps
/// it, removed when dropped. A FIFO dropped before [`Fifo::release`] (its
/// actor cancelled, as at runtime shutdown) still releases its pump, from
/// a thread of its own: a pump left in `open` would hold the runtime's
/// blocking pool, and so the daemon's exit, forever.
pub(crate) struct Fifo {
    pub(crate) path: PathBuf,
    job: Job,
    pump: Option<tokio::task::JoinHandle<Pumped>>,
}

impl Fifo {
    /// The FIFO for `job` in `dir`, its pump started.
    pub(crate) fn start(dir: &Path, job: &Job) -> Result<Fifo, SnapshotError> {
        let mut fifo = Fifo::make(dir, job)?;
        let (path, job) = (fifo.path.clone(), job.clone());
        fifo.pump = Some(tokio::task::spawn_blocking(move || pump(&path, &job)));
        Ok(fifo)
    }

    fn make(dir: &Path, job: &Job) -> Result<Fifo, SnapshotError> {
        let path = dir.join(format!("snapshot-{}.fifo", crate::sys::random_hex(4)));
        // 0666 in the kernel's 0700 staging dir: only the kernel (whose
        // uid the dir is handed to) and the host reach it.
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o666)).map_err(
            |e| SnapshotError::Io {
                about: "make the snapshot FIFO in the staging dir",
                err: e.into(),
            },
        )?;
        let _ =
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o666));
        Ok(Fifo {
            path,
            job: job.clone(),
            pump: None,
        })
    }

    /// Once the runner is done with its end (or gone): collect what the
    /// pump did, releasing it from an `open` that waits for a runner that
    /// never opened its end. Opening the other end without blocking
    /// releases an `open` already waiting only, and the pump's thread may
    /// not have reached it yet (a busy blocking pool), so this retries
    /// until the pump has finished.
    pub(crate) async fn release(mut self) -> Pumped {
        let Some(mut pump) = self.pump.take() else {
            return Err(SnapshotError::Runner(
                "the snapshot pump never started".into(),
            ));
        };
        loop {
            unblock(&self.path, &self.job);
            match tokio::time::timeout(Duration::from_millis(20), &mut pump).await {
                Ok(done) => {
                    return done.unwrap_or_else(|_| {
                        Err(SnapshotError::Runner(
                            "the snapshot pump thread failed".into(),
                        ))
                    })
                }
                Err(_) => continue,
            }
        }
    }
}

/// Open the other end of the FIFO at `path` without blocking, and close it.
fn unblock(path: &Path, job: &Job) {
    let mut o = std::fs::OpenOptions::new();
    match job {
        Job::Take { .. } => o.write(true),
        Job::Restore { .. } => o.read(true),
    };
    let _ = o.custom_flags(libc::O_NONBLOCK).open(path);
}

impl Drop for Fifo {
    fn drop(&mut self) {
        let Some(pump) = self.pump.take().filter(|p| !p.is_finished()) else {
            let _ = std::fs::remove_file(&self.path);
            return;
        };
        let (path, job) = (self.path.clone(), self.job.clone());
        std::thread::spawn(move || {
            // A pump never started (a pool shut down) finishes as
            // cancelled; one in `open` is let out; give up after a minute.
            for _ in 0..3000 {
                if pump.is_finished() {
                    break;
                }
                unblock(&path, &job);
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = std::fs::remove_file(&path);
        });
    }
}

/// What the pump thread did: raw bytes moved, compressed bytes written.
pub(crate) type Pumped = Result<(u64, u64), SnapshotError>;

/// The pump of `job` through `fifo` (run on a blocking thread).
pub(crate) fn pump(fifo: &Path, job: &Job) -> Pumped {
    match job {
        Job::Take { dest, max } => take(fifo, dest, *max),
        Job::Restore { src, max } => feed(fifo, src, *max),
    }
}

/// zstd's fast mode (`--fast=3`): a snapshot is written on the way out
/// of a kernel (an eviction waits for it), so its time matters more than
/// its size; numbers of numpy state hardly compress at any level.
const ZSTD_LEVEL: i32 = -3;

/// A bigger pipe buffer for the FIFO (1 MiB instead of 64 KiB): fewer
/// wake-ups per gigabyte. Best effort.
fn widen(f: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: fcntl on an fd we own; F_SETPIPE_SZ takes an int.
    unsafe {
        libc::fcntl(f.as_raw_fd(), libc::F_SETPIPE_SZ, 1 << 20);
    }
}

fn take(fifo: &Path, dest: &Path, max: u64) -> Pumped {
    let mut input = File::open(fifo).map_err(io_err("open the snapshot FIFO"))?;
    widen(&input);
    let dir = dest.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io_err("create the snapshots dir"))?;
    let tmp = dir.join(format!(
        ".tmp-{}-{}",
        crate::sys::random_hex(4),
        dest.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default()
    ));
    let out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io_err("create the snapshot file"))?;
    let written = (|| {
        let mut enc = zstd::Encoder::new(out, ZSTD_LEVEL).map_err(io_err("start compressing"))?;
        let mut buf = vec![0u8; 1 << 20];
        let mut raw = 0u64;
        loop {
            let n = match input.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io_err("read the snapshot stream")(e)),
            };
            raw += n as u64;
            if raw > max {
                // Stop reading: the runner's next write fails (EPIPE).
                return Err(SnapshotError::TooLarge { max_mib: max >> 20 });
            }
            enc.write_all(&buf[..n])
                .map_err(io_err("write the snapshot file"))?;
        }
        let out = enc.finish().map_err(io_err("finish the snapshot file"))?;
        out.sync_all().map_err(io_err("sync the snapshot file"))?;
        let bytes = out.metadata().map(|m| m.len()).unwrap_or(0);
        Ok((raw, bytes))
    })();
    drop(input);
    match written {
        Ok(sizes) => {
            std::fs::rename(&tmp, dest).map_err(io_err("put the snapshot file in place"))?;
            if let Ok(d) = File::open(dir) {
                let _ = d.sync_all();
            }
            Ok(sizes)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

fn feed(fifo: &Path, src: &Path, max: u64) -> Pumped {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(src)
        .map_err(io_err("open the snapshot file"))?;
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .open(fifo)
        .map_err(io_err("open the snapshot FIFO"))?;
    widen(&out);
    let dec = zstd::Decoder::new(file).map_err(io_err("start decompressing"))?;
    // A snapshot that decompresses to more than the cap is not ours.
    let mut dec = dec.take(max.saturating_add(1));
    let mut buf = vec![0u8; 1 << 20];
    let mut raw = 0u64;
    loop {
        let n = match dec.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // Corrupt: stop; the runner reads a truncated stream and says so.
            Err(_) => break,
        };
        raw += n as u64;
        if raw > max {
            break;
        }
        if out.write_all(&buf[..n]).is_err() {
            break; // the runner stopped reading (it failed): it says why
        }
    }
    Ok((raw, 0))
}

/// The bytes a runner says it wrote to a snapshot file of its own host.
pub(crate) fn parse_file_bytes(value: &str) -> u64 {
    #[derive(serde::Deserialize)]
    struct B {
        #[serde(default)]
        bytes: u64,
    }
    serde_json::from_str::<B>(value).map_or(0, |b| b.bytes)
}

/// The runner's summary (`{"names": n, "skipped": [...]}`).
pub(crate) fn parse_summary(value: &str) -> Result<(u64, Vec<Skipped>), SnapshotError> {
    #[derive(serde::Deserialize)]
    struct S {
        names: u64,
        #[serde(default)]
        skipped: Vec<Skipped>,
    }
    // The runner lives in the cell's process: its summary is bounded here
    // too, whatever a cell did to it.
    const MAX_SKIPPED: usize = 200;
    const MAX_TEXT: usize = 512;
    let clip = |mut t: String| {
        if t.len() > MAX_TEXT {
            let mut end = MAX_TEXT;
            while !t.is_char_boundary(end) {
                end -= 1;
            }
            t.truncate(end);
        }
        t
    };
    serde_json::from_str::<S>(value)
        .map(|s| {
            let skipped = s
                .skipped
                .into_iter()
                .take(MAX_SKIPPED)
                .map(|k| Skipped {
                    name: clip(k.name),
                    kind: clip(k.kind),
                    why: clip(k.why),
                })
                .collect();
            (s.names, skipped)
        })
        .map_err(|e| {
            SnapshotError::Runner(format!("the runner's snapshot summary is not valid: {e}"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A runner killed before it opened its end of the FIFO, with the
    /// pump's thread not yet in its `open` when the turn ends (a busy
    /// blocking pool): releasing must still end the pump, for both jobs.
    #[tokio::test]
    async fn a_pump_that_opens_after_the_runner_is_gone_is_released() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("in.zst");
        std::fs::write(&src, zstd::encode_all(&b"state"[..], 0).unwrap()).unwrap();
        let jobs = [
            Job::Take {
                dest: dir.path().join("out.zst"),
                max: 1 << 20,
            },
            Job::Restore { src, max: 1 << 20 },
        ];
        for job in &jobs {
            let mut fifo = Fifo::make(dir.path(), job).unwrap();
            fifo.pump = Some(late_pump(&fifo, job));
            let released = tokio::time::timeout(Duration::from_secs(20), fifo.release()).await;
            assert!(released.is_ok(), "the {} pump was never released", job.op());
        }
        // Dropped unreleased (its turn cancelled): the pump ends all the
        // same, and the FIFO goes.
        for job in &jobs {
            let mut fifo = Fifo::make(dir.path(), job).unwrap();
            let pump = late_pump(&fifo, job);
            let watch = pump.abort_handle();
            let path = fifo.path.clone();
            fifo.pump = Some(pump);
            drop(fifo);
            let end = std::time::Instant::now() + Duration::from_secs(20);
            while (path.exists() || !watch.is_finished()) && std::time::Instant::now() < end {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            assert!(
                watch.is_finished(),
                "the dropped {} pump was never released",
                job.op()
            );
            assert!(!path.exists());
        }
    }

    /// A pump whose thread reaches its `open` only after 300 ms.
    fn late_pump(fifo: &Fifo, job: &Job) -> tokio::task::JoinHandle<Pumped> {
        let (path, job) = (fifo.path.clone(), job.clone());
        tokio::task::spawn_blocking(move || {
            std::thread::sleep(Duration::from_millis(300));
            pump(&path, &job)
        })
    }

    #[test]
    fn a_summary_from_a_tampered_runner_is_bounded() {
        let long = "x".repeat(10_000);
        let skipped: Vec<String> = (0..1000)
            .map(|i| format!(r#"{{"name": "n{i}{long}", "type": "t", "why": "w"}}"#))
            .collect();
        let text = format!(r#"{{"names": 3, "skipped": [{}]}}"#, skipped.join(","));
        let (names, skipped) = parse_summary(&text).unwrap();
        assert_eq!(names, 3);
        assert_eq!(skipped.len(), 200);
        assert!(skipped.iter().all(|s| s.name.len() <= 512));
        assert!(parse_summary("not json").is_err());
    }
}

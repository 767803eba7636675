//! Resource limits of one kernel: what they are, how they are set with
//! `setrlimit` in the child, and how a breach is named.

use std::io;

/// Per-kernel resource limits. `None` means "not limited by cellhost".
///
/// - `memory_bytes`: a per-kernel cgroup memory limit where this host has
///   a writable cgroup hierarchy (v1 `memory.limit_in_bytes` or v2
///   `memory.max`), else `RLIMIT_AS` on every process of the kernel.
/// - `cpu_seconds_per_cell`: CPU time one cell may use; the runner moves
///   its soft `RLIMIT_CPU` to "used so far + this" at the start of each
///   cell, so a breach kills the kernel with SIGXCPU.
/// - `max_processes`: a per-kernel cgroup `pids.max`, else `RLIMIT_NPROC`
///   (which counts every process of the kernel's uid, and which root
///   ignores).
/// - `max_open_files`: `RLIMIT_NOFILE`.
/// - `max_file_size_bytes`: `RLIMIT_FSIZE` (a write past it fails with
///   `EFBIG`; Python ignores SIGXFSZ).
/// - `cgroups`: use per-kernel cgroups where possible (default true);
///   `false`: rlimits only (weaker: `RLIMIT_NPROC` is per uid and root
///   ignores it, `RLIMIT_AS` counts address space per process).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceLimits {
    /// Memory of the whole kernel, in bytes.
    pub memory_bytes: Option<u64>,
    /// CPU seconds (user + system) one cell may use.
    pub cpu_seconds_per_cell: Option<u64>,
    /// Processes and threads of the kernel.
    pub max_processes: Option<u64>,
    /// Open file descriptors per process.
    pub max_open_files: Option<u64>,
    /// Largest file a kernel process may write, in bytes.
    pub max_file_size_bytes: Option<u64>,
    /// Use per-kernel cgroups where the host allows (`false`: rlimits only).
    pub cgroups: bool,
}

const MIB: u64 = 1024 * 1024;

impl Default for ResourceLimits {
    /// 2 GiB of memory, 300 CPU seconds per cell, 512 processes, 1024
    /// open files, 1 GiB per file.
    fn default() -> Self {
        ResourceLimits {
            memory_bytes: Some(2048 * MIB),
            cpu_seconds_per_cell: Some(300),
            max_processes: Some(512),
            max_open_files: Some(1024),
            max_file_size_bytes: Some(1024 * MIB),
            cgroups: true,
        }
    }
}

impl ResourceLimits {
    /// No limits at all (the host's own rlimits are inherited).
    pub fn unlimited() -> Self {
        ResourceLimits {
            memory_bytes: None,
            cpu_seconds_per_cell: None,
            max_processes: None,
            max_open_files: None,
            max_file_size_bytes: None,
            cgroups: true,
        }
    }

    /// Use per-kernel cgroups where possible (`true`, the default) or
    /// rlimits only.
    pub fn cgroups(mut self, on: bool) -> Self {
        self.cgroups = on;
        self
    }

    /// Limit the kernel's memory to `v` bytes (`None`: no limit).
    pub fn memory_bytes(mut self, v: Option<u64>) -> Self {
        self.memory_bytes = v;
        self
    }

    /// Limit each cell to `v` CPU seconds (`None`: no limit).
    pub fn cpu_seconds_per_cell(mut self, v: Option<u64>) -> Self {
        self.cpu_seconds_per_cell = v;
        self
    }

    /// Limit the kernel to `v` processes and threads (`None`: no limit).
    pub fn max_processes(mut self, v: Option<u64>) -> Self {
        self.max_processes = v;
        self
    }

    /// Limit each kernel process to `v` open files (`None`: no limit).
    pub fn max_open_files(mut self, v: Option<u64>) -> Self {
        self.max_open_files = v;
        self
    }

    /// Limit files the kernel writes to `v` bytes each (`None`: no limit).
    pub fn max_file_size_bytes(mut self, v: Option<u64>) -> Self {
        self.max_file_size_bytes = v;
        self
    }
}

/// One limit with its value, for the sentence that names a breach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Limit {
    /// Bytes; `cgroup` says how it was enforced.
    Memory {
        bytes: u64,
        cgroup: bool,
    },
    CpuPerCell {
        seconds: u64,
    },
    Processes {
        max: u64,
    },
    OpenFiles {
        max: u64,
    },
    FileSize {
        bytes: u64,
    },
}

impl Limit {
    /// e.g. `memory limit 512 MiB`, `CPU limit 10 s per cell`.
    pub(crate) fn describe(self) -> String {
        match self {
            Limit::Memory { bytes, .. } => format!("memory limit {}", human_bytes(bytes)),
            Limit::CpuPerCell { seconds } => format!("CPU limit {seconds} s per cell"),
            Limit::Processes { max } => format!("process limit {max}"),
            Limit::OpenFiles { max } => format!("open files limit {max}"),
            Limit::FileSize { bytes } => format!("file size limit {}", human_bytes(bytes)),
        }
    }
}

/// `512 MiB`, `1.5 GiB`, `100 KiB`, `10 bytes`.
pub(super) fn human_bytes(b: u64) -> String {
    let units = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (name, size) in units {
        if b >= size {
            return if b.is_multiple_of(size) {
                format!("{} {name}", b / size)
            } else {
                format!("{:.1} {name}", b as f64 / size as f64)
            };
        }
    }
    format!("{b} bytes")
}

/// The rlimits to set in the child, computed before fork (no allocation
/// after it). Each value is clamped to the current hard limit: root may
/// not be allowed to raise it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rlimits {
    items: [(libc::__rlimit_resource_t, u64); 4],
    len: usize,
}

impl Rlimits {
    /// `memory_by_rlimit`: no cgroup enforces memory, so `RLIMIT_AS` does;
    /// `nproc_by_rlimit`: likewise for processes.
    pub(crate) fn plan(l: &ResourceLimits, memory_by_rlimit: bool, nproc_by_rlimit: bool) -> Self {
        let mut r = Rlimits {
            items: [(0, 0); 4],
            len: 0,
        };
        let mut push = |res, v: Option<u64>| {
            if let Some(v) = v {
                r.items[r.len] = (res, clamp_to_hard(res, v));
                r.len += 1;
            }
        };
        push(libc::RLIMIT_NOFILE, l.max_open_files);
        push(libc::RLIMIT_FSIZE, l.max_file_size_bytes);
        if memory_by_rlimit {
            push(libc::RLIMIT_AS, l.memory_bytes);
        }
        if nproc_by_rlimit {
            push(libc::RLIMIT_NPROC, l.max_processes);
        }
        r
    }

    /// In the forked child: `setrlimit` only (async-signal-safe).
    pub(crate) fn apply(&self) -> io::Result<()> {
        for &(res, v) in &self.items[..self.len] {
            let lim = libc::rlimit {
                rlim_cur: v,
                rlim_max: v,
            };
            // SAFETY: setrlimit with a valid pointer to a local struct.
            if unsafe { libc::setrlimit(res, &lim) } != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

fn clamp_to_hard(res: libc::__rlimit_resource_t, v: u64) -> u64 {
    let mut cur = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit with a valid pointer to a local struct.
    if unsafe { libc::getrlimit(res, &mut cur) } == 0 && cur.rlim_max != libc::RLIM_INFINITY {
        v.min(cur.rlim_max)
    } else {
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_read_naturally() {
        assert_eq!(
            Limit::Memory {
                bytes: 512 * MIB,
                cgroup: true
            }
            .describe(),
            "memory limit 512 MiB"
        );
        assert_eq!(
            Limit::CpuPerCell { seconds: 10 }.describe(),
            "CPU limit 10 s per cell"
        );
        assert_eq!(
            Limit::FileSize { bytes: 10 * MIB }.describe(),
            "file size limit 10 MiB"
        );
        assert_eq!(human_bytes(1536 * MIB), "1.5 GiB");
        assert_eq!(human_bytes(10), "10 bytes");
    }

    #[test]
    fn the_plan_sets_as_and_nproc_only_without_cgroups() {
        let l = ResourceLimits::default();
        assert_eq!(Rlimits::plan(&l, false, false).len, 2);
        assert_eq!(Rlimits::plan(&l, true, true).len, 4);
        assert_eq!(
            Rlimits::plan(&ResourceLimits::unlimited(), true, true).len,
            0
        );
    }
}

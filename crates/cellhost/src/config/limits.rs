//! `[limits]`: per-kernel resource limits (0 means unlimited).

use serde::Deserialize;

use crate::sandbox::ResourceLimits;

const MIB: u64 = 1024 * 1024;

/// `[limits]` keys, in the units an operator thinks in.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Memory of one kernel, in MiB (default 2048).
    pub memory_mib: u64,
    /// CPU seconds one cell may use (default 300); a breach kills the
    /// kernel.
    pub cpu_seconds_per_cell: u64,
    /// Processes and threads of one kernel (default 512).
    pub max_processes: u64,
    /// Open files per kernel process (default 1024).
    pub max_open_files: u64,
    /// Largest file a kernel may write, in MiB (default 1024).
    pub max_file_size_mib: u64,
    /// Per-kernel cgroups for memory and processes where the host has a
    /// writable hierarchy (else rlimits); `false`: rlimits only.
    pub cgroups: bool,
    /// Bytes a session's workspace may hold, in MiB (default 4096).
    pub workspace_mib: u64,
    /// Each workspace on a loop-mounted filesystem of its own sized to
    /// `workspace_mib`, so a cell's own writes stop at the quota (ENOSPC);
    /// where the host cannot (not root, no loop devices, no mkfs.ext4),
    /// uploads alone respect the quota and start-up says so. Default true.
    pub workspace_fs: bool,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        let d = ResourceLimits::default();
        let or0 = |v: Option<u64>| v.unwrap_or(0);
        LimitsConfig {
            memory_mib: or0(d.memory_bytes) / MIB,
            cpu_seconds_per_cell: or0(d.cpu_seconds_per_cell),
            max_processes: or0(d.max_processes),
            max_open_files: or0(d.max_open_files),
            max_file_size_mib: or0(d.max_file_size_bytes) / MIB,
            cgroups: d.cgroups,
            workspace_mib: 4096,
            workspace_fs: true,
        }
    }
}

impl LimitsConfig {
    /// `workspace_mib` in bytes (`None` for 0: unlimited).
    pub fn workspace_quota(&self) -> Option<u64> {
        (self.workspace_mib > 0).then(|| self.workspace_mib.saturating_mul(MIB))
    }

    /// The kernel limits these keys set, in bytes and seconds (0 becomes
    /// `None`: unlimited).
    pub fn limits(&self) -> ResourceLimits {
        let some = |v: u64| (v > 0).then_some(v);
        ResourceLimits {
            memory_bytes: some(self.memory_mib.saturating_mul(MIB)),
            cpu_seconds_per_cell: some(self.cpu_seconds_per_cell),
            max_processes: some(self.max_processes),
            max_open_files: some(self.max_open_files),
            max_file_size_bytes: some(self.max_file_size_mib.saturating_mul(MIB)),
            cgroups: self.cgroups,
        }
    }

    pub(super) fn validate(&self) -> Result<(), String> {
        if self.memory_mib != 0 && self.memory_mib < 64 {
            return Err(format!(
                "[limits] memory_mib = {} is too small for Python (use at least 64, or 0 for unlimited)",
                self.memory_mib
            ));
        }
        if self.max_open_files != 0 && self.max_open_files < 16 {
            return Err(format!(
                "[limits] max_open_files = {} is too small: the kernel needs at least 16 (or 0 for unlimited)",
                self.max_open_files
            ));
        }
        if self.max_processes != 0 && self.max_processes < 4 {
            return Err(format!(
                "[limits] max_processes = {} is too small: the sandbox needs at least 4 (or 0 for unlimited)",
                self.max_processes
            ));
        }
        Ok(())
    }
}

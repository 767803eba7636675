//! Process facts read from /proc.

use anyhow::{anyhow, Context, Result};

/// Resident set size of `pid` in KiB (`VmRSS` in `/proc/<pid>/status`).
pub fn vm_rss_kib(pid: u32) -> Result<u64> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
        .ok_or_else(|| anyhow!("no VmRSS line in {path}"))
}

/// Proportional set size of `pid` in KiB (`/proc/<pid>/smaps_rollup`).
pub fn pss_kib(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let line = text.lines().find(|l| l.starts_with("Pss:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

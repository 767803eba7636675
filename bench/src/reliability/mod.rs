//! Shared parts of the reliability runs (chaos, load): a real daemon
//! process, a blocking HTTP client, and the chaos run's truth model.

pub mod client;
pub mod daemon;
pub mod model;
pub mod worker;

use std::path::PathBuf;

use anyhow::{Context, Result};

/// The `cellhost` binary: `--cellhost PATH`, else the one built next to
/// this binary (same profile).
pub fn cellhost_bin(arg: Option<PathBuf>) -> Result<PathBuf> {
    match arg {
        Some(p) => Ok(p),
        None => {
            let me = std::env::current_exe()?;
            let bin = me.parent().context("no parent dir")?.join("cellhost");
            anyhow::ensure!(
                bin.exists(),
                "{} is missing: build it (cargo build -p cellhost-cli, same profile) or pass --cellhost PATH",
                bin.display()
            );
            Ok(bin)
        }
    }
}

/// A Prometheus counter's value in `/metrics` text.
pub fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(name)?
                .strip_prefix(' ')?
                .trim()
                .parse::<f64>()
                .ok()
        })
        .map_or(0, |v| v as u64)
}

/// The ids (first line `# <id>`) of every cell in the history at
/// `data_dir`, and the row count. Opened without retention, so reading
/// prunes nothing.
pub fn history_ids(
    data_dir: &std::path::Path,
) -> Result<(std::collections::HashSet<String>, usize)> {
    let config = cellhost::config::HistoryConfig {
        max_rows: 0,
        max_days: 0,
        ..Default::default()
    };
    let history = cellhost::history::History::open(&data_dir.join("history.sqlite"), &config, [])?;
    let rows = history.recent(usize::MAX)?;
    history.close();
    let ids = rows
        .iter()
        .filter_map(|r| Some(r.code.lines().next()?.strip_prefix("# ")?.to_owned()))
        .collect();
    Ok((ids, rows.len()))
}

//! Arguments shared by the single-purpose bench binaries: `--python PATH`
//! (default `$BENCH_PYTHON`, else /usr/bin/python3), `--out FILE`, and
//! whole-number settings from the environment.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};

pub struct Args {
    pub python: PathBuf,
    pub out: PathBuf,
}

/// The command line, with `out` as the default results file.
pub fn parse(out: &str) -> Result<Args> {
    let mut python = std::env::var_os("BENCH_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/python3"));
    let mut out = PathBuf::from(out);
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--python" => python = it.next().context("--python needs a path")?.into(),
            "--out" => out = it.next().context("--out needs a file")?.into(),
            other => bail!("unknown argument {other}; use --python PATH or --out FILE"),
        }
    }
    Ok(Args { python, out })
}

/// `$name` as a whole number, or `default` when unset.
pub fn env_usize(name: &str, default: usize) -> Result<usize> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .with_context(|| format!("{name}={v} is not a whole number")),
        Err(_) => Ok(default),
    }
}

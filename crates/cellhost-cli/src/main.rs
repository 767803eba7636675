//! The `cellhost` command.
//!
//! Exit codes: 0 when everything succeeded, 1 when a cell failed (or a
//! kernel could not start), 2 for usage errors (bad flags, unreadable
//! scripts, a missing interpreter), 130 after a second Ctrl-C.

mod displays;
mod render;
mod run;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "cellhost",
    version,
    about = "Session-persistent Python kernels for AI agents"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a percent-format script (`# %%` cells) cell by cell in one kernel.
    Run(RunArgs),
}

#[derive(clap::Args)]
pub(crate) struct RunArgs {
    /// The script to run, or `-` for standard input.
    pub file: PathBuf,
    /// Print one cell-result JSON object per line instead of text.
    #[arg(long)]
    pub json: bool,
    /// Per-cell timeout in seconds (interrupt first, kill if it does not stop).
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds, allow_hyphen_values = true)]
    pub timeout: Option<std::time::Duration>,
    /// Keep running cells after one fails.
    #[arg(long)]
    pub keep_going: bool,
    /// Python interpreter (default: $CELLHOST_PYTHON, else python3 on PATH).
    #[arg(long, value_name = "PATH")]
    pub python: Option<PathBuf>,
    /// Where live kernels are recorded for crash recovery (default:
    /// $XDG_DATA_HOME/cellhost, else ~/.local/share/cellhost).
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Folder for images the cells display, as cell<N>-<M>.png (default:
    /// <script>_displays next to the script; with --json, only when given).
    #[arg(long, value_name = "DIR")]
    pub display_dir: Option<PathBuf>,
    /// Sandbox profile: `none` (default for `run`: your own script, your
    /// files) or `strict` (bubblewrap: no network, no host files but a
    /// private workspace, unprivileged uid).
    #[arg(long, value_name = "PROFILE")]
    pub sandbox: Option<cellhost::config::Profile>,
    /// Read [sandbox] and [limits] from this cellhost.toml.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

fn parse_seconds(s: &str) -> Result<std::time::Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("`{s}` is not a number of seconds"))?;
    if !(secs > 0.0 && secs.is_finite() && secs < 1e9) {
        return Err(format!(
            "the timeout must be a positive number of seconds, not {s}"
        ));
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cellhost: failed to start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let code = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => run::run(args).await,
        }
    });
    ExitCode::from(code)
}

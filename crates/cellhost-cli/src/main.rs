//! The `cellhost` command.
//!
//! Exit codes: 0 when everything succeeded, 1 when a cell failed (or a
//! kernel could not start, or no server answered), 2 for usage errors (bad
//! flags, unreadable scripts, a missing interpreter, a request the server
//! refused), 130 after a second Ctrl-C.

mod attach;
mod clients;
mod displays;
mod files;
mod http;
mod mcp;
mod render;
mod run;
mod serve;
mod setup;

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
    /// Run the daemon: HTTP API under /v1, metrics, history, dashboard.
    Serve(ServeArgs),
    /// Serve MCP over stdio (for Claude Desktop, Claude Code, Cursor…):
    /// execute_code, interrupt, reset_session, list_kernels.
    Mcp(HostArgs),
    /// Run code in a session of a running daemon, printing output live.
    Exec(ExecArgs),
    /// Watch a session live (read-only): its cells from every client,
    /// output as it comes, results and kernel changes. Ctrl-C detaches
    /// and never interrupts the cell.
    Attach(AttachArgs),
    /// List the daemon's live sessions (kernels).
    Sessions {
        #[command(flatten)]
        client: ClientArgs,
        /// Print the kernel list as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Reset a session: kill its kernels (and its children's).
    Reset {
        #[command(flatten)]
        client: ClientArgs,
        session: String,
    },
    /// Interrupt a session's running cell (KeyboardInterrupt; state kept).
    Interrupt {
        #[command(flatten)]
        client: ClientArgs,
        session: String,
    },
    /// Snapshot a session's live kernel now (docs/snapshots.md): what was
    /// kept, what could not be and why. A daemon that starts after this
    /// one was killed restores it, saying how old it is.
    Snapshot {
        #[command(flatten)]
        client: ClientArgs,
        /// The session.
        #[arg(short, long)]
        session: String,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Fork a session's live kernel into new sessions (docs/snapshots.md):
    /// each starts with a copy of its state and workspace files, and is
    /// independent from then on.
    Fork {
        #[command(flatten)]
        client: ClientArgs,
        /// The session to fork.
        #[arg(short, long)]
        session: String,
        /// A new session (repeat for several; each must not exist yet).
        #[arg(long, required = true)]
        into: Vec<String>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show a session's recorded cells, oldest first.
    History(HistoryArgs),
    /// Copy a file into or out of a session's workspace:
    /// `cellhost cp ./sales.csv s1:data/sales.csv`, `cellhost cp s1:chart.png .`
    Cp {
        #[command(flatten)]
        client: ClientArgs,
        /// A local file, or SESSION:PATH.
        src: String,
        /// SESSION:PATH (a trailing `/` keeps the name), or a local file or dir.
        dst: String,
    },
    /// List a session's workspace (or a directory in it).
    Ls {
        #[command(flatten)]
        client: ClientArgs,
        session: String,
        dir: Option<String>,
        /// Every level (bounded at 10,000 entries).
        #[arg(short, long)]
        recursive: bool,
        #[arg(long)]
        json: bool,
    },
    /// Remove a file from a session's workspace: `cellhost rm s1:old.csv`.
    Rm {
        #[command(flatten)]
        client: ClientArgs,
        /// SESSION:PATH
        target: String,
        /// A directory with everything in it.
        #[arg(short, long)]
        recursive: bool,
    },
}

#[derive(clap::Args)]
pub(crate) struct ServeArgs {
    /// Address to listen on (default: [server] listen, else 127.0.0.1:8787).
    /// A non-loopback address needs CELLHOST_TOKEN.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    #[command(flatten)]
    pub host: HostArgs,
}

/// What `serve` and `mcp` share: the config, data dir, interpreter and
/// sandbox of the kernels they host.
#[derive(clap::Args)]
pub(crate) struct HostArgs {
    /// Read every section from this cellhost.toml.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Where history, live-kernel records and workspaces go (default:
    /// $XDG_DATA_HOME/cellhost, else ~/.local/share/cellhost, else ./.cellhost).
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Python interpreter (default: $CELLHOST_PYTHON, else python3 on PATH).
    #[arg(long, value_name = "PATH")]
    pub python: Option<PathBuf>,
    /// Sandbox profile: `strict` (the default: agents' code) or `none`.
    #[arg(long, value_name = "PROFILE")]
    pub sandbox: Option<cellhost::config::Profile>,
}

/// Where the daemon is.
#[derive(clap::Args)]
pub(crate) struct ClientArgs {
    /// The daemon's URL. The token comes from CELLHOST_TOKEN.
    #[arg(
        long,
        env = "CELLHOST_URL",
        default_value = "http://127.0.0.1:8787",
        value_name = "URL"
    )]
    pub server: String,
}

#[derive(clap::Args)]
pub(crate) struct ExecArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Session to run in (its variables persist between calls).
    #[arg(short, long, default_value = "default")]
    pub session: String,
    /// Restart the session's kernel first (discard its state).
    #[arg(long)]
    pub reset: bool,
    /// Timeout in seconds (interrupt first, kill if it does not stop).
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds, allow_hyphen_values = true)]
    pub timeout: Option<std::time::Duration>,
    /// Print the cell-result JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Folder for images the cell displays, as cell<N>-<M>.png (N the
    /// session's execution count; default ./cellhost_displays, made on
    /// the first image).
    #[arg(long, value_name = "DIR")]
    pub display_dir: Option<PathBuf>,
    /// The code to run, or `-` to read it from standard input.
    pub code: String,
}

#[derive(clap::Args)]
pub(crate) struct AttachArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// The session to watch.
    #[arg(short, long, default_value = "default")]
    pub session: String,
    /// Watch this delegated child of the session instead.
    #[arg(long)]
    pub child: Option<String>,
    /// First replay the session's recorded cells with an execution count
    /// above N (0: all of its current kernel's).
    #[arg(long, value_name = "N")]
    pub since: Option<u64>,
}

#[derive(clap::Args)]
pub(crate) struct HistoryArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    pub session: String,
    /// Most cells shown (the newest ones).
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
    /// Print the history as JSON.
    #[arg(long)]
    pub json: bool,
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
    // Hosts of kernels mount the workspace volumes in a mount namespace of
    // their own, so a host that is killed leaves no mount behind. Before
    // the runtime: a process with threads cannot unshare it.
    if matches!(
        cli.command,
        Command::Serve(_) | Command::Mcp(_) | Command::Run(_)
    ) && nix::unistd::geteuid().is_root()
    {
        if let Err(e) = cellhost::sys::private_mount_namespace() {
            eprintln!(
                "cellhost: warning: no private mount namespace ({e}); workspace volumes \
                 stay mounted if this process is killed (the next start reuses them)"
            );
        }
    }
    // The daemon serves many callers at once; the rest are one-shot.
    // `cellhost mcp` serves one client: one worker thread (and the
    // blocking pool) keeps each call's hand-offs (transport, rmcp's task
    // per request, the cell's task, the kernel's actor) on one thread; with
    // a worker per core every hand-off woke another thread, which doubled
    // MCP − library (docs/benchmarks.md, "MCP").
    let built = match cli.command {
        Command::Serve(_) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(cellhost_server::worker_threads())
            .enable_all()
            .build(),
        Command::Mcp(_) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build(),
        _ => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
    };
    let runtime = match built {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cellhost: failed to start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let mcp = matches!(cli.command, Command::Mcp(_));
    let code = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => run::run(args).await,
            Command::Serve(args) => serve::serve(args).await,
            Command::Mcp(args) => mcp::mcp(args).await,
            Command::Exec(args) => clients::exec(args).await,
            Command::Attach(args) => attach::attach(args).await,
            Command::Sessions { client, json } => clients::sessions(client, json).await,
            Command::Reset { client, session } => clients::reset(client, session).await,
            Command::Interrupt { client, session } => clients::interrupt(client, session).await,
            Command::Snapshot {
                client,
                session,
                json,
            } => clients::snapshot(client, session, json).await,
            Command::Fork {
                client,
                session,
                into,
                json,
            } => clients::fork(client, session, into, json).await,
            Command::History(args) => clients::history(args).await,
            Command::Cp { client, src, dst } => files::cp(client, src, dst).await,
            Command::Ls {
                client,
                session,
                dir,
                recursive,
                json,
            } => files::ls(client, session, dir, recursive, json).await,
            Command::Rm {
                client,
                target,
                recursive,
            } => files::rm(client, target, recursive).await,
        }
    });
    if mcp {
        // The stdin reader may sit in a blocking read when a signal ended
        // `mcp`: do not wait for it.
        runtime.shutdown_timeout(std::time::Duration::from_millis(500));
    }
    ExitCode::from(code)
}

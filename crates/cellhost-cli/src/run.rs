//! `cellhost run`: a percent-format script, cell by cell, in one kernel.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use cellhost::percent::{self, ScriptCell};
use cellhost::registry::{KernelManager, ManagerError, ManagerOptions};
use cellhost::{Cell, KernelError, KernelOptions, SpawnError};

use crate::displays::{default_dir, DisplaySaver, Shown};
use crate::RunArgs;

/// Read the script as UTF-8 text, or say in one line why not.
fn read_script(args: &RunArgs) -> Result<(String, String), String> {
    let (name, bytes) = if args.file.as_os_str() == "-" {
        let mut buf = Vec::new();
        std::io::stdin()
            .read_to_end(&mut buf)
            .map_err(|e| format!("cannot read standard input: {e}"))?;
        ("<stdin>".to_owned(), buf)
    } else {
        let name = args.file.display().to_string();
        if args.file.is_dir() {
            return Err(format!("{name} is a directory, not a script"));
        }
        let bytes = std::fs::read(&args.file).map_err(|e| {
            let why = match e.kind() {
                std::io::ErrorKind::NotFound => "no such file".to_owned(),
                std::io::ErrorKind::PermissionDenied => "permission denied".to_owned(),
                _ => e.to_string(),
            };
            format!("cannot read {name}: {why}")
        })?;
        (name, bytes)
    };
    let text = String::from_utf8(bytes).map_err(|e| {
        format!(
            "{name} is not UTF-8 text (invalid byte at offset {}); save it as UTF-8",
            e.utf8_error().valid_up_to()
        )
    })?;
    Ok((name, text))
}

pub(crate) async fn run(args: RunArgs) -> u8 {
    // Take over SIGINT before anything slow happens, so an early Ctrl-C is
    // handled (it is seen once the kernel exists) instead of killing us.
    let sigint = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cellhost: failed to handle Ctrl-C: {e}");
            return 1;
        }
    };
    let (name, source) = match read_script(&args) {
        Ok(v) => v,
        Err(line) => {
            eprintln!("cellhost: {line}");
            return 2;
        }
    };
    let cells = percent::parse(&source);
    if cells.is_empty() {
        eprintln!("cellhost: {name} has no code to run (it is empty or only blank lines and markdown cells)");
        return 2;
    }
    let config = match &args.config {
        Some(path) => match cellhost::config::Config::load(path) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("cellhost: {}", cellhost::error_chain(&e));
                return 2;
            }
        },
        None => cellhost::config::Config::default(),
    };
    let sandbox = config
        .sandbox
        .sandbox(args.sandbox, cellhost::config::Profile::None);
    let opts = KernelOptions {
        python: args.python.clone(),
        // Unsandboxed, the script runs where the user is (the manager
        // would otherwise give it a workspace under the data dir).
        cwd: if sandbox.is_strict() {
            None
        } else {
            std::env::current_dir().ok()
        },
        default_timeout: args.timeout,
        // `run` executes the operator's own script: no sandbox unless asked.
        sandbox,
        limits: config.limits.limits(),
        packages: cellhost::packages::PackageOptions {
            policy: std::sync::Arc::new(config.packages.clone()),
            ..Default::default()
        },
        ..KernelOptions::default()
    };
    // Checked up front so a missing interpreter is a usage error (exit 2)
    // before any kernel starts.
    if let Err(e) = cellhost::Interpreter::resolve(opts.python.as_deref()) {
        eprintln!("cellhost: {e}");
        return 2;
    }
    // A manager of one kernel: it records the kernel under the data dir and
    // reaps what a crashed earlier run left there.
    let data_dir = args
        .data_dir
        .clone()
        .unwrap_or_else(cellhost::registry::default_data_dir);
    let manager = KernelManager::start(
        ManagerOptions::new(data_dir)
            .kernel(opts)
            .max_kernels(1)
            .warm_pool(0)
            .idle_timeout(None)
            // One kernel: a warm template would be a second process that
            // forks it once.
            .templates(false)
            // [backends.*] and default_backend: the script may run remotely.
            .remote(&config),
    )
    .await;
    let interrupted = Arc::new(AtomicBool::new(false));
    let presses = Arc::new(AtomicUsize::new(0));
    let ctrl_c = tokio::spawn(forward_ctrl_c(
        sigint,
        manager.clone(),
        interrupted.clone(),
        presses,
    ));
    let term = tokio::spawn(shutdown_on_sigterm(manager.clone()));
    let code = run_cells(&manager, &cells, &args, &interrupted).await;
    ctrl_c.abort();
    term.abort();
    manager.shutdown().await;
    code
}

/// The owner of `cellhost run`'s one kernel.
const OWNER: &str = "run";

async fn run_cells(
    manager: &KernelManager,
    cells: &[ScriptCell],
    args: &RunArgs,
    interrupted: &AtomicBool,
) -> u8 {
    let mut failed = false;
    let mut stdout = std::io::stdout().lock();
    // Images go to files; with --json only when a folder was asked for
    // (the JSON carries them anyway).
    let mut saver = match (&args.display_dir, args.json) {
        (Some(dir), _) => Some(DisplaySaver::new(dir.clone())),
        (None, false) => Some(DisplaySaver::new(default_dir(&args.file))),
        (None, true) => None,
    };
    for cell in cells {
        if !args.json {
            let header = crate::render::cell_header(cell);
            if stdout
                .write_all(header.as_bytes())
                .and_then(|()| stdout.flush())
                .is_err()
            {
                return u8::from(failed);
            }
        }
        let result = match manager.execute(OWNER, Cell::new(cell.code.clone())).await {
            Ok(r) => r,
            Err(ManagerError::Kernel(KernelError::Spawn(
                e @ (SpawnError::Interpreter(_)
                | SpawnError::TooOld { .. }
                | SpawnError::Sandbox(_)),
            ))) => {
                eprintln!("cellhost: {}", cellhost::error_chain(&e));
                return 2;
            }
            Err(e) => {
                eprintln!(
                    "cellhost: cell {} (line {}): {}",
                    cell.index,
                    cell.line,
                    cellhost::error_chain(&e)
                );
                return 1;
            }
        };
        let shown = match saver.as_mut() {
            Some(s) => s.save(cell.index, &result),
            None => Vec::new(),
        };
        for failure in shown.iter().filter_map(|s| match s {
            Shown::Failed(why) => Some(why),
            _ => None,
        }) {
            failed = true;
            if args.json {
                eprintln!(
                    "cellhost: cell {} (line {}): {failure}",
                    cell.index, cell.line
                );
            }
        }
        let text = if args.json {
            let mut line = serde_json::to_string(&result).expect("a cell result serializes");
            line.push('\n');
            line
        } else {
            crate::render::cell_body(&result, &shown)
        };
        // A closed stdout (e.g. `| head`) ends the run quietly.
        if stdout
            .write_all(text.as_bytes())
            .and_then(|()| stdout.flush())
            .is_err()
        {
            return u8::from(failed);
        }
        if !result.is_success() {
            failed = true;
            if !args.keep_going || interrupted.load(Ordering::Relaxed) {
                break;
            }
        }
        if interrupted.load(Ordering::Relaxed) {
            break;
        }
    }
    u8::from(failed)
}

/// Ctrl-C interrupts the running cell (the run stops after it); a second
/// Ctrl-C kills the kernel and exits at once.
async fn forward_ctrl_c(
    mut sigint: tokio::signal::unix::Signal,
    manager: KernelManager,
    interrupted: Arc<AtomicBool>,
    presses: Arc<AtomicUsize>,
) {
    loop {
        if sigint.recv().await.is_none() {
            return;
        }
        interrupted.store(true, Ordering::Relaxed);
        if presses.fetch_add(1, Ordering::Relaxed) == 0 {
            eprintln!("\ncellhost: interrupting the running cell (Ctrl-C again to kill the kernel and quit)");
            manager.interrupt(OWNER).await;
        } else {
            manager.shutdown().await;
            std::process::exit(130);
        }
    }
}

/// SIGTERM kills the kernel (and waits for it) before exiting.
async fn shutdown_on_sigterm(manager: KernelManager) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        return;
    };
    if term.recv().await.is_some() {
        manager.shutdown().await;
        std::process::exit(143);
    }
}

//! Timeouts and interrupts: SIGINT first, kill only when needed.
mod common;

use std::time::{Duration, Instant};

use cellhost::{Cell, Status};
use common::*;

#[tokio::test]
async fn a_timed_out_cell_that_settles_keeps_the_kernel_and_its_state() {
    let k = kernel().await;
    k.run("x = 'kept'").await;
    let pid = k.kernel.pid();
    let t = Instant::now();
    let r = k
        .run_cell(Cell::new("import time\ntime.sleep(30)").timeout(Duration::from_millis(300)))
        .await;
    assert!(t.elapsed() < Duration::from_secs(5));
    assert_eq!(r.status, Status::Timeout);
    assert!(!r.kernel.state_lost);
    assert!(
        r.error.as_deref().unwrap().contains("state were kept"),
        "{r:?}"
    );
    assert!(r.traceback.as_deref().unwrap().contains("time.sleep(30)"));
    let r = k.run("x").await;
    assert_eq!(r.value.as_deref(), Some("'kept'"));
    assert_eq!(k.kernel.pid(), pid, "same process");
    assert!(r.kernel.reused);
}

#[tokio::test]
async fn a_cell_that_ignores_sigint_is_killed_and_state_is_lost() {
    let k = kernel().await;
    k.run("x = 1").await;
    let pid = k.kernel.pid().unwrap();
    let code = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(30)";
    let t = Instant::now();
    let r = k
        .run_cell(Cell::new(code).timeout(Duration::from_millis(300)))
        .await;
    assert!(t.elapsed() < Duration::from_secs(6), "{:?}", t.elapsed());
    assert_eq!(r.status, Status::Timeout);
    assert!(r.kernel.state_lost);
    assert!(r.kernel.note.as_deref().unwrap().contains("state was lost"));
    assert!(wait_gone(pid, Duration::from_secs(2)));
    let r = k.run("'x' in globals()").await;
    assert_eq!(r.value.as_deref(), Some("False"));
    assert!(!r.kernel.reused);
}

#[tokio::test]
async fn a_cell_that_swallows_keyboard_interrupt_is_killed_after_the_grace() {
    let k = kernel().await;
    let code = "import time\nwhile True:\n    try:\n        time.sleep(10)\n    except KeyboardInterrupt:\n        pass";
    let r = k
        .run_cell(Cell::new(code).timeout(Duration::from_millis(200)))
        .await;
    assert_eq!(r.status, Status::Timeout);
    assert!(r.kernel.state_lost);
}

#[tokio::test]
async fn interrupt_stops_a_running_cell_and_keeps_state() {
    let k = kernel().await;
    k.run("x = 5").await;
    let kernel = k.kernel.clone();
    let running = tokio::spawn(async move {
        kernel
            .execute(Cell::new(
                "import time\nfor i in range(300):\n    time.sleep(0.1)",
            ))
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(k.kernel.interrupt().await.unwrap(), "a cell was running");
    let r = running.await.unwrap().unwrap();
    assert_eq!(r.status, Status::Interrupted);
    assert_eq!(r.error.as_deref(), Some("KeyboardInterrupt"));
    assert!(!r.kernel.state_lost);
    assert_eq!(k.run("x").await.value.as_deref(), Some("5"));
}

#[tokio::test]
async fn interrupting_an_idle_kernel_is_a_no_op() {
    let k = kernel().await;
    k.run("x = 5").await;
    assert!(!k.kernel.interrupt().await.unwrap());
    assert_eq!(k.run("x").await.value.as_deref(), Some("5"));
}

#[tokio::test]
async fn a_cpu_bound_cell_is_interrupted_too() {
    let k = kernel().await;
    let r = k
        .run_cell(Cell::new("n = 0\nwhile True:\n    n += 1").timeout(Duration::from_millis(300)))
        .await;
    assert_eq!(r.status, Status::Timeout);
    assert!(!r.kernel.state_lost);
    assert_eq!(k.run("n > 0").await.value.as_deref(), Some("True"));
}

#[tokio::test]
async fn a_timeout_also_interrupts_a_waiting_subprocess() {
    let k = kernel().await;
    let r = k
        .run_cell(
            Cell::new("import subprocess\nsubprocess.run(['sleep', '30'])")
                .timeout(Duration::from_millis(300)),
        )
        .await;
    assert_eq!(r.status, Status::Timeout);
    assert!(!r.kernel.state_lost, "{r:?}");
}

#[tokio::test]
async fn a_cell_flooding_its_output_still_times_out() {
    let k = kernel().await;
    let t = Instant::now();
    let r = k
        .run_cell(
            Cell::new("import os\nwhile True:\n    os.write(1, b'y' * 65536)")
                .timeout(Duration::from_millis(500)),
        )
        .await;
    assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());
    assert_eq!(r.status, Status::Timeout);
    assert!(r.truncated.stdout);
    assert!(!r.kernel.state_lost, "{r:?}");
}

/// A traceback holds the cell's frames and the exception, never the
/// runner's SIGINT handler that raised it.
fn assert_user_frames_only(tb: &str) {
    assert!(tb.contains("<cell-") && tb.contains("in wait"), "{tb}");
    assert!(
        !tb.contains("runner.py") && !tb.contains("_on_sigint"),
        "runner frames in the traceback:\n{tb}"
    );
    assert!(tb.trim_end().ends_with("KeyboardInterrupt"), "{tb}");
}

const WAITING: &str =
    "import time\ndef wait():\n    for i in range(300):\n        time.sleep(0.1)\nwait()";

#[tokio::test]
async fn a_timed_out_cells_traceback_shows_only_user_frames() {
    let k = kernel().await;
    let r = k
        .run_cell(Cell::new(WAITING).timeout(Duration::from_millis(300)))
        .await;
    assert_eq!(r.status, Status::Timeout);
    assert_user_frames_only(r.traceback.as_deref().unwrap());
}

#[tokio::test]
async fn an_interrupted_cells_traceback_shows_only_user_frames() {
    let k = kernel().await;
    let kernel = k.kernel.clone();
    let running = tokio::spawn(async move { kernel.execute(Cell::new(WAITING)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(k.kernel.interrupt().await.unwrap());
    let r = running.await.unwrap().unwrap();
    assert_eq!(r.status, Status::Interrupted);
    assert_user_frames_only(r.traceback.as_deref().unwrap());
}

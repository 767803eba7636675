//! Edge cases: hostile or unusual cells, spill files, the working dir.
mod common;

use std::time::{Duration, Instant};

use cellhost::{Cell, Status};
use common::*;

#[tokio::test]
async fn a_reset_cell_that_fails_still_reports_the_reset() {
    let k = kernel().await;
    k.run("x = 1").await;
    let r = k.run_cell(Cell::new("x").reset(true)).await;
    assert_eq!(r.status, Status::Error);
    assert!(r.error.unwrap().starts_with("NameError"));
    assert!(r.kernel.state_reset);
    assert!(!r.kernel.reused);
}

#[tokio::test]
async fn the_cell_after_an_exception_reuses_the_kernel() {
    let k = kernel().await;
    k.run("raise ValueError('no')").await;
    assert!(k.run("1").await.kernel.reused);
}

#[tokio::test]
async fn control_fds_never_leak_into_subprocesses() {
    let k = kernel().await;
    let r = k
        .run("import subprocess, sys\nsubprocess.run([sys.executable, '-c', 'import os; print(sorted(int(f) for f in os.listdir(\"/proc/self/fd\")))'], capture_output=True, text=True).stdout.strip()")
        .await;
    // 0, 1, 2 and the fd listdir itself opens; nothing of ours.
    assert_eq!(r.value.as_deref(), Some("'[0, 1, 2, 3]'"), "{r:?}");
}

#[tokio::test]
async fn sys_exit_with_a_message_prints_it_and_ends_the_kernel() {
    let k = kernel().await;
    let r = k.run("import sys; sys.exit('bye')").await;
    assert_eq!(r.status, Status::Error);
    assert_eq!(r.error.as_deref(), Some("SystemExit: bye"));
    assert_eq!(r.stderr, "bye\n");
    assert!(r.kernel.ended);
    let r = k.run("1").await;
    assert!(!r.kernel.reused);
    assert!(r.kernel.note.unwrap().contains("fresh kernel"));
}

#[tokio::test]
async fn the_spill_file_is_cleaned_like_the_inline_output() {
    let k = kernel_with_env(&[("DEPLOY_SECRET", "hunter2-very-secret-value")], &[]).await;
    let r = k
        .run("print('x' * 200_000)\nprint('\\x1b[31mhunter2-very-secret-value\\x1b[0m')")
        .await;
    assert!(r.truncated.stdout);
    let spill = std::fs::read_to_string(r.truncated.spill_path.unwrap()).unwrap();
    assert!(spill.contains(&"x".repeat(200_000)));
    assert!(!spill.contains("hunter2-very-secret-value"));
    assert!(spill.contains("REDACTED"));
    assert!(!spill.contains('\x1b'));
    assert!(!r.stdout.contains("hunter2-very-secret-value"));
}

#[tokio::test]
async fn the_spill_file_survives_a_kernel_that_exits_in_the_same_cell() {
    let k = kernel().await;
    let r = k.run("print('y' * 200_000)\nimport sys; sys.exit(0)").await;
    assert!(r.kernel.ended);
    let spill = r.truncated.spill_path.expect("spilled");
    let text = std::fs::read_to_string(&spill).unwrap();
    assert!(text.contains(&"y".repeat(200_000)));
}

#[tokio::test]
async fn a_planted_symlink_at_the_spill_path_is_not_followed() {
    let k = kernel().await;
    let r = k.run("1").await;
    let victim = k.dir.path().join("victim.txt");
    std::fs::write(&victim, "precious").unwrap();
    let next = k.dir.path().join("spill").join(format!(
        "{}-cell-{}.txt",
        r.kernel.id,
        r.kernel.execution_count + 1
    ));
    std::os::unix::fs::symlink(&victim, &next).unwrap();
    let r = k.run("print('z' * 200_000)").await;
    assert!(r.truncated.stdout);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    let meta = std::fs::symlink_metadata(r.truncated.spill_path.unwrap()).unwrap();
    assert!(meta.file_type().is_file());
}

#[tokio::test]
async fn garbage_on_the_reply_fd_kills_the_kernel_promptly_without_a_huge_allocation() {
    let k = kernel().await;
    let before = self_rss();
    let t = Instant::now();
    let r = k
        .run("import os\nos.write(4, (2**31 - 1).to_bytes(4, 'little'))\nimport time; time.sleep(30)")
        .await;
    assert!(t.elapsed() < Duration::from_secs(5));
    assert_eq!(r.status, Status::Error);
    assert!(r.error.unwrap().contains("KernelProtocolError"));
    assert!(r.kernel.state_lost);
    assert!(self_rss().saturating_sub(before) < 64 << 20);
    assert_eq!(k.run("2").await.value.as_deref(), Some("2"));
}

#[tokio::test]
async fn a_cell_that_closes_the_control_fds_gets_a_prompt_clear_result() {
    let k = kernel().await;
    let t = Instant::now();
    let r = k.run("import os\nos.closerange(3, 64)").await;
    assert!(t.elapsed() < Duration::from_secs(5));
    assert_eq!(r.status, Status::Error);
    assert!(r.kernel.state_lost);
    assert!(r.kernel.note.is_some());
    assert_eq!(k.run("3").await.value.as_deref(), Some("3"));
}

#[tokio::test]
async fn a_huge_value_is_capped() {
    let k = kernel().await;
    let r = k.run("'a' * 5_000_000").await;
    let v = r.value.unwrap();
    assert!(v.len() <= 51_000, "{}", v.len());
    assert!(v.contains("bytes cut"));
}

#[tokio::test]
async fn the_working_dir_is_importable_like_an_interactive_session() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    std::fs::write(work.join("helper_mod.py"), "VALUE = 'from cwd'\n").unwrap();
    let opts = options(&dir).cwd(&work);
    let k = kernel_with(opts, dir).await;
    let r = k
        .run("import os, sys, helper_mod\n(os.getcwd(), sys.path[0], helper_mod.VALUE)")
        .await;
    assert_eq!(
        r.value.unwrap(),
        format!("({:?}, '', 'from cwd')", work.display().to_string()).replace('"', "'")
    );
}

#[tokio::test]
async fn the_runner_is_not_visible_as_a_module_or_in_globals() {
    let k = kernel().await;
    let r = k
        .run("sorted(k for k in globals() if not k.startswith('__'))")
        .await;
    assert_eq!(r.value.as_deref(), Some("[]"));
}

/// A runtime dir another user owns (a pre-created `/tmp/cellhost-<uid>`)
/// could let them swap the staging dir: spawning refuses it, clearly.
#[tokio::test]
async fn a_runtime_dir_owned_by_another_user_is_refused() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test makes a dir owned by another user: run it as root (CI does)"
    );
    let dir = tempfile::tempdir().unwrap();
    let theirs = dir.path().join("cellhost-0");
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    let opts = cellhost::KernelOptions::default().runtime_dir(&theirs);
    let err = cellhost::error_chain(&cellhost::Kernel::spawn(opts).await.unwrap_err());
    assert!(err.contains("belongs to another user"), "{err}");
}

//! The output pipeline end to end: every writer lands in the result,
//! cleaned and bounded.
mod common;

use cellhost::Status;
use common::*;

#[tokio::test]
async fn print_os_write_c_code_and_subprocesses_all_land_in_order() {
    let k = kernel().await;
    let code = r#"
import os, subprocess, ctypes
print("one")
os.write(1, b"two\n")
ctypes.CDLL(None).printf(b"three\n")
ctypes.CDLL(None).fflush(None)
subprocess.run(["echo", "four"])
os.system("echo five")
print("six", flush=False)
"#;
    let r = k.run(code).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(r.stdout, "one\ntwo\nthree\nfour\nfive\nsix\n");
}

#[tokio::test]
async fn c_stdio_left_in_its_buffer_is_flushed_at_the_end_of_the_cell() {
    let k = kernel().await;
    let r = k
        .run("import ctypes\nctypes.CDLL(None).printf(b'from C\\n')")
        .await;
    assert!(r.stdout.contains("from C"), "{r:?}");
}

#[tokio::test]
async fn stderr_is_captured_separately() {
    let k = kernel().await;
    let r = k.run("import sys, subprocess\nprint('out')\nprint('err', file=sys.stderr)\nsubprocess.run('echo sub-err >&2', shell=True)").await;
    assert_eq!(r.stdout, "out\n");
    assert_eq!(r.stderr, "err\nsub-err\n");
}

#[tokio::test]
async fn invalid_utf8_and_nul_bytes_are_decoded_lossily() {
    let k = kernel().await;
    let r = k
        .run("import os\nos.write(1, b'a\\xff\\xfeb\\x00c\\n')")
        .await;
    assert_eq!(r.stdout, "a\u{fffd}\u{fffd}b\u{0}c\n");
}

#[tokio::test]
async fn ansi_escapes_are_stripped() {
    let k = kernel().await;
    let r = k
        .run(r"print('\x1b[31mred\x1b[0m \x1b]0;title\x07plain')")
        .await;
    assert_eq!(r.stdout, "red plain\n");
}

#[tokio::test]
async fn output_that_imitates_control_frames_is_just_text() {
    let k = kernel().await;
    let code = r#"
import os
fake = b"op 4\ndonestatus 2\nok"
os.write(1, len(fake).to_bytes(4, "little") + fake)
os.write(2, len(fake).to_bytes(4, "little") + fake)
print()
x = 3
"#;
    let r = k.run(code).await;
    assert_eq!(r.status, Status::Success);
    assert!(r.stdout.contains("donestatus"), "{:?}", r.stdout);
    assert_eq!(k.run("x").await.value.as_deref(), Some("3"));
}

#[tokio::test]
async fn a_cell_that_closes_fd_1_does_not_break_later_cells() {
    let k = kernel().await;
    let r = k
        .run("import os\nprint('before', flush=True)\nos.close(1)")
        .await;
    assert_eq!(r.stdout, "before\n");
    let r = k
        .run("import os\nprint('after')\nos.write(1, b'raw\\n')")
        .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(r.stdout, "after\nraw\n");
}

#[tokio::test]
async fn a_cell_that_redirects_fds_or_replaces_sys_stdout_does_not_break_later_cells() {
    let k = kernel().await;
    k.run("import os, sys, io\nfd = os.open(os.devnull, os.O_WRONLY)\nos.dup2(fd, 1)\nos.dup2(fd, 2)\nsys.stdout = io.StringIO()\nsys.stderr = object()").await;
    let r = k
        .run("import sys\nprint('visible')\nprint('err', file=sys.stderr)")
        .await;
    assert_eq!(r.stdout, "visible\n");
    assert_eq!(r.stderr, "err\n");
    k.run("import sys\nsys.stdout.close()").await;
    let r = k.run("print('again')").await;
    assert_eq!(r.stdout, "again\n");
}

#[tokio::test]
async fn output_from_a_thread_after_its_cell_ended_goes_to_the_next_cell() {
    let k = kernel().await;
    let r = k
        .run("import threading, time\nthreading.Thread(target=lambda: (time.sleep(0.3), print('late'))).start()")
        .await;
    assert_eq!(r.stdout, "");
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    let r = k.run("print('now')").await;
    assert_eq!(r.stdout, "late\nnow\n");
}

#[tokio::test]
async fn a_flood_of_output_is_cut_spilled_and_keeps_host_memory_bounded() {
    let k = kernel().await;
    let before = self_rss();
    // 100 MB through fd 1 from a C-level writer.
    let r = k
        .run("import os\nchunk = b'x' * 99 + b'\\n'\nfor _ in range(1_000_000):\n    os.write(1, chunk)\nprint('END')")
        .await;
    let grown = self_rss().saturating_sub(before);
    assert_eq!(r.status, Status::Success);
    assert!(r.truncated.stdout);
    assert!(!r.truncated.stderr);
    assert!(r.stdout.len() <= 50_000 + 200, "{}", r.stdout.len());
    assert!(r.stdout.contains("bytes cut"), "marker present");
    assert!(r.stdout.trim_end().ends_with("END"));
    let spill = r.truncated.spill_path.expect("spilled");
    let meta = std::fs::metadata(&spill).unwrap();
    assert!(
        meta.len() >= 5_000_000 && meta.len() <= 5_300_000,
        "{}",
        meta.len()
    );
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert!(
        !spill.starts_with(k.dir.path().join("kernels").to_str().unwrap()),
        "spill outlives the kernel"
    );
    assert!(grown < 64 << 20, "host RSS grew by {grown} bytes");
}

#[tokio::test]
async fn secrets_never_reach_the_child_and_are_redacted_from_output() {
    let k = kernel_with_env(&[("MY_SERVICE_TOKEN", "hunter2-very-secret-value")], &[]).await;
    let r = k
        .run("import os\nsorted(k for k in os.environ if 'TOKEN' in k)")
        .await;
    assert_eq!(r.value.as_deref(), Some("[]"));
    let r = k
        .run("print('leak: hunter2-very-secret-value')\nprint('aws AKIAIOSFODNN7EXAMPLE')\n'hunter2-very-secret-value'")
        .await;
    assert!(
        !r.stdout.contains("hunter2-very-secret-value"),
        "{}",
        r.stdout
    );
    assert!(!r.stdout.contains("AKIAIOSFODNN7EXAMPLE"), "{}", r.stdout);
    assert!(r.stdout.contains("REDACTED"));
    assert!(!r.value.unwrap().contains("hunter2-very-secret-value"));
}

#[tokio::test]
async fn the_child_environment_is_allow_listed() {
    let k = kernel_with_env(
        &[
            ("HOME", "/home/someone"),
            ("LANG", "C.UTF-8"),
            ("LD_PRELOAD", "/nope.so"),
            ("RANDOM_SETTING", "1"),
        ],
        &["RANDOM_SETTING".into()],
    )
    .await;
    let r = k.run("import os\nsorted(os.environ)").await;
    assert_eq!(
        r.value.as_deref(),
        Some("['HOME', 'LANG', 'PATH', 'RANDOM_SETTING']"),
        "{r:?}"
    );
}

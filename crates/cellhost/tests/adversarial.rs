//! Hostile cells the other kernel tests do not already cover: each gets a
//! truthful result, later cells still work, and the host's memory stays
//! bounded (RSS read from /proc/self before and after).

mod common;

use std::time::Duration;

use cellhost::{Cell, Status};
use common::{kernel, self_rss};

#[tokio::test]
async fn a_gigabyte_of_output_is_cut_and_keeps_host_memory_bounded() {
    let k = kernel().await;
    let before = self_rss();
    let r = k
        .run("import os\nchunk = b'z' * 1023 + b'\\n'\nfor _ in range(1 << 20):\n    os.write(1, chunk)\nprint('END')")
        .await;
    let grown = self_rss().saturating_sub(before);
    assert_eq!(r.status, Status::Success, "{:?}", r.error);
    assert!(r.truncated.stdout && r.stdout.len() <= 50_200);
    assert!(r.stdout.trim_end().ends_with("END"));
    assert!(
        grown < 64 << 20,
        "host RSS grew by {grown} bytes for 1 GiB of output"
    );
    assert_eq!(k.run("1 + 1").await.value.as_deref(), Some("2"));
}

#[tokio::test]
async fn a_ten_megabyte_single_line_is_cut_with_head_and_tail() {
    let k = kernel().await;
    let before = self_rss();
    let r = k.run("print('a' + 'b' * 10_000_000 + 'c')").await;
    let grown = self_rss().saturating_sub(before);
    assert_eq!(r.status, Status::Success);
    assert!(r.truncated.stdout);
    assert!(r.stdout.starts_with("ab") && r.stdout.trim_end().ends_with("bc"));
    assert!(grown < 64 << 20, "host RSS grew by {grown} bytes");
}

#[tokio::test]
async fn a_kernel_that_stops_itself_is_killed_at_the_timeout_and_says_so() {
    let k = kernel().await;
    k.run("x = 1").await;
    let r = k
        .run_cell(
            Cell::new("import os, signal\nos.kill(os.getpid(), signal.SIGSTOP)")
                .timeout(Duration::from_millis(500)),
        )
        .await;
    assert_eq!(r.status, Status::Timeout, "{:?}", r.error);
    assert!(
        r.kernel.state_lost,
        "a stopped kernel cannot take SIGINT: {:?}",
        r.kernel
    );
    let next = k.run("'x' in globals()").await;
    assert_eq!(next.value.as_deref(), Some("False"));
}

#[tokio::test]
async fn a_daemonized_grandchild_dies_with_its_kernel() {
    let k = kernel().await;
    let code = "import os, time, tempfile\np = tempfile.mktemp(suffix='.pid')\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        open(p, 'w').write(str(os.getpid()))\n        time.sleep(120)\n    os._exit(0)\nwhile not os.path.exists(p) or not open(p).read():\n    time.sleep(0.01)\ngc = int(open(p).read())\nos.remove(p)\ngc";
    let r = k.run(code).await;
    assert_eq!(r.status, Status::Success, "{:?}", r.error);
    let pid: u32 = r.value.unwrap().parse().unwrap();
    assert!(common::pid_alive(pid));
    k.kernel.shutdown().await;
    assert!(
        common::wait_gone(pid, Duration::from_secs(5)),
        "grandchild {pid} outlived its kernel"
    );
}

#[tokio::test]
async fn ten_thousand_cells_in_one_session_keep_state_and_memory() {
    let k = kernel().await;
    k.run("n = 0").await;
    let before = self_rss();
    for i in 1..=10_000u32 {
        let r = k.run("n += 1").await;
        assert_eq!(r.status, Status::Success, "cell {i}: {:?}", r.error);
    }
    let r = k.run("n").await;
    assert_eq!(r.value.as_deref(), Some("10000"));
    assert_eq!(r.kernel.execution_count, 10_002);
    let grown = self_rss().saturating_sub(before);
    assert!(
        grown < 32 << 20,
        "host RSS grew by {grown} bytes over 10,000 cells"
    );
}

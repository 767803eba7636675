//! The agent's dialect on a remote kernel (real OpenSSH on 127.0.0.1,
//! started by scripts/test): the dialect's files are shipped with the
//! runner, so `!cmd`, `x = !cmd`, `%%bash` and the hints work there too.

mod common;

use cellhost::Status;
use common::remote::{remote_manager, ssh};

#[tokio::test]
async fn bang_commands_magics_and_hints_work_on_a_remote_kernel() {
    let m = remote_manager("box", ssh(), |o| o).await;
    let r = m
        .run(
            "s",
            "n = 2\n!echo remote {n + 1}\nlines = !printf 'a\\nb\\n'\nlines",
        )
        .await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(r.stdout, "remote 3\n", "{r:?}");
    assert_eq!(r.value.as_deref(), Some("['a', 'b']"), "{r:?}");
    let r = m.run("s", "%%sh\necho from-sh >&2\nexit 2").await;
    assert_eq!(r.stderr, "from-sh\n", "{r:?}");
    assert_eq!(m.run("s", "_exit_code").await.value.as_deref(), Some("2"));
    let r = m.run("s", "import no_such_remote_module_x").await;
    assert!(
        r.hint
            .as_deref()
            .unwrap_or("")
            .contains("%pip install no_such_remote_module_x"),
        "{r:?}"
    );
    let r = m.run("s", "%bogus").await;
    assert!(
        r.error
            .as_deref()
            .unwrap_or("")
            .contains("unsupported magic %bogus"),
        "{r:?}"
    );
    m.manager.shutdown().await;
}

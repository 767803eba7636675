//! `%pip` on a remote kernel (the real sshd on 127.0.0.1): pip runs on
//! the remote side into the remote session's package dir, beside its
//! workspace and on the runner's sys.path, under the host's `[packages]`
//! policy, from the local index the test serves on loopback (which the
//! loopback sshd reaches; the docker test container has no network, and
//! the netns hosts do not reach the host's loopback, so only ssh on
//! 127.0.0.1 is tested).

mod common;

use cellhost::packages::PackageOptions;
use cellhost::{CellResult, Status};
use common::index;
use common::remote::{env, remote_manager, ssh, ssh_sh};

fn ok(r: &CellResult) {
    assert_eq!(r.status, Status::Success, "{r:#?}");
}

#[tokio::test]
async fn pip_install_on_a_remote_kernel_imports_on_the_next_line_and_uninstall_removes_it() {
    let idx = index::serve();
    let policy = index::policy(&idx, "deny = [\"evil*\"]\n");
    let m = remote_manager("box", ssh(), move |o| {
        let mut k = o.kernel.clone();
        k.packages = PackageOptions {
            policy,
            ..PackageOptions::default()
        };
        o.kernel(k)
    })
    .await;
    let r = m
        .run(
            "s",
            "%pip install tinypkg\nimport tinypkg\n(tinypkg.VALUE, tinypkg.__file__)",
        )
        .await;
    ok(&r);
    let v = r.value.clone().unwrap_or_default();
    assert!(
        v.starts_with("(42, '") && v.contains("/pkgs/tinypkg/__init__.py"),
        "{v}"
    );
    assert!(
        r.stdout.contains("Successfully installed tinypkg"),
        "pip's output streams into the cell: {r:?}"
    );
    let file = v.split('\'').nth(1).unwrap().to_owned();
    assert!(
        file.contains("cellhost-ws-"),
        "beside the session's workspace: {file}"
    );
    assert!(
        ssh_sh(
            &env("CELLHOST_TEST_SSH_HOST"),
            &format!("test -f '{file}' && echo yes")
        )
        .trim()
            == "yes"
    );

    // Refused by the policy, with the rule that refused.
    let r = m.run("s", "%pip install evilpkg").await;
    assert!(
        r.error.as_deref().unwrap_or("").contains("deny pattern"),
        "{r:?}"
    );
    let r = m
        .run("s", "%pip install --index-url http://x/ tinydep")
        .await;
    assert!(
        r.error.as_deref().unwrap_or("").contains("is not allowed"),
        "{r:?}"
    );
    let r = m.run("s", "%pip install sdistpkg").await;
    assert!(
        r.error.as_deref().unwrap_or("").contains("only_binary"),
        "{r:?}"
    );

    // A fresh runner (state lost) still finds the package.
    let pid = m.run("s", "1").await.kernel.pid.unwrap();
    ssh_sh(&env("CELLHOST_TEST_SSH_HOST"), &format!("kill -9 {pid}"));
    let r = m.run("s", "import tinypkg; tinypkg.VALUE").await;
    assert!(r.kernel.state_lost);
    assert_eq!(r.value.as_deref(), Some("42"), "{r:?}");

    // Uninstall removes it; another session never saw it.
    let r = m.run("other", "import tinypkg").await;
    assert!(r.error.unwrap_or_default().contains("ModuleNotFoundError"));
    let r = m.run("s", "%pip uninstall -y tinypkg").await;
    ok(&r);
    assert!(
        r.stdout.contains("Successfully uninstalled tinypkg"),
        "{r:?}"
    );
    let r = m
        .run("s", "import sys\nfor k in [k for k in sys.modules if k.startswith('tinypkg')]: del sys.modules[k]\nimport tinypkg")
        .await;
    assert!(
        r.error.unwrap_or_default().contains("ModuleNotFoundError"),
        "uninstalled"
    );
    assert!(
        ssh_sh(
            &env("CELLHOST_TEST_SSH_HOST"),
            &format!("test -e '{file}' && echo there || echo gone")
        )
        .trim()
            == "gone"
    );
    m.manager.shutdown().await;
}

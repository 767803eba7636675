//! A transport drop mid-cell (the veth link of a netns ssh host taken
//! down, real sshd, started by scripts/test) is reported honestly, and the
//! cell is never run twice.

mod common;

use std::process::Command;
use std::time::Duration;

use cellhost::config::BackendConfig;
use cellhost::{Cell, Status};
use common::remote::{env, remote_manager, ssh_config};

/// Puts the link back up however the test ends.
struct LinkDown(String);

impl LinkDown {
    fn take(veth: &str) -> LinkDown {
        let ok = Command::new("ip")
            .args(["link", "set", veth, "down"])
            .status()
            .unwrap();
        assert!(ok.success(), "ip link set {veth} down");
        LinkDown(veth.to_owned())
    }
}

impl Drop for LinkDown {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "set", &self.0, "up"])
            .status();
    }
}

#[tokio::test]
async fn a_transport_drop_mid_cell_is_reported_and_the_cell_never_runs_twice() {
    let host = env("CELLHOST_TEST_SSH_DROP_HOST");
    let veth = env("CELLHOST_TEST_DROP_VETH");
    let mut c = ssh_config(&[&host]);
    c.transport_timeout_seconds = Some(2.0);
    let m = remote_manager("far", BackendConfig::Ssh(c), |o| o).await;
    let marks = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        marks.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let mark = marks.path().join("ran");
    assert_eq!(m.run("s", "x = 1").await.status, Status::Success);

    let code = format!(
        "open({:?}, 'a').write('ran\\n')\nimport time; time.sleep(2)\n'done'",
        mark.display().to_string()
    );
    let cell = tokio::spawn({
        let m = m.manager.clone();
        async move {
            m.execute("s", Cell::new(code).timeout(Duration::from_secs(10)))
                .await
        }
    });
    let started = common::registry::eventually(Duration::from_secs(10), || mark.exists()).await;
    assert!(started, "the cell started on the far host");
    let link = LinkDown::take(&veth);
    let r = cell.await.unwrap().unwrap();
    drop(link);
    assert_eq!(r.status, Status::Error, "{r:?}");
    let e = r.error.unwrap();
    assert!(
        e.starts_with("TransportError") && e.contains("not retried"),
        "{e}"
    );
    assert!(r.kernel.state_lost, "{:?}", r.kernel);
    assert!(r.kernel.note.unwrap().contains("counts as dead"));

    // With the link back, the next cell gets a fresh kernel and says why.
    let mut next = None;
    for _ in 0..20 {
        let r = m.manager.execute("s", Cell::new("'x' in globals()")).await;
        match r {
            Ok(r) if r.status == Status::Success => {
                next = Some(r);
                break;
            }
            _ => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
    let next = next.expect("the host is reachable again");
    assert_eq!(next.value.as_deref(), Some("False"));
    assert!(!next.kernel.reused);
    assert!(next.kernel.note.unwrap().contains("connection"));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let ran = std::fs::read_to_string(&mark).unwrap();
    assert_eq!(ran, "ran\n", "the cell ran exactly once");
    m.manager.shutdown().await;
}

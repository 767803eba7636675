//! `network = "allowlist"`: a strict kernel's only way out is the host's
//! proxy, which admits allowed names (resolved by the host) and refuses the
//! rest with a 403 that says why; in no mode does a kernel reach a server
//! on the host's loopback (where the daemon and tool endpoints listen)
//! unless the operator opted that range in.

mod common;

use std::sync::Arc;

use cellhost::egress::EgressPolicy;
use cellhost::{Status, StrictSandbox};
use common::index;

fn strict(dir: &tempfile::TempDir, egress: Option<EgressPolicy>) -> cellhost::KernelOptions {
    let s = StrictSandbox {
        egress: egress.map(Arc::new),
        ..StrictSandbox::default()
    };
    common::strict_options(dir, s)
}

const FETCH: &str = r#"
import urllib.request, urllib.error
def fetch(url):
    try:
        return "%d %s" % (200, urllib.request.urlopen(url, timeout=20).read().decode())
    except urllib.error.HTTPError as e:
        return "%d %s" % (e.code, e.read().decode())
    except Exception as e:
        return "failed %r" % (e,)
import socket
def direct(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=3).close()
        return "connected"
    except OSError as e:
        return "refused %s" % e
"#;

fn port(url: &str) -> u16 {
    url.trim_start_matches("http://127.0.0.1:")
        .split('/')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn an_allowed_host_is_reached_by_name_and_others_are_refused_with_the_reason() {
    let idx = index::serve();
    let p = port(&idx.url);
    let dir = tempfile::tempdir().unwrap();
    let policy = EgressPolicy {
        allow_hosts: vec!["localhost".into()],
        // The test's "allowed" server lives on this machine's loopback.
        allow_cidrs: vec!["127.0.0.0/8".parse().unwrap()],
        deny_hosts: vec![],
    };
    let k = common::kernel_with(strict(&dir, Some(policy)), dir).await;
    let r = k.run(FETCH).await;
    assert_eq!(r.status, Status::Success, "{r:#?}");
    let (before, _) = cellhost::egress::decisions();
    let r = k
        .run(&format!("fetch('http://localhost:{p}/simple/')"))
        .await;
    let v = r.value.unwrap_or_default();
    assert!(v.starts_with("'200 ") && v.contains("tinypkg"), "{v}");
    assert!(cellhost::egress::decisions().0 > before, "counted");
    // HTTPS-style tunnels (CONNECT) go the same way.
    let r = k
        .run(&format!(
            "import http.client, os\nport = int(os.environ['HTTPS_PROXY'].rsplit(':', 1)[1])\nc = http.client.HTTPConnection('127.0.0.1', port, timeout=20)\nc.set_tunnel('localhost', {p})\nc.request('GET', '/simple/')\nc.getresponse().status"
        ))
        .await;
    assert_eq!(r.value.as_deref(), Some("200"), "{r:#?}");
    for (url, why) in [
        (format!("http://127.0.0.1:{p}/"), "is an IP address"),
        (
            "http://pypi.org/".to_owned(),
            "not on the allow list ([sandbox] allow_hosts: localhost)",
        ),
    ] {
        let r = k.run(&format!("fetch({url:?})")).await;
        let v = r.value.unwrap_or_default();
        assert!(v.starts_with("'403 ") && v.contains(why), "{url}: {v}");
    }
    // Nothing bypasses the proxy: the sandbox has no route out.
    let r = k.run(&format!("direct({p})")).await;
    assert!(r.value.unwrap_or_default().contains("refused"));
}

#[tokio::test]
async fn no_network_mode_reaches_a_server_on_the_hosts_loopback() {
    // A stand-in for the daemon's API and a [[tools]] endpoint.
    let idx = index::serve();
    let p = port(&idx.url);
    for egress in [
        None,
        Some(EgressPolicy {
            allow_hosts: vec!["localhost".into()],
            ..EgressPolicy::default()
        }),
    ] {
        let proxied = egress.is_some();
        let dir = tempfile::tempdir().unwrap();
        let k = common::kernel_with(strict(&dir, egress), dir).await;
        k.run(FETCH).await;
        let r = k.run(&format!("direct({p})")).await;
        assert!(
            r.value.clone().unwrap_or_default().contains("refused"),
            "{r:#?}"
        );
        let r = k.run(&format!("fetch('http://localhost:{p}/')")).await;
        let v = r.value.unwrap_or_default();
        if proxied {
            assert!(
                v.starts_with("'403 ") && v.contains("a loopback address"),
                "{v}"
            );
        } else {
            assert!(v.contains("failed URLError"), "{v}");
        }
    }
}

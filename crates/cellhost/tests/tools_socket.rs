//! The tool socket against foreign and malformed clients: a separate
//! process speaking the wire protocol with a wrong token, bad JSON, an
//! oversize frame or an unknown tool gets an error back, the tool is never
//! reached, and the kernel goes on.

mod common;

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;

use cellhost::{Cell, Status};
use common::tools::{toolset, Log};

/// A python3 client (not the kernel) sending each of `frames` (Python
/// expressions giving bytes) on a new connection and printing the reply.
fn foreign_client(socket: &Path, frames: &[&str]) -> Vec<String> {
    let script = format!(
        r#"
import json, socket, struct, sys
def frame(body): return struct.pack('<I', len(body)) + body
for f in [{frames}]:
    s = socket.socket(socket.AF_UNIX); s.connect({path:?})
    s.sendall(f)
    head = s.recv(4, socket.MSG_WAITALL)
    if len(head) < 4:
        print('EOF'); continue
    n = struct.unpack('<I', head)[0]
    print(json.loads(s.recv(n, socket.MSG_WAITALL)))
    s.close()
"#,
        path = socket.to_str().unwrap(),
        frames = frames.join(", "),
    );
    let out = std::process::Command::new("/usr/bin/python3")
        .args(["-c", &script])
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_and_malformed_requests_get_errors_and_never_reach_a_tool() {
    let k = common::kernel().await;
    let log = Log::default();
    let set = toolset(&log);
    let staging = k.staging_dirs();
    assert_eq!(staging.len(), 1);
    let socket = staging[0].join("tools.sock");
    let meta = std::fs::metadata(&socket).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(
        meta.permissions().mode() & 0o777,
        0o600,
        "the socket is owner-only"
    );
    let dir_mode = std::fs::metadata(&staging[0]).unwrap().permissions().mode();
    assert_eq!(dir_mode & 0o777, 0o700);

    // A cell runs (its authority is installed) while the foreign client
    // talks: it waits on an event file the test creates afterwards.
    let flag = k.dir.path().join("go");
    let code = format!(
        "import os, time, tools\nwhile not os.path.exists({:?}):\n    time.sleep(0.02)\ntools.echo(text='mine')",
        flag.to_str().unwrap()
    );
    let running = {
        let kernel = k.kernel.clone();
        let set = set.clone();
        tokio::spawn(async move { kernel.execute(Cell::new(code).tools(set)).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let replies = foreign_client(
        &socket,
        &[
            r#"frame(json.dumps({"token": "0" * 32, "tool": "echo", "args": {"text": "x"}}).encode())"#,
            r#"frame(b"{not json")"#,
            r#"frame(json.dumps({"token": "x", "tool": "echo", "args": [1]}).encode())"#,
            r#"struct.pack('<I', 200 * 1024 * 1024)"#,
        ],
    );
    assert_eq!(replies.len(), 4, "{replies:?}");
    assert!(
        replies[0].contains("wrong token"),
        "a wrong token is refused: {replies:?}"
    );
    assert!(replies[1].contains("malformed tool request"), "{replies:?}");
    assert!(
        replies[2].contains("wrong token"),
        "the token is checked before the arguments: {replies:?}"
    );
    assert!(
        replies[3].contains("over the 10485760-byte limit"),
        "{replies:?}"
    );
    std::fs::write(&flag, "").unwrap();
    let r = running.await.unwrap().unwrap();
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(r.value.as_deref(), Some("{'echo': 'mine'}"));
    assert_eq!(r.tool_calls_made, 1);
    assert_eq!(
        log.names(),
        ["echo"],
        "only the kernel's own call got through"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_from_inside_the_kernel_are_refused_and_it_lives() {
    let k = common::kernel().await;
    let log = Log::default();
    let set = toolset(&log);
    // With the right token (the cell can read it), the wire still checks
    // the tool, the args and the size.
    let code = r#"
import tools
out = []
for name, args in [("nope", {}), ("echo", [1, 2])]:
    try:
        tools._invoke(name, args)
    except tools.ToolError as e:
        out.append(str(e))
try:
    tools.echo(text="x" * (11 * 1024 * 1024))
except tools.ToolError as e:
    out.append(str(e)[:60])
try:
    tools.echo(text=object())
except tools.ToolError as e:
    out.append(str(e)[:50])
for line in out: print(line)
"#;
    let r = k.run_cell(Cell::new(code).tools(set.clone())).await;
    assert_eq!(r.status, Status::Success, "{r:?}");
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert!(
        lines[0].starts_with("unknown tool \"nope\"; this kernel's tools are: boom, echo"),
        "{lines:?}"
    );
    assert!(lines[1].contains("must be a JSON object"), "{lines:?}");
    assert!(
        lines[2].starts_with("the request to echo is 1153"),
        "{lines:?}"
    );
    assert!(lines[3].contains("not JSON-serializable"), "{lines:?}");
    assert_eq!(r.tool_calls_made, 0);
    assert!(log.names().is_empty());
    let r = k
        .run_cell(Cell::new("tools.echo(text='ok')").tools(set))
        .await;
    assert_eq!(r.value.as_deref(), Some("{'echo': 'ok'}"));
}

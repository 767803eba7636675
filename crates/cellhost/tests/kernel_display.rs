//! Rich outputs: display() and its bundles, rich last values, caps,
//! threads, the event sink and the reply pipe's integrity. Objects from
//! real libraries (matplotlib, pillow, pandas) are in kernel_display_libs.rs.

mod common;

use std::time::Duration;

use base64::Engine;
use cellhost::{Cell, CellEvent, DisplayLimits, Status};
use common::display::{count, display, item, kernel_limits, ok, wait_for_file};
use common::kernel;

#[tokio::test]
async fn a_custom_repr_html_object_is_displayed_and_its_value_stays_text() {
    let k = kernel().await;
    let r = k
        .run(
            "class Card:\n    def _repr_html_(self): return '<b>card</b>'\n    def __repr__(self): return 'Card()'\n\
             display(Card())\nCard()",
        )
        .await;
    ok(&r);
    assert_eq!(r.value.as_deref(), Some("Card()"));
    assert_eq!(count(&r), 2);
    for n in 0..2 {
        let items: Vec<_> = display(&r, n)
            .iter()
            .map(|d| (d.mime.as_str(), d.data.as_str()))
            .collect();
        assert_eq!(
            items,
            [("text/html", "<b>card</b>"), ("text/plain", "Card()")]
        );
    }
}

#[tokio::test]
async fn plain_values_make_no_display() {
    let k = kernel().await;
    let r = k.run("x = [1, 2]\nx").await;
    assert_eq!(r.value.as_deref(), Some("[1, 2]"));
    assert!(r.displays.is_empty());
    let r = k.run("class P: pass\nP()").await;
    assert!(r.displays.is_empty(), "no rich repr, no display");
}

#[tokio::test]
async fn every_ipython_repr_and_raw_bundles_are_understood() {
    let k = kernel().await;
    let r = k
        .run(
            "class All:\n\
             \x20   def _repr_svg_(self): return '<svg/>'\n\
             \x20   def _repr_markdown_(self): return '**md**'\n\
             \x20   def _repr_latex_(self): return '$x$'\n\
             \x20   def _repr_json_(self): return {'k': [1]}\n\
             \x20   def _repr_png_(self): return b'\\x89PNG fake'\n\
             class Bundle:\n\
             \x20   def _repr_mimebundle_(self, include=None, exclude=None):\n\
             \x20       return {'text/html': '<i>b</i>', 'text/plain': 'B'}, {}\n\
             display(All(), Bundle())\n\
             display({'image/png': 'iVBORw0K', 'text/plain': 'raw'}, raw=True)",
        )
        .await;
    ok(&r);
    assert_eq!(count(&r), 3);
    let mimes: Vec<_> = display(&r, 0).iter().map(|d| d.mime.as_str()).collect();
    assert_eq!(
        mimes,
        [
            "image/png",
            "image/svg+xml",
            "text/markdown",
            "text/latex",
            "application/json",
            "text/plain"
        ]
    );
    let fake = base64::engine::general_purpose::STANDARD.encode(b"\x89PNG fake");
    assert_eq!(item(&r, 0, "image/png").data, fake);
    assert_eq!(item(&r, 0, "application/json").data, r#"{"k": [1]}"#);
    assert_eq!(item(&r, 1, "text/html").data, "<i>b</i>");
    assert_eq!(item(&r, 1, "text/plain").data, "B");
    // Base64 text from a raw bundle is decoded, then encoded again.
    assert_eq!(item(&r, 2, "image/png").data, "iVBORw0K");
}

#[tokio::test]
async fn a_failing_repr_is_reported_on_stderr_and_the_cell_succeeds() {
    let k = kernel().await;
    let r = k
        .run("class Bad:\n    def _repr_html_(self): raise ValueError('nope')\ndisplay(Bad())")
        .await;
    ok(&r);
    assert!(
        r.stderr.contains("Bad._repr_html_ raised ValueError: nope"),
        "{}",
        r.stderr
    );
    assert_eq!(count(&r), 1);
    assert_eq!(display(&r, 0)[0].mime, "text/plain");
}

#[tokio::test]
async fn the_per_cell_caps_drop_what_comes_after_them() {
    let k = kernel_limits(DisplayLimits {
        max_display_bytes: 1000,
        max_cell_bytes: 2500,
        max_cell_displays: 1000,
    })
    .await;
    let r = k.run("for i in range(5): display('x' * 998)").await;
    ok(&r);
    assert_eq!(count(&r), 2);
    assert_eq!(r.truncated.displays_dropped, 3);
    assert!(r
        .truncated
        .displays_note
        .as_deref()
        .unwrap()
        .contains("per-cell cap of 2.4 KiB"));
    // The next cell has its own budget.
    let r = k.run("display(1)").await;
    assert_eq!(count(&r), 1);
    assert_eq!(r.truncated.displays_dropped, 0);

    let k = kernel_limits(DisplayLimits {
        max_cell_displays: 10,
        ..DisplayLimits::default()
    })
    .await;
    let r = k.run("for i in range(100_000): display(i)").await;
    ok(&r);
    assert_eq!(count(&r), 10);
    assert_eq!(r.truncated.displays_dropped, 99_990);
    assert!(r
        .truncated
        .displays_note
        .as_deref()
        .unwrap()
        .contains("cap of 10 displays"));
}

/// A cell that writes display frames itself, past the runner's checks:
/// the host enforces the caps too, without buffering the big frame.
#[tokio::test]
async fn the_host_drops_oversized_display_frames_the_runner_did_not_stop() {
    let k = kernel_limits(DisplayLimits {
        max_display_bytes: 1 << 20,
        ..DisplayLimits::default()
    })
    .await;
    let code = "import os\n\
        def frame(data):\n\
        \x20   body = b'op 7\\ndisplaym0 9\\nimage/pngd0 %d\\n' % len(data) + data\n\
        \x20   return len(body).to_bytes(4, 'little') + body\n\
        def send(b):\n\
        \x20   while b: b = b[os.write(4, b):]\n\
        send(frame(b'\\x89PNG' * (4 << 20)))\n\
        send(frame(b'\\x89PNG' * 100))\n\
        print('sent')";
    let before = common::self_rss();
    let r = k.run(code).await;
    ok(&r);
    assert_eq!(r.stdout, "sent\n");
    assert_eq!(count(&r), 1, "the small frame is kept");
    assert_eq!(r.truncated.displays_dropped, 1);
    assert!(r
        .truncated
        .displays_note
        .as_deref()
        .unwrap()
        .contains("per-display cap of 1.0 MiB"));
    let grown = common::self_rss().saturating_sub(before);
    assert!(
        grown < 12 << 20,
        "host grew by {grown} bytes for a 16 MiB frame"
    );
    assert_eq!(k.run("1 + 1").await.value.as_deref(), Some("2"));
}

/// A thread that writes display frames without end (past the runner's
/// caps) cannot starve the timeout: the cell still ends on time.
#[tokio::test]
async fn a_flood_of_display_frames_does_not_starve_the_timeout() {
    let k = kernel().await;
    let code = "import os, threading, time\n\
        body = b'op 7\\ndisplaym0 10\\ntext/plaind0 65536\\n' + b'z' * 65536\n\
        frame = len(body).to_bytes(4, 'little') + body\n\
        def flood():\n\
        \x20   while True:\n\
        \x20       b = frame * 16\n\
        \x20       while b: b = b[os.write(4, b):]\n\
        threading.Thread(target=flood, daemon=True).start()\n\
        time.sleep(60)";
    let started = std::time::Instant::now();
    let r = k
        .run_cell(Cell::new(code).timeout(Duration::from_millis(500)))
        .await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    // The interrupt fired; the raw writer may then garble the reply (it
    // holds no lock), so the cell ends as a timeout or a broken channel.
    let error = r.error.as_deref().unwrap_or_default();
    assert!(
        r.status == Status::Timeout || error.starts_with("KernelProtocolError"),
        "{r:?}"
    );
}

#[tokio::test]
async fn a_display_from_a_thread_of_the_cell_is_delivered() {
    let k = kernel().await;
    let r = k
        .run(
            "import threading\n\
             ts = [threading.Thread(target=display, args=('t%d' % i,)) for i in range(8)]\n\
             for t in ts: t.start()\n\
             for t in ts: t.join()",
        )
        .await;
    ok(&r);
    assert_eq!(count(&r), 8);
    let mut got: Vec<_> = r.displays.iter().map(|d| d.data.clone()).collect();
    got.sort();
    assert_eq!(got, (0..8).map(|i| format!("'t{i}'")).collect::<Vec<_>>());
}

#[tokio::test]
async fn a_display_after_its_cell_settled_goes_to_the_next_cell() {
    let k = kernel().await;
    let marker = k.dir.path().join("displayed");
    // The thread displays once the test says so (after the cell settled),
    // not after a sleep a loaded machine might outlast.
    let go = k.dir.path().join("go");
    let r = k
        .run(&format!(
            "import os, threading, time\n\
             def late():\n\
             \x20   while not os.path.exists({:?}): time.sleep(0.01)\n\
             \x20   display('late' * 10000)\n\
             \x20   open({:?}, 'w').close()\n\
             threading.Thread(target=late).start()\n\
             display('now')",
            go.to_str().unwrap(),
            marker.to_str().unwrap()
        ))
        .await;
    ok(&r);
    assert_eq!(count(&r), 1);
    std::fs::write(&go, "").unwrap();
    // Once display() returned, its frame is in the pipe, ahead of the next
    // cell's reply.
    wait_for_file(&marker).await;
    let r = k.run("1 + 1").await;
    assert_eq!(r.value.as_deref(), Some("2"), "the protocol is intact");
    assert_eq!(count(&r), 1);
    assert!(r.displays[0].data.starts_with("'latelate"));
    let r = k.run("2 + 2").await;
    assert!(r.displays.is_empty());
}

#[tokio::test]
async fn garbage_on_the_reply_pipe_between_cells_costs_the_kernel_not_the_next_reply() {
    let k = kernel().await;
    let pid = k.kernel.pid().unwrap();
    let r = k
        .run(
            "import os, threading, time\nstate = 1\n\
             def garbage():\n\
             \x20   time.sleep(0.2)\n\
             \x20   os.write(4, b'\\x05\\x00\\x00\\x00hello')\n\
             threading.Thread(target=garbage).start()",
        )
        .await;
    ok(&r);
    // The idle actor kills the kernel as soon as it reads the garbage.
    for _ in 0..500 {
        if !common::pid_alive(pid) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!common::pid_alive(pid), "the kernel was killed while idle");
    let r = k.run("'state' in globals()").await;
    ok(&r);
    assert_eq!(r.value.as_deref(), Some("False"));
    assert!(r.kernel.state_lost && !r.kernel.reused);
    let note = r.kernel.note.unwrap();
    assert!(
        note.contains("broke its control channel while idle"),
        "{note}"
    );
}

#[tokio::test]
async fn displays_stream_to_the_event_sink_while_the_cell_runs() {
    let k = kernel().await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let cell =
        Cell::new("import time\ndisplay('first')\ntime.sleep(1)\ndisplay('second')").events(tx);
    let kernel = k.kernel.clone();
    let running = tokio::spawn(async move { kernel.execute(cell).await.unwrap() });
    let first = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("an event before the cell ends")
        .unwrap();
    assert!(k.kernel.is_busy(), "the event came while the cell ran");
    let CellEvent::Display(items) = first else {
        panic!("{first:?}")
    };
    assert_eq!((items[0].data.as_str(), items[0].display), ("'first'", 0));
    let r = running.await.unwrap();
    let Some(CellEvent::Display(items)) = rx.recv().await else {
        panic!("second display")
    };
    assert_eq!((items[0].data.as_str(), items[0].display), ("'second'", 1));
    assert_eq!(count(&r), 2);
    assert!(
        rx.recv().await.is_none(),
        "the sink is dropped when the cell ends"
    );
}

#[tokio::test]
async fn interrupting_a_cell_that_floods_displays_keeps_the_protocol_intact() {
    let k = kernel_limits(DisplayLimits {
        max_cell_bytes: 1 << 20,
        ..DisplayLimits::default()
    })
    .await;
    let r = k
        .run_cell(
            Cell::new("while True: display('y' * 200_000)").timeout(Duration::from_millis(500)),
        )
        .await;
    assert_eq!(r.status, Status::Timeout, "{:?}", r.error);
    assert!(!r.kernel.state_lost);
    assert!(count(&r) > 0);
    assert!(r.truncated.displays_dropped > 0, "the cell cap held");
    let r = k.run("display('ok')\n3").await;
    assert_eq!(r.value.as_deref(), Some("3"));
    assert_eq!(count(&r), 1);
}

#[tokio::test]
async fn a_forked_child_cannot_write_displays_into_the_parent_pipe() {
    let k = kernel().await;
    let r = k
        .run("import os\npid = os.fork()\nif pid == 0:\n    display('child')\n    os._exit(0)\nos.waitpid(pid, 0)\ndisplay('parent')")
        .await;
    ok(&r);
    assert_eq!(count(&r), 1);
    assert_eq!(r.displays[0].data, "'parent'");
}

#[tokio::test]
async fn display_is_a_builtin_and_text_items_are_redacted() {
    let k = kernel().await;
    let r = k
        .run("import builtins\nprint(builtins.display is display)\ndisplay('key ghp_' + 'a' * 36)")
        .await;
    ok(&r);
    assert_eq!(r.stdout, "True\n");
    assert!(!r.displays[0].data.contains("aaaaaaaa"), "{:?}", r.displays);
}

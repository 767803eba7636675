//! `cellhost exec|sessions|reset|interrupt|history`: clients of a running
//! `cellhost serve`. Exit codes follow `cellhost run`: 0 success, 1 a cell
//! failed or the server could not do it (unreachable, no kernel), 2 a
//! usage error (bad flags, a request the server refused as invalid or
//! unauthorized, an unknown session).

use std::io::{IsTerminal, Read, Write};

use cellhost::history::HistoryEntry;
use cellhost::{CellResult, KernelSummary};
use cellhost_protocol::{CellAnswer, Count, ExecuteEvent, ExecuteRequest, OutputStream};
use http_body_util::BodyExt;
use hyper::Method;

use crate::http::{read_all, segment, Failure, Server};
use crate::{ClientArgs, ExecArgs, HistoryArgs};

pub(crate) fn connect(c: &ClientArgs) -> Result<Server, Failure> {
    let token = std::env::var("CELLHOST_TOKEN").ok();
    Server::new(&c.server, token)
}

pub(crate) fn report(r: Result<u8, Failure>) -> u8 {
    match r {
        Ok(code) => code,
        Err(f) => {
            eprintln!("cellhost: {}", f.line);
            f.exit
        }
    }
}

fn read_code(code: &str) -> Result<String, Failure> {
    if code != "-" {
        return Ok(code.to_owned());
    }
    let mut buf = Vec::new();
    std::io::stdin()
        .read_to_end(&mut buf)
        .map_err(|e| Failure {
            line: format!("cannot read standard input: {e}"),
            exit: 2,
        })?;
    String::from_utf8(buf).map_err(|_| Failure {
        line: "standard input is not UTF-8 text".into(),
        exit: 2,
    })
}

pub(crate) async fn exec(args: ExecArgs) -> u8 {
    report(exec_inner(args).await)
}

async fn exec_inner(args: ExecArgs) -> Result<u8, Failure> {
    let server = connect(&args.client)?;
    let code = read_code(&args.code)?;
    // Ctrl-C interrupts the cell on the server too (its state is kept),
    // then exits 130 like a shell.
    tokio::select! {
        r = exec_cell(&server, &args, code) => r,
        _ = tokio::signal::ctrl_c() => {
            let path = format!("/v1/sessions/{}/interrupt", segment(&args.session));
            let sent = tokio::time::timeout(
                std::time::Duration::from_secs(5),
                server.json::<Count>(Method::POST, &path, None),
            )
            .await;
            match sent {
                Ok(Ok(_)) => eprintln!("\ncellhost: interrupted the cell of session {}", args.session),
                Ok(Err(f)) => eprintln!("\ncellhost: could not interrupt the cell: {}", f.line),
                Err(_) => eprintln!("\ncellhost: could not interrupt the cell: the server did not answer"),
            }
            Ok(130)
        }
    }
}

async fn exec_cell(server: &Server, args: &ExecArgs, code: String) -> Result<u8, Failure> {
    let req = ExecuteRequest {
        reset: args.reset,
        timeout: args.timeout.map(|t| t.as_secs_f64()),
        ..ExecuteRequest::new(code)
    };
    let body = serde_json::to_value(&req).map_err(|e| Failure {
        line: format!("cannot encode the request: {e}"),
        exit: 2,
    })?;
    let path = format!("/v1/sessions/{}/execute", segment(&args.session));
    let result: CellResult = if args.json {
        // The answer as the server sent it, then read as a typed result.
        let resp = server
            .send(Method::POST, &path, Some(body), "application/json")
            .await?;
        let bytes = read_all(resp).await?;
        println!("{}", String::from_utf8_lossy(&bytes));
        let answer: CellAnswer = serde_json::from_slice(&bytes).map_err(|e| Failure {
            line: format!("unexpected answer: {e}"),
            exit: 1,
        })?;
        answer.result
    } else {
        let (mut r, streamed) = stream(server, &path, body).await?;
        // What the stream did not show (a remote kernel streams nothing;
        // streaming stops at the cap) comes from the result.
        if let Some(t) = streamed.stdout.missing("stdout", &r.stdout) {
            let mut o = std::io::stdout().lock();
            let _ = o.write_all(t.as_bytes()).and_then(|()| o.flush());
        }
        if let Some(t) = streamed.stderr.missing("stderr", &r.stderr) {
            let mut e = std::io::stderr().lock();
            let _ = e.write_all(t.as_bytes()).and_then(|()| e.flush());
        }
        r.stdout.clear();
        r.stderr.clear();
        // Images are saved the way `cellhost run` saves them.
        let dir = args
            .display_dir
            .clone()
            .unwrap_or_else(|| std::path::PathBuf::from("cellhost_displays"));
        let shown = if r.displays.is_empty() {
            Vec::new()
        } else {
            let cell = usize::try_from(r.kernel.execution_count).unwrap_or(0);
            crate::displays::DisplaySaver::new(dir).save(cell, &r)
        };
        let text = crate::render::cell_body(&r, &shown);
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
        for s in &shown {
            if let crate::displays::Shown::Failed(why) = s {
                eprintln!("cellhost: {why}");
            }
        }
        r
    };
    Ok(u8::from(!result.is_success()))
}

/// What one stream's events carried.
#[derive(Debug, Default)]
pub(crate) struct Streamed {
    /// Bytes of text printed.
    bytes: usize,
    /// The server stopped streaming it at the cap (a `stream_stopped`
    /// event came).
    cut: bool,
}

impl Streamed {
    pub(crate) fn saw(&mut self, text: &str) {
        self.bytes += text.len();
    }

    fn stopped(&mut self) {
        self.cut = true;
    }

    /// What to print after the stream from the result's text of it
    /// (`result`): everything when nothing was streamed (a remote kernel
    /// streams nothing); after a cut, the result's text (head and tail)
    /// under a line saying so; else nothing.
    pub(crate) fn missing(&self, name: &str, result: &str) -> Option<String> {
        if result.is_empty() {
            return None;
        }
        let mut out = if self.bytes == 0 {
            String::new()
        } else if self.cut {
            format!("[cellhost: the cell result's {name} (head and tail) follows]\n")
        } else {
            return None;
        };
        out.push_str(result);
        if !out.ends_with('\n') {
            out.push('\n');
        }
        Some(out)
    }
}

/// Per stream, what the SSE events showed.
#[derive(Debug, Default)]
struct StreamedAll {
    stdout: Streamed,
    stderr: Streamed,
}

/// Run with SSE: print stdout/stderr as they arrive, return the result and
/// what was printed.
async fn stream(
    server: &Server,
    path: &str,
    body: serde_json::Value,
) -> Result<(CellResult, StreamedAll), Failure> {
    let mut streamed = StreamedAll::default();
    let resp = server
        .send(Method::POST, path, Some(body), "text/event-stream")
        .await?;
    let mut body = resp.into_body();
    let mut buf: Vec<u8> = Vec::new();
    let fail = |line: String| Failure { line, exit: 1 };
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| fail(format!("the stream from the server broke: {e}")))?;
        let Some(data) = frame.data_ref() else {
            continue;
        };
        buf.extend_from_slice(data);
        while let Some(end) = find(&buf, b"\n\n") {
            let event: Vec<u8> = buf.drain(..end + 2).collect();
            let (name, data) = parse_event(&String::from_utf8_lossy(&event));
            if name.is_empty() {
                continue; // keep-alive comments
            }
            let event = ExecuteEvent::parse(&name, &data)
                .map_err(|e| fail(format!("unexpected {name} event from the server: {e}")))?;
            match event {
                Some(ExecuteEvent::Stdout(text)) => {
                    streamed.stdout.saw(&text);
                    let mut o = std::io::stdout().lock();
                    let _ = o.write_all(text.as_bytes());
                    let _ = o.flush();
                }
                Some(ExecuteEvent::Stderr(text)) => {
                    streamed.stderr.saw(&text);
                    let mut e = std::io::stderr().lock();
                    let _ = e.write_all(text.as_bytes());
                    let _ = e.flush();
                }
                Some(ExecuteEvent::StreamStopped { stream, .. }) => match stream {
                    OutputStream::Stderr => streamed.stderr.stopped(),
                    _ => streamed.stdout.stopped(),
                },
                Some(ExecuteEvent::Result(answer)) => return Ok((answer.result, streamed)),
                Some(ExecuteEvent::Error(e)) => return Err(fail(e.message)),
                // Displays come with the result; events of a newer server
                // are skipped.
                _ => {}
            }
        }
    }
    Err(fail(
        "the server closed the stream before the cell's result".into(),
    ))
}

pub(crate) fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

pub(crate) fn parse_event(text: &str) -> (String, String) {
    let (mut name, mut data) = (String::new(), Vec::new());
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("event:") {
            name = v.trim().to_owned();
        } else if let Some(v) = line.strip_prefix("data:") {
            data.push(v.strip_prefix(' ').unwrap_or(v));
        }
    }
    (name, data.join("\n"))
}

pub(crate) async fn sessions(client: ClientArgs, json: bool) -> u8 {
    report(
        async {
            let server = connect(&client)?;
            let kernels: Vec<KernelSummary> = server.json(Method::GET, "/v1/kernels", None).await?;
            if json {
                println!("{}", serde_json::to_string(&kernels).unwrap_or_default());
                return Ok(0);
            }
            if kernels.is_empty() {
                println!("no live sessions");
                return Ok(0);
            }
            println!(
                "{:<32} {:<8} {:>6} {:>8} {:>10} {:>8}",
                "SESSION", "STATE", "CELLS", "IDLE", "RSS", "PID"
            );
            for k in kernels {
                let state = serde_json::to_value(k.state)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default();
                let rss = k
                    .rss_bytes
                    .map_or("-".into(), |b| format!("{:.1}M", b as f64 / 1048576.0));
                let pid = k.pid.map_or("-".into(), |p| p.to_string());
                println!(
                    "{:<32} {:<8} {:>6} {:>7.0}s {:>10} {:>8}",
                    k.owner, state, k.execution_count, k.idle_seconds, rss, pid
                );
            }
            Ok(0)
        }
        .await,
    )
}

pub(crate) async fn reset(client: ClientArgs, session: String) -> u8 {
    report(
        async {
            let server = connect(&client)?;
            let path = format!("/v1/sessions/{}", segment(&session));
            let v: Count = server.json(Method::DELETE, &path, None).await?;
            println!("session {session} reset ({} kernel(s) disposed)", v.count);
            Ok(0)
        }
        .await,
    )
}

pub(crate) async fn interrupt(client: ClientArgs, session: String) -> u8 {
    report(
        async {
            let server = connect(&client)?;
            let path = format!("/v1/sessions/{}/interrupt", segment(&session));
            let n = server.json::<Count>(Method::POST, &path, None).await?.count;
            if n == 0 {
                println!("session {session} had no running cell");
            } else {
                println!("interrupted {n} running cell(s) of session {session}");
            }
            Ok(0)
        }
        .await,
    )
}

pub(crate) async fn snapshot(client: ClientArgs, session: String, json: bool) -> u8 {
    report(
        async {
            let server = connect(&client)?;
            let path = format!("/v1/sessions/{}/snapshot", segment(&session));
            let v: cellhost_protocol::SnapshotReport =
                server.json(Method::POST, &path, None).await?;
            if json {
                println!("{}", serde_json::to_string(&v).unwrap_or_default());
                return Ok(0);
            }
            println!(
                "session {session}: snapshot of {} name(s), {} bytes, in {:.3} s",
                v.names, v.bytes, v.seconds
            );
            for s in &v.skipped {
                println!("  not kept: {} ({}): {}", s.name, s.kind, s.why);
            }
            Ok(0)
        }
        .await,
    )
}

pub(crate) async fn fork(client: ClientArgs, session: String, into: Vec<String>, json: bool) -> u8 {
    report(
        async {
            let server = connect(&client)?;
            let path = format!("/v1/sessions/{}/fork", segment(&session));
            let body = serde_json::json!({ "into": into });
            let v: cellhost_protocol::ForkReport =
                server.json(Method::POST, &path, Some(body)).await?;
            if json {
                println!("{}", serde_json::to_string(&v).unwrap_or_default());
                return Ok(0);
            }
            for f in &v.into {
                let path = match f.path {
                    cellhost_protocol::ForkPath::Process => "process fork",
                    _ => "snapshot and restore",
                };
                println!(
                    "session {session} forked into {} ({path}, {} workspace bytes, {:.3} s)",
                    f.session, f.workspace_bytes, f.seconds
                );
            }
            Ok(0)
        }
        .await,
    )
}

pub(crate) async fn history(args: HistoryArgs) -> u8 {
    report(
        async {
            let server = connect(&args.client)?;
            let path = format!(
                "/v1/sessions/{}/history?limit={}",
                segment(&args.session),
                args.limit
            );
            let resp = server
                .send(Method::GET, &path, None, "application/json")
                .await?;
            let bytes = read_all(resp).await?;
            if args.json {
                println!("{}", String::from_utf8_lossy(&bytes));
                return Ok(0);
            }
            let rows: Vec<HistoryEntry> = serde_json::from_slice(&bytes).map_err(|e| Failure {
                line: format!("unexpected answer: {e}"),
                exit: 1,
            })?;
            let terminal = std::io::stdout().is_terminal();
            let out = history_text(&rows, terminal);
            let mut o = std::io::stdout().lock();
            let _ = o.write_all(out.as_bytes());
            Ok(0)
        }
        .await,
    )
}

/// `cellhost history`'s transcript of `rows`. On a `terminal` the stored
/// text (code above all: it is stored as sent) is shown with its control
/// characters escaped (see [`crate::render::for_terminal`]); a pipe gets
/// it as stored.
fn history_text(rows: &[HistoryEntry], terminal: bool) -> String {
    let mut out = String::new();
    for r in rows {
        let who = r
            .child
            .as_deref()
            .map(|c| format!(" child {c}"))
            .unwrap_or_default();
        out.push_str(&format!(
            "── [{}]{who} {} · {:.1} ms · kernel {} ──\n",
            r.execution_count,
            r.status,
            r.duration_seconds * 1000.0,
            r.kernel_id
        ));
        for line in r.code.lines() {
            out.push_str(&format!(">>> {line}\n"));
        }
        for block in [&r.stdout, &r.stderr] {
            if !block.is_empty() {
                out.push_str(block);
                if !block.ends_with('\n') {
                    out.push('\n');
                }
            }
        }
        if let Some(v) = &r.value {
            out.push_str(&format!("Out[{}]: {v}\n", r.execution_count));
        }
        if let Some(e) = &r.error {
            out.push_str(&format!("{e}\n"));
        }
    }
    if terminal {
        crate::render::for_terminal(&out).into_owned()
    } else {
        out
    }
}

#[cfg(test)]
mod tests {
    use super::Streamed;

    #[test]
    fn the_result_fills_in_what_the_stream_did_not_show() {
        let mut s = Streamed::default();
        // Nothing streamed (a remote kernel): the result's text, as is.
        assert_eq!(s.missing("stdout", "hi"), Some("hi\n".into()));
        assert_eq!(s.missing("stdout", ""), None);
        // All streamed: nothing more.
        s.saw("hi\n");
        assert_eq!(s.missing("stdout", "hi\n"), None);
        // Text that merely looks like the stop line is not a cut.
        s.saw("[cellhost: streaming of stdout stopped after 1 bytes]\n");
        assert_eq!(s.missing("stdout", "hi\n"), None);
        // Cut at the cap (the server's stream_stopped event): the
        // result's head and tail under a line.
        s.stopped();
        let t = s.missing("stdout", "head…tail\n").unwrap();
        assert!(t.starts_with("[cellhost: the cell result's stdout (head and tail) follows]\n"));
        assert!(t.ends_with("head…tail\n"));
    }
}

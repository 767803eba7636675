//! `cellhost attach -s S`: watch a session live in the terminal, read-only
//! (like `jupyter console --existing` without input).
//!
//! It reads `GET /v1/sessions/{S}/events` and prints each cell as
//! `cellhost exec` would: `In [n]: code`, its output as it streams, then
//! its displays, value, error and state notes; kernel changes as one line
//! each. Ctrl-C detaches and never interrupts the cell: attach sends no
//! request but the stream's. Exit codes: 0 detached (Ctrl-C), 1 the
//! stream ended (the daemon stopped, or this watcher fell behind and was
//! dropped), 2 a usage error or a request the server refused.

use std::io::Write;

use cellhost::CellResult;
use http_body_util::BodyExt;
use hyper::Method;

use crate::clients::{connect, find, parse_event, report, Streamed};
use crate::http::{segment, Failure, Server};
use crate::AttachArgs;

pub(crate) async fn attach(args: AttachArgs) -> u8 {
    report(attach_inner(args).await)
}

async fn attach_inner(args: AttachArgs) -> Result<u8, Failure> {
    let server = connect(&args.client)?;
    let mut path = format!("/v1/sessions/{}", segment(&args.session));
    if let Some(c) = &args.child {
        path.push_str(&format!("/children/{}", segment(c)));
    }
    path.push_str("/events");
    if let Some(n) = args.since {
        path.push_str(&format!("?since={n}"));
    }
    let who = match &args.child {
        Some(c) => format!("child {c} of session {}", args.session),
        None => format!("session {}", args.session),
    };
    tokio::select! {
        r = watch(&server, &path, &who) => r,
        _ = tokio::signal::ctrl_c() => {
            eprintln!("\ncellhost: detached from {who} (its cells run on)");
            Ok(0)
        }
    }
}

async fn watch(server: &Server, path: &str, who: &str) -> Result<u8, Failure> {
    let resp = server
        .send(Method::GET, path, None, "text/event-stream")
        .await?;
    eprintln!("cellhost: attached to {who} (read-only; Ctrl-C detaches)");
    let mut body = resp.into_body();
    let mut buf: Vec<u8> = Vec::new();
    let mut printer = Printer::default();
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else { break };
        let Some(data) = frame.data_ref() else {
            continue;
        };
        buf.extend_from_slice(data);
        while let Some(end) = find(&buf, b"\n\n") {
            let event: Vec<u8> = buf.drain(..end + 2).collect();
            let (name, data) = parse_event(&String::from_utf8_lossy(&event));
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&data) else {
                continue; // keep-alive comments
            };
            if let Some(code) = printer.event(&name, &v) {
                return Ok(code);
            }
        }
    }
    eprintln!("cellhost: the server ended the stream of {who}");
    Ok(1)
}

/// What the events of the current cell have printed.
#[derive(Default)]
struct Printer {
    stdout: Streamed,
    stderr: Streamed,
}

impl Printer {
    /// Print one event; `Some(code)` when the stream is over.
    fn event(&mut self, name: &str, v: &serde_json::Value) -> Option<u8> {
        let mut out = std::io::stdout().lock();
        match name {
            "cell_started" => {
                self.stdout = Streamed::default();
                self.stderr = Streamed::default();
                let n = v["execution_count"].as_u64().unwrap_or(0);
                let code = v["code"].as_str().unwrap_or_default();
                let _ = out.write_all(in_prompt(n, code).as_bytes());
            }
            "stdout" => {
                let text = v["text"].as_str().unwrap_or_default();
                self.stdout.saw(text);
                let _ = out.write_all(text.as_bytes());
            }
            "stderr" => {
                let text = v["text"].as_str().unwrap_or_default();
                self.stderr.saw(text);
                let _ = out.flush();
                let mut e = std::io::stderr().lock();
                let _ = e.write_all(text.as_bytes()).and_then(|()| e.flush());
            }
            "cell_finished" => {
                if let Some(msg) = v["error"]["message"].as_str() {
                    let _ = writeln!(out, "[the cell could not run: {msg}]\n");
                } else if let Ok(r) = serde_json::from_value::<CellResult>(v["result"].clone()) {
                    let _ = out.write_all(self.finished(r).as_bytes());
                }
            }
            "kernel" => {
                let change = v["change"].as_str().unwrap_or("changed");
                let note = v["note"].as_str().unwrap_or_default();
                let _ = writeln!(out, "[kernel {change}] {note}");
            }
            "dropped" => {
                let _ = out.flush();
                let missed = v["missed"].as_u64().unwrap_or(0);
                let reason = v["reason"].as_str().unwrap_or("this watcher fell behind");
                eprintln!(
                    "cellhost: dropped by the server after missing {missed} event(s): {reason}"
                );
                return Some(1);
            }
            _ => {}
        }
        let _ = out.flush();
        None
    }

    /// The rest of a finished cell, as `cellhost exec` prints it: what the
    /// stream did not show, displays, value, error, notes.
    fn finished(&self, mut r: CellResult) -> String {
        let mut text = String::new();
        if let Some(t) = self.stdout.missing("stdout", &r.stdout) {
            text.push_str(&t);
        }
        if let Some(t) = self.stderr.missing("stderr", &r.stderr) {
            text.push_str(&t);
        }
        r.stdout.clear();
        r.stderr.clear();
        let shown = crate::displays::unsaved(&r);
        text.push_str(&crate::render::cell_body(&r, &shown));
        text.push('\n');
        text
    }
}

/// `In [n]: first line`, later lines under it like IPython's `...:`.
fn in_prompt(n: u64, code: &str) -> String {
    let head = format!("In [{n}]: ");
    let pad = format!("{}...: ", " ".repeat(head.len().saturating_sub(5)));
    let mut out = String::new();
    for (i, line) in code.lines().enumerate() {
        out.push_str(if i == 0 { &head } else { &pad });
        out.push_str(line);
        out.push('\n');
    }
    if code.lines().next().is_none() {
        out.push_str(head.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::in_prompt;

    #[test]
    fn code_is_shown_as_an_ipython_prompt() {
        assert_eq!(in_prompt(3, "x = 1\nx"), "In [3]: x = 1\n   ...: x\n");
        assert_eq!(in_prompt(1, ""), "In [1]:\n");
    }
}

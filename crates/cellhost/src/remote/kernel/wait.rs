//! Waiting for one remote cell (one exec, serving interrupts and
//! shutdown meanwhile), reading the waiter's verdict, and the one-shot
//! fallback after a failed spawn.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cellhost_protocol::{CellResult, KernelInfo};
use tokio::sync::{mpsc, oneshot};

use super::super::result::{parse, Blob};
use super::super::script;
use super::super::transport::ExecOutput;
use super::{Live, RemoteDriver, Waited, MAX_STREAM, QUICK};
use crate::kernel::{transport_lost, Control, Exit, Outcome, StateChange, Stop};
use crate::sys::random_hex;
use crate::tools::request::{self, Admitted, Running};
use crate::tools::Authority;

enum Served {
    Reply(Vec<u8>),
    /// The cell's timeout passed while the tool ran (it was cancelled).
    TimedOut(Vec<u8>),
    /// A control message arrived while the tool ran.
    Control(Option<Control>),
}

/// Serve one tool request of cell `cell` (its request number) under its
/// authority, within the time the cell has left: the token check, the
/// authority rule and the reply are the local socket's (`tools::request`).
async fn serve_tool(
    authority: &Arc<Authority>,
    cell: u64,
    token: &str,
    body: &[u8],
    left: Option<Duration>,
    max: usize,
    control: &mut mpsc::UnboundedReceiver<Control>,
) -> Served {
    let running = Running {
        authority: Some(authority),
        cell: Some(cell),
    };
    let Admitted { name, mut call } = match request::admit(body, token, running) {
        Ok(a) => a,
        Err(refused) => return Served::Reply(refused.reply),
    };
    let limit = async {
        match left {
            Some(l) => tokio::time::sleep(l).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        r = &mut call => Served::Reply(request::reply(&name, r, max)),
        () = limit => {
            call.abort();
            Served::TimedOut(request::error(format!("tool call {name:?} cancelled: the cell's timeout passed")))
        }
        ctl = control.recv() => {
            call.abort();
            Served::Control(ctl)
        }
    }
}

impl RemoteDriver {
    /// Send the cell (`request`, a runner frame) and wait for it: one exec,
    /// plus one more per tool call the cell makes (served here under the
    /// cell's `authority`); interrupts and shutdown are served meanwhile.
    pub(super) async fn wait(
        &mut self,
        live: &Live,
        request: Vec<u8>,
        timeout: Option<Duration>,
        control: &mut mpsc::UnboundedReceiver<Control>,
        authority: &Arc<Authority>,
        tools: bool,
    ) -> Waited {
        let (pid, dir, token) = (live.pid, live.dir.clone(), live.token.clone());
        let grace = self.o.kernel.interrupt_grace;
        let mut w = script::Wait {
            dir_seq: self.seq,
            pid,
            left: timeout,
            interrupted: false,
            grace,
            tools,
            respond: None,
            max_tool_payload: self.o.kernel.max_tool_payload as u64,
        };
        let mut stdin = request;
        let mut host_stop = None;
        let mut kill_at: Option<tokio::time::Instant> = None;
        let mut killed = false;
        loop {
            let script = script::cell(&dir, w);
            let deadline = w
                .left
                .map(|t| t + grace + self.o.common.transport_timeout());
            let transport = self.o.transport.clone();
            let input = std::mem::take(&mut stdin);
            let mut exec =
                tokio::spawn(async move { transport.exec(&script, input, deadline).await });
            let waited = loop {
                tokio::select! {
                    r = &mut exec => {
                        break match r {
                            Ok(Ok(out)) => self.parse_wait(&out, timeout, host_stop, killed, w.respond.is_some()),
                            Ok(Err(e)) => Waited::Transport(e.to_string()),
                            Err(e) => Waited::Transport(format!("the exec task failed: {e}")),
                        };
                    }
                    ctl = control.recv() => match ctl {
                        Some(Control::Interrupt(tx)) => {
                            if host_stop.is_none() {
                                host_stop = Some(Stop::Interrupt);
                                kill_at = Some(tokio::time::Instant::now() + grace);
                                let _ = self.quick(&script::interrupt(pid)).await;
                            }
                            let _ = tx.send(true);
                        }
                        other => return self.shut_down_in_cell(pid, &mut exec, other, host_stop).await,
                    },
                    () = async { tokio::time::sleep_until(kill_at.unwrap_or_else(tokio::time::Instant::now)).await }, if kill_at.is_some() && !killed => {
                        killed = true;
                        let _ = self.quick(&script::kill_now(pid)).await;
                    }
                }
            };
            let Waited::Tool {
                k,
                interrupted,
                left,
                body,
                size,
            } = waited
            else {
                return waited;
            };
            let served = Instant::now();
            let max = self.o.kernel.max_tool_payload;
            let reply = if size > max as u64 || body.len() > max {
                Served::Reply(request::error(format!(
                    "tool request refused: it is {size} bytes, over the {max}-byte limit; pass less data per call"
                )))
            } else {
                serve_tool(authority, w.dir_seq, &token, &body, left, max, control).await
            };
            let mut interrupted = interrupted;
            // The call's time counts against the cell's.
            let mut left = left.map(|l| {
                l.saturating_sub(served.elapsed())
                    .max(Duration::from_millis(1))
            });
            let reply = match reply {
                Served::Reply(r) => r,
                Served::TimedOut(r) if !interrupted => {
                    // As the waiting script would have: SIGINT now, then
                    // the grace.
                    let _ = self.quick(&script::interrupt(pid)).await;
                    interrupted = true;
                    left = Some(grace);
                    r
                }
                Served::TimedOut(r) => {
                    left = Some(Duration::from_millis(1));
                    r
                }
                Served::Control(ctl) => match ctl {
                    Some(Control::Interrupt(tx)) => {
                        // The cell is waiting for this call: it is cancelled,
                        // and the cell gets the SIGINT.
                        if host_stop.is_none() {
                            host_stop = Some(Stop::Interrupt);
                            kill_at = Some(tokio::time::Instant::now() + grace);
                            let _ = self.quick(&script::interrupt(pid)).await;
                        }
                        let _ = tx.send(true);
                        request::error("tool call cancelled: the cell was interrupted".into())
                    }
                    other => {
                        let _ = self.quick(&script::kill_now(pid)).await;
                        let tx = match other {
                            Some(Control::Shutdown(tx)) => tx,
                            _ => oneshot::channel().0,
                        };
                        return Waited::Done(Outcome::ShutDown(tx), host_stop, Blob::default());
                    }
                },
            };
            stdin = reply;
            if stdin.len() > max + script::REPLY_ENVELOPE as usize {
                stdin = request::error(format!(
                    "the tool's reply is {} bytes, over the {max}-byte limit; ask for less data per call",
                    stdin.len()
                ));
            }
            w.respond = Some(k);
            w.interrupted = interrupted;
            w.left = left;
        }
    }

    async fn shut_down_in_cell(
        &self,
        pid: u32,
        exec: &mut tokio::task::JoinHandle<Result<ExecOutput, super::super::transport::ExecError>>,
        ctl: Option<Control>,
        host_stop: Option<Stop>,
    ) -> Waited {
        let _ = self.quick(&script::kill_now(pid)).await;
        let _ = tokio::time::timeout(QUICK, exec).await;
        let tx = match ctl {
            Some(Control::Shutdown(tx)) => tx,
            _ => oneshot::channel().0,
        };
        Waited::Done(Outcome::ShutDown(tx), host_stop, Blob::default())
    }

    fn parse_wait(
        &self,
        out: &ExecOutput,
        timeout: Option<Duration>,
        host_stop: Option<Stop>,
        killed: bool,
        delivered: bool,
    ) -> Waited {
        let nl = out
            .stdout
            .iter()
            .position(|&b| b == b'\n')
            .unwrap_or(out.stdout.len());
        let first = String::from_utf8_lossy(&out.stdout[..nl]).into_owned();
        let rest = out.stdout.get(nl + 1..).unwrap_or_default();
        let (word, arg) = first.split_once(' ').unwrap_or((first.as_str(), ""));
        let stop = match (arg, timeout) {
            ("timeout", Some(t)) => Some(Stop::Timeout(t)),
            _ => host_stop,
        };
        let tail_blob = || Blob {
            stderr: rest.to_vec(),
            ..Blob::default()
        };
        match word {
            "TOOL" => {
                let mut parts = arg.split(' ');
                let k = parts.next().and_then(|k| k.parse::<u64>().ok());
                let interrupted = parts.next() == Some("timeout");
                let left = parts.next().and_then(|l| l.parse::<u64>().ok());
                let size = parts.next().and_then(|l| l.trim().parse::<u64>().ok());
                match (k, left, size) {
                    (Some(k), Some(left), Some(size)) => Waited::Tool {
                        k,
                        interrupted,
                        left: (left > 0).then(|| Duration::from_millis(left)),
                        body: rest.to_vec(),
                        size,
                    },
                    _ => Waited::Done(Outcome::Broken(format!("bad tool request line {first:?}")), stop, Blob::default()),
                }
            }
            "RESULT" => match parse(rest) {
                Ok(blob) => match blob.reply.clone() {
                    Some(reply) => Waited::Done(Outcome::Reply(reply), stop, blob),
                    None => Waited::Done(Outcome::Broken("the runner wrote no reply".into()), stop, blob),
                },
                Err(e) => Waited::Done(Outcome::Broken(format!("bad result file: {e}")), stop, Blob::default()),
            },
            // Once the cell is out (a tool reply was being written), a
            // vanished runner or dir is the cell's death: it may have run
            // and is never sent again.
            "DEAD" | "GONE" if delivered => {
                Waited::Done(Outcome::Died(Exit::Unknown), stop, tail_blob())
            }
            "DEAD" => Waited::NotDelivered(
                "had exited before this cell (idle self-exit, container restart or crash)".into(),
            ),
            "GONE" => Waited::NotDelivered(
                "and its kernel dir were gone before this cell (idle self-exit after idle_exit_seconds, host restart or temp cleanup)".into(),
            ),
            "DIED" if killed => Waited::Done(Outcome::KilledAfterGrace, stop, tail_blob()),
            "DIED" => Waited::Done(Outcome::Died(Exit::Unknown), stop, tail_blob()),
            "KILLED" => Waited::Done(Outcome::KilledAfterGrace, stop, tail_blob()),
            _ => Waited::Transport(format!(
                "{} ended without a verdict (exit status {:?}: {})",
                self.o.transport.describe(),
                out.status,
                out.stderr_line()
            )),
        }
    }

    /// Fail open: run the cell in a fresh process in the shipped dir.
    pub(super) async fn oneshot(
        &mut self,
        code: &str,
        dir: &str,
        why: &str,
        timeout: Option<Duration>,
        mut info: KernelInfo,
        started: Instant,
    ) -> CellResult {
        info.id = format!("r-oneshot-{}", random_hex(4));
        info.execution_count = 1;
        let s = script::oneshot(
            &self.o.common.python,
            dir,
            MAX_STREAM,
            self.o.cwd.as_deref(),
        );
        let deadline = timeout.map(|t| t + self.o.common.transport_timeout());
        let out = self
            .o
            .transport
            .exec(&s, code.as_bytes().to_vec(), deadline)
            .await;
        let waited = match out {
            Ok(out) => self.parse_wait(&out, None, None, false, false),
            Err(e) => Waited::Transport(e.to_string()),
        };
        let (report, blob) = match waited {
            Waited::Done(outcome, stop, blob) => {
                (self.report(&outcome, stop, &mut info, &blob), blob)
            }
            Waited::Tool { .. } => {
                self.stale.push((dir.to_owned(), None));
                let on = self.o.transport.describe();
                let (report, _) =
                    transport_lost(&mut info, "a one-shot cell cannot call tools", on);
                (report, Blob::default())
            }
            Waited::Transport(d) | Waited::NotDelivered(d) => {
                self.stale.push((dir.to_owned(), None));
                let on = self.o.transport.describe();
                let (report, _) = transport_lost(&mut info, &d, on);
                (report, Blob::default())
            }
        };
        let mut displays = std::mem::replace(
            &mut self.displays,
            crate::kernel::Displays::new(self.o.kernel.display.clone(), self.cleaner.clone()),
        );
        let finished = self.finisher().finish(
            report,
            info,
            &blob,
            &mut displays,
            started.elapsed().as_secs_f64(),
        );
        let mut r = self.keep_spills(finished).await;
        StateChange::CouldNotStart {
            why: why.to_owned(),
        }
        .tell(&mut r.kernel);
        r
    }
}

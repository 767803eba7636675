//! Waiting for one remote cell (one exec, serving interrupts and
//! shutdown meanwhile), reading the waiter's verdict, and the one-shot
//! fallback after a failed spawn.

use std::time::{Duration, Instant};

use cellhost_protocol::{CellResult, KernelInfo};
use tokio::sync::{mpsc, oneshot};

use super::super::result::{parse, Blob, Finisher};
use super::super::script;
use super::super::transport::ExecOutput;
use super::{Actor, Waited, MAX_STREAM, QUICK};
use crate::kernel::{random_hex, Control, Displays, Exit, Outcome, Stop};

impl Actor {
    /// Send the cell and wait for it, serving interrupts and shutdown.
    pub(super) async fn wait(
        &mut self,
        code: &str,
        timeout: Option<Duration>,
        control: &mut mpsc::UnboundedReceiver<Control>,
    ) -> Waited {
        let live = self.live.as_ref().expect("called with a live runner");
        let pid = live.pid;
        let grace = self.o.kernel.interrupt_grace;
        let script = script::cell(&live.dir, pid, self.seq, timeout, grace);
        let deadline = timeout.map(|t| t + grace + self.o.common.transport_timeout());
        let transport = self.o.transport.clone();
        let code = code.as_bytes().to_vec();
        let mut exec = tokio::spawn(async move { transport.exec(&script, code, deadline).await });
        let mut host_stop = None;
        let mut kill_at: Option<tokio::time::Instant> = None;
        let mut killed = false;
        loop {
            tokio::select! {
                r = &mut exec => {
                    return match r {
                        Ok(Ok(out)) => self.parse_wait(&out, timeout, host_stop, killed),
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
                    other => {
                        let _ = self.quick(&script::kill_now(pid)).await;
                        let _ = tokio::time::timeout(QUICK, &mut exec).await;
                        let tx = match other {
                            Some(Control::Shutdown(tx)) => tx,
                            _ => oneshot::channel().0,
                        };
                        return Waited::Done(Outcome::ShutDown(tx), host_stop, Blob::default());
                    }
                },
                () = async { tokio::time::sleep_until(kill_at.unwrap_or_else(tokio::time::Instant::now)).await }, if kill_at.is_some() && !killed => {
                    killed = true;
                    let _ = self.quick(&script::kill_now(pid)).await;
                }
            }
        }
    }

    fn parse_wait(
        &self,
        out: &ExecOutput,
        timeout: Option<Duration>,
        host_stop: Option<Stop>,
        killed: bool,
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
            "RESULT" => match parse(rest) {
                Ok(blob) => match blob.reply.clone() {
                    Some(reply) => Waited::Done(Outcome::Reply(reply), stop, blob),
                    None => Waited::Done(Outcome::Broken("the runner wrote no reply".into()), stop, blob),
                },
                Err(e) => Waited::Done(Outcome::Broken(format!("bad result file: {e}")), stop, Blob::default()),
            },
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
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn oneshot(
        &mut self,
        code: &str,
        dir: &str,
        why: &str,
        timeout: Option<Duration>,
        mut info: KernelInfo,
        displays: &mut Displays,
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
        let note = format!(
            "The remote kernel could not start ({why}), so this cell ran one-shot in a fresh process: no state is kept between cells; the next cell tries to start a kernel again."
        );
        let waited = match out {
            Ok(out) => self.parse_wait(&out, None, None, false),
            Err(e) => Waited::Transport(e.to_string()),
        };
        let mut r = match waited {
            Waited::Done(outcome, stop, blob) => {
                let (report, _) = self.report(&outcome, stop, &mut info, "", &blob, displays);
                Finisher {
                    output: &self.o.kernel.output,
                    cleaner: &self.cleaner,
                    spill_dir: &self.o.kernel.spill_dir,
                }
                .finish(
                    report,
                    info,
                    &blob.stdout,
                    &blob.stderr,
                    displays,
                    started.elapsed().as_secs_f64(),
                )
            }
            Waited::Transport(d) | Waited::NotDelivered(d) => {
                self.stale = Some((dir.to_owned(), None));
                self.transport_lost(d, info, started)
            }
        };
        r.kernel.note = Some(match r.kernel.note.take() {
            Some(n) => format!("{note} {n}"),
            None => note,
        });
        r
    }
}

//! The actor's snapshot turn: between cells, the runner writes its
//! namespace to (or loads it from) a FIFO the host pumps (`kernel/
//! snapshot.rs`). It runs through the driver as a cell does, so its
//! output is drained, a death is noticed and the kernel is vacated with
//! the reason; it is never counted as a cell and never changes what the
//! next cell is told about reuse.

use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::op::Turned;
use super::{Actor, Slot};
use crate::kernel::driver::Driver;
use crate::kernel::frame::Frame;
use crate::kernel::snapshot::{self, Fifo, Job, SnapshotError, Summary};
use crate::kernel::Control;

/// What a snapshot turn gave back, and the shutdown it ended in.
pub(super) type Snapshotted = (Result<Summary, SnapshotError>, Option<oneshot::Sender<()>>);

impl<D: Driver> Actor<D> {
    pub(super) async fn snapshot(
        &mut self,
        job: Job,
        timeout: Duration,
        control: &mut mpsc::UnboundedReceiver<Control>,
    ) -> Snapshotted {
        let Slot::Live(live) = &mut self.slot else {
            return (Err(SnapshotError::NoKernel), None);
        };
        // A local kernel streams through a FIFO the host pumps; a remote
        // one keeps the snapshot in a file of its own host.
        let (place, path) = match self.driver.fifo_dir(live) {
            Some((host_dir, kernel_dir)) => {
                let fifo = match Fifo::start(&host_dir, &job) {
                    Ok(f) => f,
                    Err(e) => return (Err(e), None),
                };
                let in_kernel = kernel_dir.join(fifo.path.file_name().unwrap_or_default());
                (Place::Fifo(fifo), in_kernel.to_string_lossy().into_owned())
            }
            None if self.driver.snapshot_files() => (Place::File, job.file_name()),
            None => {
                let backend = self.driver.backend();
                return (Err(SnapshotError::Unsupported { backend }), None);
            }
        };
        let request = Frame::new()
            .with("op", job.op())
            .with("path", path.as_bytes())
            .with("max", job.max().to_string().as_bytes())
            .encode();
        let in_files = matches!(place, Place::File);
        // Once the runner is done with its end: collect what the pump did.
        let (turned, pumped) = self
            .op_turn(request, timeout, control, place.release())
            .await;
        let (reply, timed_out, gone, shutdown) = match turned {
            Turned::Ran {
                reply,
                timed_out,
                gone,
                shutdown,
            } => (reply, timed_out, gone, shutdown),
            Turned::Failed(why) => {
                discard(&job);
                return (Err(SnapshotError::KernelGone(why)), None);
            }
            Turned::NoKernel => {
                discard(&job);
                return (Err(SnapshotError::NoKernel), None);
            }
        };
        let reply = reply.map(|frame| {
            (
                frame.text("status"),
                frame.text("value"),
                frame.text("error"),
            )
        });
        let result = match reply {
            _ if timed_out => Err(SnapshotError::TimedOut {
                op: job.op(),
                seconds: timeout.as_secs(),
            }),
            Some((Some(status), Some(value), _)) if status == "ok" => {
                snapshot::parse_summary(&value).and_then(|(names, skipped)| {
                    let (raw_bytes, bytes) = if in_files {
                        let n = snapshot::parse_file_bytes(&value);
                        (n, n)
                    } else {
                        pumped?
                    };
                    Ok(Summary {
                        names,
                        skipped,
                        raw_bytes,
                        bytes,
                    })
                })
            }
            // Over the cap: the pump stopped reading, so the runner's
            // write failed; the cap is the reason.
            Some(_) if matches!(pumped, Err(SnapshotError::TooLarge { .. })) => {
                Err(pumped.err().unwrap_or(SnapshotError::NoKernel))
            }
            // A remote runner counts its file against the cap itself.
            Some((_, _, Some(error))) if in_files && error.contains("over the snapshot cap") => {
                Err(SnapshotError::TooLarge {
                    max_mib: job.max() >> 20,
                })
            }
            Some((_, _, error)) => Err(SnapshotError::Runner(
                error.unwrap_or_else(|| "the runner gave no reason".into()),
            )),
            None => Err(SnapshotError::KernelGone(
                gone.unwrap_or_else(|| "it stopped".into()),
            )),
        };
        if result.is_err() {
            discard(&job);
        }
        (result, shutdown)
    }
}

/// Where a snapshot turn's stream goes.
enum Place {
    /// Through this FIFO, pumped by this blocking task.
    Fifo(Fifo),
    /// Into a file on the remote kernel's host.
    File,
}

impl Place {
    /// The runner is done: what the pump did (nothing to do for a file).
    async fn release(self) -> snapshot::Pumped {
        match self {
            Place::Fifo(fifo) => fifo.release().await,
            Place::File => Ok((0, 0)),
        }
    }
}

/// A snapshot that failed after its pump ran: the pump may have put a
/// stream in place that the runner did not finish (timed out, died), and
/// it stands for nothing.
fn discard(job: &Job) {
    if let Job::Take { dest, .. } = job {
        let _ = std::fs::remove_file(dest);
    }
}

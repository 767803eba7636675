//! Waiting for one cell: sending it, reading its output, enforcing the
//! timeout (SIGINT first, kill after the grace), handling interrupts, and
//! draining the pipes once the runner has replied.
//!
//! Output completeness without markers: the runner writes its reply only
//! after its own writes to fds 1 and 2 have returned, so once the reply
//! arrives every byte the cell wrote is already in the pipes. A
//! non-blocking drain after the reply collects it all.
//!
//! Display frames may come before the reply (and between cells, from
//! threads): each one is handed to the cell's [`Displays`] as it arrives.
//! The same argument orders a watched cell's displays with its output:
//! before each display the runner sends `sync` and waits; the host drains
//! stdout and stderr into the cell's stream, then acks (see [`order`]).

use std::io;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::io::AsyncWriteExt;
use tokio::net::unix::pipe;
use tokio::sync::mpsc;

use super::display::Displays;
use super::frame::Frame;
use super::process::{Exit, Process};
use super::Control;
use crate::output::Capture;

/// Reads per readiness event, so a flooding cell cannot starve the rest.
const READS_PER_WAKE: usize = 16;

/// Reply-pipe wakes in a row that brought only displays, after which the
/// timer, interrupts and output get one turn even though the reply pipe
/// is ready again: a flood of display frames must not starve them.
const DISPLAY_WAKES_IN_A_ROW: u32 = 16;

/// Why the runner is being asked to stop the cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    Timeout(Duration),
    Interrupt,
}

/// How waiting for a cell ended.
pub(crate) enum Outcome {
    /// The runner was already dead when the cell was sent: the cell never
    /// ran, so it can run in a fresh kernel.
    NotDelivered(Exit),
    Reply(Frame),
    Died(Exit),
    KilledAfterGrace,
    Broken(String),
    ShutDown(tokio::sync::oneshot::Sender<()>),
}

/// One stream's reader state: the pipe hit EOF once every writer is gone.
pub(super) struct Streams {
    pub out: Capture,
    pub err: Capture,
    pub out_eof: bool,
    pub err_eof: bool,
    pub ctrl_eof: bool,
    /// Displays of the running cell (or, between cells, of the next one).
    pub displays: Displays,
}

/// What the complete frames read so far on the reply pipe amount to.
pub(super) enum Frames {
    /// Nothing but displays (now in `displays`).
    Pending,
    Done(Frame),
    /// The runner waits for its earlier output to be read before it sends
    /// a display (a watched cell, see [`order`]).
    Sync,
    Broken(String),
}

/// Hand every complete frame in `proc.frames` to `displays` until the
/// reply (`op=done`) shows up.
pub(super) fn take_frames(proc: &mut Process, displays: &mut Displays) -> Frames {
    loop {
        match proc.frames.next_frame() {
            Ok(Some(frame)) => match frame.text("op").as_deref() {
                Some("display") => displays.accept(frame),
                Some("done") => return Frames::Done(frame),
                Some("sync") => return Frames::Sync,
                _ => return Frames::Broken("unexpected control frame".into()),
            },
            Ok(None) => return Frames::Pending,
            Err(e) => return Frames::Broken(format!("bad control frame: {e}")),
        }
    }
}

/// The runner sent `sync` before a display of a watched cell: read what
/// it wrote to stdout and stderr before (the cell's stream gets it
/// first), then ack on the request pipe so it sends the display.
///
/// The runner flushed its streams and blocks until the ack, so every
/// byte it wrote before the sync is already in the pipes and one drain
/// collects it. The request pipe is empty (the runner read the whole
/// exec frame, and nothing else is sent during a cell), so the small
/// ack always fits: a direct non-blocking write.
fn order(proc: &mut Process, s: &mut Streams, buf: &mut [u8]) -> Result<(), String> {
    use std::os::fd::AsFd;
    drain(proc, s, buf);
    let ack = ack_frame();
    match nix::unistd::write(proc.ctrl_tx.as_fd(), &ack) {
        Ok(n) if n == ack.len() => Ok(()),
        Ok(_) => Err("the runner's request pipe took part of a sync ack".into()),
        Err(e) => Err(format!("failed to ack the runner's sync: {e}")),
    }
}

/// Before reading output of a syncing runner: take the frames already in
/// the reply pipe. Output readable now was written after them, so a
/// display the cell made before a print is handed on before the print.
/// Direct reads, as in [`reply_left_in_pipe`]. `Some`: the cell ended.
async fn displays_first(
    proc: &mut Process,
    s: &mut Streams,
    buf: &mut [u8],
    stop: Option<Stop>,
    held: &mut Held,
) -> Option<(Outcome, Option<Stop>)> {
    use std::os::fd::AsFd;
    if s.ctrl_eof {
        return None;
    }
    // Bounded, as every read loop here: a flooding thread cannot hold us.
    for _ in 0..READS_PER_WAKE {
        match nix::unistd::read(proc.ctrl_rx.as_fd(), buf) {
            Ok(0) => {
                s.ctrl_eof = true;
                break;
            }
            Ok(n) => proc.frames.extend(&buf[..n]),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => break,
        }
        match take_frames(proc, &mut s.displays) {
            Frames::Pending => continue,
            Frames::Done(frame) => return Some((Outcome::Reply(frame), stop)),
            Frames::Sync => {
                // What was held was written before this sync: it goes
                // before what the sync's drain reads.
                held.release(s);
                if let Err(detail) = order(proc, s, buf) {
                    proc.kill_now().await;
                    return Some((Outcome::Broken(detail), stop));
                }
            }
            Frames::Broken(detail) => {
                proc.kill_now().await;
                return Some((Outcome::Broken(detail), stop));
            }
        }
    }
    None
}

/// A syncing runner's output is readable: hold it, take the display
/// frames already sent (they were written before it), then hand the
/// output on. `Some`: the cell ended.
async fn output_after_displays(
    proc: &mut Process,
    s: &mut Streams,
    buf: &mut [u8],
    stop: Option<Stop>,
    woke_out: bool,
) -> Option<(Outcome, Option<Stop>)> {
    let mut held = Held::take(proc, s, buf, woke_out);
    let end = displays_first(proc, s, buf, stop, &mut held).await;
    held.release(s);
    end
}

/// Output of a syncing runner read before its display frames are taken:
/// the runner writes a display's frame before the output that follows
/// it, so whatever the pipes hold now goes after every frame the reply
/// pipe holds now (read next). Reading the frames first would race: a
/// frame and the print after it can both land between the two reads, and
/// the print would be handed on first.
#[derive(Default)]
struct Held {
    out: Vec<u8>,
    err: Vec<u8>,
}

impl Held {
    /// Take what stdout and stderr hold now (bounded). The pipe whose
    /// readiness woke us is read through tokio (so its readiness clears
    /// at EAGAIN and the wake is not repeated), the other one directly
    /// (tokio may not have seen its bytes yet).
    fn take(proc: &Process, s: &mut Streams, buf: &mut [u8], woke_out: bool) -> Held {
        let mut held = Held::default();
        for (rx, eof, into, woke) in [
            (&proc.stdout, &mut s.out_eof, &mut held.out, woke_out),
            (&proc.stderr, &mut s.err_eof, &mut held.err, !woke_out),
        ] {
            for _ in 0..READS_PER_WAKE {
                if *eof {
                    break;
                }
                match read_once(rx, buf, woke) {
                    Ok(0) => *eof = true,
                    Ok(n) => {
                        into.extend_from_slice(&buf[..n]);
                        continue;
                    }
                    Err(nix::errno::Errno::EINTR) => continue,
                    Err(nix::errno::Errno::EAGAIN) => {}
                    Err(_) => *eof = true,
                }
                break;
            }
        }
        held
    }

    /// Hand what is held to the cell's captures (once).
    fn release(&mut self, s: &mut Streams) {
        if !self.out.is_empty() {
            s.out.push(&std::mem::take(&mut self.out));
        }
        if !self.err.is_empty() {
            s.err.push(&std::mem::take(&mut self.err));
        }
    }
}

fn read_once(rx: &pipe::Receiver, buf: &mut [u8], via_tokio: bool) -> nix::Result<usize> {
    use std::os::fd::AsFd;
    if !via_tokio {
        return nix::unistd::read(rx.as_fd(), buf);
    }
    rx.try_read(buf).map_err(|e| match e.kind() {
        io::ErrorKind::WouldBlock => nix::errno::Errno::EAGAIN,
        io::ErrorKind::Interrupted => nix::errno::Errno::EINTR,
        _ => nix::errno::Errno::EIO,
    })
}

/// The host's answer to a `sync` frame.
fn ack_frame() -> Vec<u8> {
    Frame::new().with("op", "ack").encode()
}

/// Send the request and wait for the cell to settle, enforcing the
/// timeout (SIGINT, then kill after `grace`) and handling interrupts.
/// A complete `done` frame still in the reply pipe of a runner that has
/// exited (direct reads: the reactor may not have seen the bytes yet).
fn reply_left_in_pipe(proc: &mut Process, s: &mut Streams, buf: &mut [u8]) -> Option<Frame> {
    use std::os::fd::AsFd;
    while let Ok(n @ 1..) = nix::unistd::read(proc.ctrl_rx.as_fd(), buf) {
        proc.frames.extend(&buf[..n]);
    }
    match take_frames(proc, &mut s.displays) {
        Frames::Done(frame) => Some(frame),
        _ => None,
    }
}

pub(super) async fn wait_for_cell(
    proc: &mut Process,
    s: &mut Streams,
    buf: &mut [u8],
    request: &[u8],
    timeout: Option<Duration>,
    grace: Duration,
    control: &mut mpsc::UnboundedReceiver<Control>,
) -> (Outcome, Option<Stop>) {
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let mut stop: Option<Stop> = None;
    let mut kill_at: Option<tokio::time::Instant> = None;
    let mut display_wakes = 0u32;
    // The runner syncs its displays (a watched cell): from its first
    // sync on, output is read only after the frames already sent.
    let mut ordered = false;

    // Send the cell. write_all is not cancel safe, but if it is cancelled
    // the kernel is killed anyway.
    let send = proc.ctrl_tx.write_all(request);
    let sent = tokio::select! {
        r = send => r.map_err(|e| format!("failed to send the cell: {e}")),
        status = proc.child.wait() => {
            let exit = status.map_or(Exit::Unknown, Exit::from_status).unwrapped(proc.wrapped);
            proc.exited = Some(exit);
            return (Outcome::NotDelivered(exit), None);
        }
        () = sleep_until_opt(deadline) => Err("the kernel did not accept the cell before its timeout".into()),
    };
    if let Err(detail) = sent {
        // A runner that died just now closes its pipe: report the death
        // (a forked one's exit status is not ours to see: `Unknown`).
        if let Ok(status) = tokio::time::timeout(Duration::from_secs(1), proc.child.wait()).await {
            let exit = status
                .map_or(Exit::Unknown, Exit::from_status)
                .unwrapped(proc.wrapped);
            proc.exited = Some(exit);
            return (Outcome::NotDelivered(exit), None);
        }
        proc.kill_now().await;
        return (Outcome::Broken(detail), timeout.map(Stop::Timeout));
    }

    loop {
        let wake = match (stop, kill_at) {
            (_, Some(k)) => Some(k),
            (None, None) => deadline,
            (Some(_), None) => None,
        };
        tokio::select! {
            // In this order: the reply first (when it and the runner's exit
            // are both ready, the reply tells more), output last.
            biased;
            r = proc.ctrl_rx.readable(), if !s.ctrl_eof && display_wakes < DISPLAY_WAKES_IN_A_ROW => {
                if r.is_err() {
                    s.ctrl_eof = true;
                    continue;
                }
                // Several reads per wake: a display can be megabytes.
                let mut synced = false;
                for _ in 0..READS_PER_WAKE {
                    match proc.ctrl_rx.try_read(buf) {
                        Ok(0) => s.ctrl_eof = true,
                        Ok(n) => {
                            proc.frames.extend(&buf[..n]);
                            match take_frames(proc, &mut s.displays) {
                                Frames::Done(frame) => return (Outcome::Reply(frame), stop),
                                Frames::Broken(detail) => {
                                    proc.kill_now().await;
                                    return (Outcome::Broken(detail), stop);
                                }
                                Frames::Sync => {
                                    if let Err(detail) = order(proc, s, buf) {
                                        proc.kill_now().await;
                                        return (Outcome::Broken(detail), stop);
                                    }
                                    synced = true;
                                    ordered = true;
                                    continue;
                                }
                                Frames::Pending => continue,
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(_) => s.ctrl_eof = true,
                    }
                    break;
                }
                // A runner that syncs waits for us between displays, so
                // it cannot flood; and the reply pipe must stay first, or
                // output printed after a display would be read before it.
                display_wakes = if synced { 0 } else { display_wakes + 1 };
            }
            status = proc.child.wait() => {
                let exit = status.map_or(Exit::Unknown, Exit::from_status).unwrapped(proc.wrapped);
                proc.exited = Some(exit);
                // A runner that replied and then exited (sys.exit) may be
                // seen exiting before its reply is read: read it first.
                if let Some(frame) = reply_left_in_pipe(proc, s, buf) {
                    return (Outcome::Reply(frame), stop);
                }
                return (Outcome::Died(exit), stop);
            }
            () = sleep_until_opt(wake) => {
                if kill_at.is_some() {
                    proc.kill_now().await;
                    return (Outcome::KilledAfterGrace, stop);
                }
                // The deadline passed: interrupt first, kill only if needed.
                stop = timeout.map(Stop::Timeout);
                proc.signal(Signal::SIGINT);
                kill_at = Some(tokio::time::Instant::now() + grace);
            }
            ctl = control.recv() => match ctl {
                Some(Control::Interrupt(tx)) => {
                    if stop.is_none() {
                        stop = Some(Stop::Interrupt);
                        proc.signal(Signal::SIGINT);
                        kill_at = Some(tokio::time::Instant::now() + grace);
                    } else {
                        // A repeated interrupt: signal again, keep the
                        // original deadline for the kill.
                        proc.signal(Signal::SIGINT);
                    }
                    let _ = tx.send(true);
                }
                Some(Control::Shutdown(tx)) => {
                    proc.kill_now().await;
                    return (Outcome::ShutDown(tx), stop);
                }
                None => {
                    // Every handle is gone: nobody will read the result.
                    proc.kill_now().await;
                    return (Outcome::Broken("all kernel handles were dropped".into()), stop);
                }
            },
            // Output last: a cell that floods its pipes must not starve the
            // timer, interrupts or its own reply.
            r = proc.stdout.readable(), if !s.out_eof => {
                if ordered && r.is_ok() {
                    if let Some(end) = output_after_displays(proc, s, buf, stop, true).await { return end; }
                    continue;
                }
                if r.is_err() || pump(&proc.stdout, buf, &mut s.out) { s.out_eof = true; }
            }
            r = proc.stderr.readable(), if !s.err_eof => {
                if ordered && r.is_ok() {
                    if let Some(end) = output_after_displays(proc, s, buf, stop, false).await { return end; }
                    continue;
                }
                if r.is_err() || pump(&proc.stderr, buf, &mut s.err) { s.err_eof = true; }
            }
            // Ready on its second poll: the other arms had their turn.
            () = tokio::task::yield_now(), if display_wakes >= DISPLAY_WAKES_IN_A_ROW => {
                display_wakes = 0;
            }
        }
    }
}

async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Read what is available into `sink`. Returns `true` at EOF.
pub(super) fn pump(rx: &pipe::Receiver, buf: &mut [u8], sink: &mut Capture) -> bool {
    for _ in 0..READS_PER_WAKE {
        match rx.try_read(buf) {
            Ok(0) => return true,
            Ok(n) => sink.push(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return true,
        }
    }
    false
}

/// After the reply: collect everything already in the pipes. Bounded, so
/// a leftover background writer cannot keep us here.
pub(super) fn drain(proc: &Process, s: &mut Streams, buf: &mut [u8]) {
    use std::os::fd::AsRawFd;
    for _ in 0..64 {
        // One poll(2) says which pipes hold bytes (or hit EOF): cheaper
        // than a read per pipe that mostly answers EAGAIN.
        let mut fds = [
            libc::pollfd {
                fd: if s.out_eof {
                    -1
                } else {
                    proc.stdout.as_raw_fd()
                },
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: if s.err_eof {
                    -1
                } else {
                    proc.stderr.as_raw_fd()
                },
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a valid array of two pollfd for the call.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), 2, 0) };
        if ready == 0 {
            return;
        }
        if ready < 0 && std::io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return;
        }
        if fds[0].revents != 0 {
            s.out_eof |= pump_once(&proc.stdout, buf, &mut s.out) == Some(true);
        }
        if fds[1].revents != 0 {
            s.err_eof |= pump_once(&proc.stderr, buf, &mut s.err) == Some(true);
        }
    }
}

/// One read: `Some(true)` at EOF, `Some(false)` when empty, `None` when it
/// got bytes (there may be more).
///
/// This is a direct `read(2)` on the non-blocking fd, not `try_read`:
/// tokio's `try_read` answers `WouldBlock` without a syscall when its
/// reactor has not yet seen the readiness event, which would lose bytes
/// that are already in the pipe.
fn pump_once(rx: &pipe::Receiver, buf: &mut [u8], sink: &mut Capture) -> Option<bool> {
    use std::os::fd::AsFd;
    match nix::unistd::read(rx.as_fd(), buf) {
        Ok(0) => Some(true),
        Ok(n) => {
            sink.push(&buf[..n]);
            None
        }
        Err(nix::errno::Errno::EAGAIN) => Some(false),
        Err(nix::errno::Errno::EINTR) => None,
        Err(_) => Some(true),
    }
}

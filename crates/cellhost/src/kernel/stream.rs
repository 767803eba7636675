//! Streaming a running cell's stdout and stderr to its event sink.
//!
//! Only a cell with a sink pays for it: a [`LineTap`] goes on each of the
//! cell's captures and turns released text into [`CellEvent::Stdout`] and
//! [`CellEvent::Stderr`]. The captures are replaced when the cell ends,
//! and the taps flush with them, so nothing is streamed between cells.

use tokio::sync::mpsc::UnboundedSender;

use cellhost_protocol::OutputStream;

use super::wait::Streams;
use super::CellEvent;
use crate::output::{Cleaner, LineTap, OutputLimits};

/// Put taps on `streams`' captures that send to `sink`.
pub(super) fn tap(
    streams: &mut Streams,
    sink: &UnboundedSender<CellEvent>,
    cleaner: &Cleaner,
    limits: &OutputLimits,
) {
    let out = sink.clone();
    streams.out.tap(
        LineTap::new(
            "stdout",
            limits.cap_bytes,
            cleaner.clone(),
            Box::new(move |text| {
                let _ = out.send(CellEvent::Stdout(text));
            }),
        )
        .on_stop(stopped(sink, OutputStream::Stdout)),
    );
    let err = sink.clone();
    streams.err.tap(
        LineTap::new(
            "stderr",
            limits.cap_bytes,
            cleaner.clone(),
            Box::new(move |text| {
                let _ = err.send(CellEvent::Stderr(text));
            }),
        )
        .on_stop(stopped(sink, OutputStream::Stderr)),
    );
}

/// Tells `sink` that `stream`'s streaming stopped at the cap.
fn stopped(sink: &UnboundedSender<CellEvent>, stream: OutputStream) -> crate::output::OnStop {
    let sink = sink.clone();
    Box::new(move |after_bytes| {
        let _ = sink.send(CellEvent::StreamStopped {
            stream,
            after_bytes,
        });
    })
}

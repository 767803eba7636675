//! Bounds on cells in flight: a busy kernel queues its session's next
//! cells (in arrival order), and each holds its code in memory until it
//! has run and been recorded. Past `[server] max_queued_cells_per_session`
//! waiting cells, or past the bytes of code allowed per session or in
//! total, a request is refused with 429 and `Retry-After` instead of
//! queueing. A [`Ticket`] holds a cell's place until it is dropped (the
//! cell settled and was recorded).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::http::StatusCode;

use crate::conn::HttpLimits;
use crate::ApiError;

/// Seconds a refused client is asked to wait.
pub(crate) const RETRY_AFTER_SECONDS: u64 = 2;

#[derive(Debug, Default)]
struct Pending {
    /// Per session: (cells, bytes of code).
    sessions: HashMap<String, (usize, usize)>,
    bytes: usize,
}

/// Cells in flight, per session and in total.
#[derive(Debug, Default, Clone)]
pub(crate) struct Queue(Arc<Mutex<Pending>>);

/// One admitted cell's place.
#[derive(Debug)]
pub(crate) struct Ticket {
    queue: Queue,
    session: String,
    bytes: usize,
}

impl Queue {
    /// Admit a cell of `session` with `bytes` of code, or say why not.
    pub(crate) fn admit(
        &self,
        limits: &HttpLimits,
        session: &str,
        bytes: usize,
    ) -> Result<Ticket, ApiError> {
        let mut p = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (cells, held) = p.sessions.get(session).copied().unwrap_or((0, 0));
        // One cell runs; the others wait behind it.
        let refusal = if cells > limits.max_queued_cells_per_session {
            Some(format!(
                "session {session:?} already has {cells} cells waiting or running (at most {} may \
                 wait behind the running one, [server] max_queued_cells_per_session)",
                limits.max_queued_cells_per_session
            ))
        } else if cells > 0 && held + bytes > limits.max_queued_bytes_per_session {
            Some(format!(
                "session {session:?} already has {held} bytes of code in cells waiting or running \
                 (at most {}, [server] max_queued_bytes_per_session)",
                limits.max_queued_bytes_per_session
            ))
        } else if p.bytes + bytes > limits.max_queued_bytes {
            Some(format!(
                "the server already holds {} bytes of code in cells waiting or running (at most \
                 {}, [server] max_queued_bytes)",
                p.bytes, limits.max_queued_bytes
            ))
        } else {
            None
        };
        if let Some(why) = refusal {
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_queued",
                format!(
                    "{why}; wait for the running cell to finish (retry after \
                     {RETRY_AFTER_SECONDS} s) or interrupt it"
                ),
            )
            .retry_after(RETRY_AFTER_SECONDS));
        }
        let e = p.sessions.entry(session.to_owned()).or_insert((0, 0));
        e.0 += 1;
        e.1 += bytes;
        p.bytes += bytes;
        Ok(Ticket {
            queue: self.clone(),
            session: session.to_owned(),
            bytes,
        })
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut p = self.queue.0.lock().unwrap_or_else(|e| e.into_inner());
        p.bytes -= self.bytes;
        if let Some(e) = p.sessions.get_mut(&self.session) {
            e.0 -= 1;
            e.1 -= self.bytes;
            if e.0 == 0 {
                p.sessions.remove(&self.session);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_past_the_bounds_are_refused_and_places_come_back() {
        let limits = HttpLimits {
            max_queued_cells_per_session: 1,
            max_queued_bytes_per_session: 100,
            max_queued_bytes: 150,
            ..HttpLimits::default()
        };
        let q = Queue::default();
        let running = q.admit(&limits, "s", 10).unwrap();
        let waiting = q.admit(&limits, "s", 10).unwrap();
        let e = q.admit(&limits, "s", 10).unwrap_err();
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(
            e.message.contains("max_queued_cells_per_session"),
            "{}",
            e.message
        );
        drop(waiting);
        let e = q.admit(&limits, "s", 95).unwrap_err();
        assert!(
            e.message.contains("max_queued_bytes_per_session"),
            "{}",
            e.message
        );
        let other = q.admit(&limits, "t", 120).unwrap();
        let e = q.admit(&limits, "u", 30).unwrap_err();
        assert!(
            e.message.contains("max_queued_bytes]") || e.message.contains("max_queued_bytes)"),
            "{}",
            e.message
        );
        drop((running, other));
        assert!(q.0.lock().unwrap().sessions.is_empty());
        assert_eq!(q.0.lock().unwrap().bytes, 0);
    }
}

//! The session event bus: everything that happens in a session, for
//! whoever watches it live (`GET /v1/sessions/{session}/events`,
//! `cellhost attach`, the dashboard).
//!
//! The [`KernelManager`](crate::registry::KernelManager) publishes: a
//! cell's start, its cleaned and redacted output as it streams (the same
//! tap as the execute route's Server-Sent Events), its displays, its end,
//! and what happens to the session's kernels (spawned, evicted, reaped,
//! reset, died, disposed). Every front end's cells go through the manager,
//! so HTTP, MCP, Jupyter and library cells all appear. Front ends only
//! serialize what they receive.
//!
//! Each session (owner: a session, or `{session}::child::{child}`) has
//! its own sequence of event ids, increasing by one per event while the
//! manager lives. Each [`Watcher`] has a bounded queue: publishing never
//! waits for a watcher (`try_send`); one whose queue is full is cut off,
//! gets the events already queued, then one `dropped` event saying how
//! many it missed, then its stream ends. A watcher costs a cell nothing
//! but one queue push per event; a session nobody watches costs an id
//! increment.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::Serialize;
use serde_json::json;
use tokio::sync::mpsc;

/// Events queued for one watcher before it is dropped as too slow.
pub const DEFAULT_WATCHER_BUFFER: usize = 256;

/// Which front end a cell came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FrontEnd {
    /// The daemon's HTTP API (`POST /v1/sessions/{session}/execute`).
    Http,
    /// An MCP client (the `execute` tool).
    Mcp,
    /// A Jupyter client over the daemon's kernel WebSocket.
    Jupyter,
    /// A program using the library directly (also `cellhost run`).
    #[default]
    Library,
}

impl FrontEnd {
    /// The name in events and metrics: `http`, `mcp`, `jupyter`,
    /// `library` (as serialized).
    pub fn as_str(self) -> &'static str {
        match self {
            FrontEnd::Http => "http",
            FrontEnd::Mcp => "mcp",
            FrontEnd::Jupyter => "jupyter",
            FrontEnd::Library => "library",
        }
    }
}

/// What happened to a session's kernel (`kernel` events).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KernelChange {
    /// A kernel process started for the session (or came from the pool).
    Spawned,
    /// Stopped to keep at most `max_kernels` (least recently used).
    Evicted,
    /// Stopped after `idle_timeout` without a cell.
    Reaped,
    /// A cell asked for a reset: the process restarted before it ran.
    Reset,
    /// The kernel died or was killed during a cell (timeout, crash,
    /// memory limit, `sys.exit()`).
    Died,
    /// The session (or child) was reset or closed on request.
    Disposed,
    /// State was restored from a snapshot (published by snapshot routes).
    Restored,
    /// The session was forked into another (published by fork routes).
    Forked,
}

impl KernelChange {
    /// The `change` of a `kernel` event: the variant's name in lowercase
    /// (as serialized).
    pub fn as_str(self) -> &'static str {
        match self {
            KernelChange::Spawned => "spawned",
            KernelChange::Evicted => "evicted",
            KernelChange::Reaped => "reaped",
            KernelChange::Reset => "reset",
            KernelChange::Died => "died",
            KernelChange::Disposed => "disposed",
            KernelChange::Restored => "restored",
            KernelChange::Forked => "forked",
        }
    }
}

/// One event of a session, ready to send: an SSE `event:` name, an `id:`
/// (0 for `dropped`, which is not part of the session's sequence) and
/// JSON `data:`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionEvent {
    /// The session's event id: 1, 2, … per session (starting over once a
    /// closed session is forgotten); 0 for `dropped`.
    pub id: u64,
    /// `cell_started`, `stdout`, `stderr`, `display`, `cell_finished`,
    /// `kernel` or `dropped`.
    pub name: &'static str,
    /// The event's JSON object.
    pub data: String,
}

impl SessionEvent {
    /// The data as a JSON value (for programs that inspect events).
    pub fn value(&self) -> serde_json::Value {
        serde_json::from_str(&self.data).unwrap_or(serde_json::Value::Null)
    }
}

struct Tx {
    tx: mpsc::Sender<Arc<SessionEvent>>,
    cut: Arc<AtomicBool>,
}

#[derive(Default)]
struct Topic {
    /// The id of the session's last event.
    seq: u64,
    watchers: Vec<Tx>,
}

#[derive(Default)]
struct Inner {
    topics: Mutex<HashMap<String, Topic>>,
}

impl Inner {
    fn topics(&self) -> MutexGuard<'_, HashMap<String, Topic>> {
        self.topics.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The bus. Cheap to clone; clones share it.
#[derive(Clone)]
pub struct EventBus {
    inner: Arc<Inner>,
    buffer: usize,
    muted: bool,
    /// Redacts secrets from announced code (as the history does).
    cleaner: Option<crate::output::Cleaner>,
}

impl std::fmt::Debug for EventBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventBus")
            .field("buffer", &self.buffer)
            .finish_non_exhaustive()
    }
}

impl Default for EventBus {
    fn default() -> Self {
        EventBus::new(DEFAULT_WATCHER_BUFFER)
    }
}

impl EventBus {
    /// A bus whose watchers each queue at most `buffer` events.
    pub fn new(buffer: usize) -> EventBus {
        EventBus {
            inner: Arc::default(),
            buffer: buffer.max(1),
            muted: false,
            cleaner: None,
        }
    }

    /// Redact these secret values (and known token formats) from the code
    /// of `cell_started` events, as the history does.
    pub fn redacting(mut self, secrets: impl IntoIterator<Item = String>) -> EventBus {
        self.cleaner = Some(crate::output::Cleaner::new(secrets));
        self
    }

    /// A bus that publishes nothing (for hidden cells).
    pub fn muted() -> EventBus {
        EventBus {
            muted: true,
            ..EventBus::new(1)
        }
    }

    /// Watch `owner` (a session, or `{session}::child::{child}`) from
    /// now on. The owner need not exist yet: its first cell's events
    /// arrive when it runs.
    pub fn subscribe(&self, owner: &str) -> Watcher {
        let (tx, rx) = mpsc::channel(self.buffer);
        let cut = Arc::new(AtomicBool::new(false));
        let mut topics = self.inner.topics();
        let topic = topics.entry(owner.to_owned()).or_default();
        topic.watchers.push(Tx {
            tx,
            cut: cut.clone(),
        });
        Watcher {
            rx,
            cut,
            inner: self.inner.clone(),
            owner: owner.to_owned(),
            last_id: topic.seq,
            finished: false,
        }
    }

    /// Watchers of `owner` right now.
    pub fn watchers(&self, owner: &str) -> usize {
        self.inner
            .topics()
            .get(owner)
            .map_or(0, |t| t.watchers.len())
    }

    /// Whether anyone watches `owner` (publishing to nobody only counts).
    fn watched(&self, owner: &str) -> bool {
        self.watchers(owner) > 0
    }

    /// Publish one event to `owner`'s watchers; `data` is built only when
    /// someone watches. Never waits: a watcher whose queue is full is cut
    /// off (it gets `dropped` after what it has queued).
    pub fn publish(&self, owner: &str, name: &'static str, data: impl FnOnce() -> String) {
        if self.muted {
            return;
        }
        let data = if self.watched(owner) {
            Some(data())
        } else {
            None
        };
        let mut topics = self.inner.topics();
        let topic = topics.entry(owner.to_owned()).or_default();
        topic.seq += 1;
        let Some(data) = data else { return };
        let event = Arc::new(SessionEvent {
            id: topic.seq,
            name,
            data,
        });
        topic
            .watchers
            .retain(|w| match w.tx.try_send(event.clone()) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    w.cut.store(true, Ordering::SeqCst);
                    false
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            });
    }

    /// `cell_started`.
    pub fn cell_started(&self, owner: &str, execution_count: u64, code: &str, front: FrontEnd) {
        self.publish(owner, "cell_started", || {
            let code = match &self.cleaner {
                Some(c) => c.redact(code),
                None => code.to_owned(),
            };
            json!({
                "session": owner,
                "execution_count": execution_count,
                "code": code,
                "front_end": front.as_str(),
                "started_at": unix_now(),
            })
            .to_string()
        });
    }

    /// `cell_finished` with `result`, the cell result as the caller's front
    /// end answers it (a serializable [`CellResult`](crate::CellResult),
    /// or one with the front end's extra fields).
    pub fn cell_finished(&self, owner: &str, execution_count: u64, result: &impl Serialize) {
        self.publish(owner, "cell_finished", || {
            json!({ "execution_count": execution_count, "result": result }).to_string()
        });
    }

    /// `cell_finished` for a cell that started but has no result (its
    /// kernel could not run it): `{"execution_count", "error": {...}}`.
    pub fn cell_failed(&self, owner: &str, execution_count: u64, code: &str, message: &str) {
        self.publish(owner, "cell_finished", || {
            json!({
                "execution_count": execution_count,
                "error": {"code": code, "message": message},
            })
            .to_string()
        });
    }

    /// `stdout`, `stderr` or `display` of the running cell.
    pub fn cell_event(&self, owner: &str, execution_count: u64, event: &crate::CellEvent) {
        use crate::CellEvent;
        match event {
            CellEvent::Stdout(text) => self.publish(owner, "stdout", || {
                json!({ "execution_count": execution_count, "text": text }).to_string()
            }),
            CellEvent::Stderr(text) => self.publish(owner, "stderr", || {
                json!({ "execution_count": execution_count, "text": text }).to_string()
            }),
            CellEvent::Display(items) => {
                for item in items {
                    self.publish(owner, "display", || {
                        json!({ "execution_count": execution_count, "display": item }).to_string()
                    });
                }
            }
            // The last value's rich repr: a display, marked as the value's.
            CellEvent::Value(items) => {
                for item in items {
                    self.publish(owner, "display", || {
                        json!({ "execution_count": execution_count, "display": item, "value": true })
                            .to_string()
                    });
                }
            }
            // Watchers saw the stop line itself as output; the fact is in
            // the result that `cell_finished` carries.
            CellEvent::StreamStopped { .. } => {}
        }
    }

    /// `kernel` {"change", "note"}.
    pub fn kernel(&self, owner: &str, change: KernelChange, note: &str) {
        self.publish(owner, "kernel", || {
            json!({ "change": change.as_str(), "note": note }).to_string()
        });
    }

    /// Forget `owner`'s id sequence when nobody watches it (its session
    /// was closed): a bus that lives long does not keep every session
    /// it ever saw.
    pub fn forget(&self, owner: &str) {
        let mut topics = self.inner.topics();
        if topics.get(owner).is_some_and(|t| t.watchers.is_empty()) {
            topics.remove(owner);
        }
    }
}

/// One watcher of a session: its events in order, then (if it fell
/// behind) one `dropped`.
pub struct Watcher {
    rx: mpsc::Receiver<Arc<SessionEvent>>,
    cut: Arc<AtomicBool>,
    inner: Arc<Inner>,
    owner: String,
    last_id: u64,
    finished: bool,
}

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watcher")
            .field("owner", &self.owner)
            .field("last_id", &self.last_id)
            .finish_non_exhaustive()
    }
}

impl Watcher {
    /// The id of the session's last event when this watcher started (or
    /// of the last event it received).
    pub fn last_id(&self) -> u64 {
        self.last_id
    }

    /// The next event; after a `dropped` one (or when the bus is gone),
    /// `None`.
    ///
    /// # Cancel safety
    /// Cancel safe: an event is never lost by dropping the future.
    pub async fn next(&mut self) -> Option<Arc<SessionEvent>> {
        if self.finished {
            return None;
        }
        match self.rx.recv().await {
            Some(e) => {
                self.last_id = e.id;
                Some(e)
            }
            None => {
                self.finished = true;
                if !self.cut.load(Ordering::SeqCst) {
                    return None;
                }
                let now = self
                    .inner
                    .topics()
                    .get(&self.owner)
                    .map_or(self.last_id, |t| t.seq);
                let missed = now.saturating_sub(self.last_id);
                Some(Arc::new(SessionEvent {
                    id: 0,
                    name: "dropped",
                    data: json!({
                        "reason": format!(
                            "this watcher fell behind: more than its buffer of events were \
                             waiting unread, so it was cut off rather than slow the session; \
                             reconnect (with ?since=<the last execution_count seen>) to catch up"
                        ),
                        "missed": missed,
                    })
                    .to_string(),
                }))
            }
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.rx.close();
        if let Some(t) = self.inner.topics().get_mut(&self.owner) {
            t.watchers.retain(|w| !w.tx.is_closed());
        }
    }
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_watcher_gets_events_in_order_with_increasing_ids() {
        let bus = EventBus::new(8);
        let mut w = bus.subscribe("s");
        bus.kernel("s", KernelChange::Spawned, "started");
        bus.cell_started("s", 1, "1 + 1", FrontEnd::Http);
        let a = w.next().await.unwrap();
        let b = w.next().await.unwrap();
        assert_eq!((a.name, a.id), ("kernel", 1));
        assert_eq!((b.name, b.id), ("cell_started", 2));
        assert_eq!(b.value()["front_end"], "http");
    }

    #[tokio::test]
    async fn a_full_watcher_is_cut_off_with_a_dropped_event_and_others_go_on() {
        let bus = EventBus::new(2);
        let mut slow = bus.subscribe("s");
        let mut fast = bus.subscribe("s");
        for i in 0..5 {
            bus.kernel("s", KernelChange::Spawned, &i.to_string());
            assert_eq!(fast.next().await.unwrap().id, i + 1);
        }
        assert_eq!(bus.watchers("s"), 1);
        assert_eq!(slow.next().await.unwrap().id, 1);
        assert_eq!(slow.next().await.unwrap().id, 2);
        let d = slow.next().await.unwrap();
        assert_eq!(d.name, "dropped");
        assert_eq!(d.value()["missed"], 3);
        assert!(slow.next().await.is_none());
    }

    #[tokio::test]
    async fn nobody_watching_builds_no_data() {
        let bus = EventBus::new(2);
        bus.publish("s", "kernel", || unreachable!("no watcher"));
        let mut w = bus.subscribe("s");
        assert_eq!(w.last_id(), 1);
        bus.kernel("s", KernelChange::Reset, "");
        assert_eq!(w.next().await.unwrap().id, 2);
        drop(w);
        assert_eq!(bus.watchers("s"), 0);
    }
}

//! Jupyter Kernel Gateway protocol under `/api`, so Jupyter Server
//! (`--gateway-url`), JupyterLab, nbclient and agent frameworks run their
//! code on cellhost's kernels unchanged.
//!
//! A Jupyter kernel is a cellhost session: its id is the session id, so
//! HTTP, MCP and Jupyter clients can share one session. Each kernel a
//! Jupyter client knows has a [`Hub`]: the WebSockets connected to it,
//! one broadcast of outgoing messages (iopub to every socket, replies to
//! the socket that asked) and one shell worker that runs the kernel's
//! requests in arrival order (see `shell`).
//!
//! Modules: `rest` (kernelspecs, kernels, sessions), `channels` (the
//! WebSocket), `shell` (what each request does), `messages` (wire types),
//! `introspect` (completion, inspection and `is_complete` in the kernel).

mod channels;
mod introspect;
mod messages;
mod rest;
mod shell;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::routing::{get, post};
use axum::Router;
use tokio::sync::{broadcast, mpsc, watch};

use crate::AppState;

/// Messages a slow socket may fall behind by before it misses some.
const BROADCAST_CAPACITY: usize = 4096;

/// The `/api` routes, with their own state beside [`AppState`].
pub(crate) fn routes(state: &AppState) -> Router<AppState> {
    let jupyter = Jupyter {
        app: state.clone(),
        hubs: Arc::default(),
        sessions: Arc::default(),
    };
    Router::new()
        .route("/api", get(rest::version))
        .route("/api/", get(rest::version))
        .route("/api/kernelspecs", get(rest::kernelspecs))
        .route("/api/kernelspecs/{name}", get(rest::kernelspec))
        .route(
            "/api/kernels",
            get(rest::list_kernels).post(rest::start_kernel),
        )
        .route(
            "/api/kernels/{id}",
            get(rest::get_kernel).delete(rest::delete_kernel),
        )
        .route("/api/kernels/{id}/interrupt", post(rest::interrupt))
        .route("/api/kernels/{id}/restart", post(rest::restart))
        .route("/api/kernels/{id}/channels", get(channels::connect))
        .route(
            "/api/sessions",
            get(rest::list_sessions).post(rest::create_session),
        )
        .route(
            "/api/sessions/{id}",
            get(rest::get_session)
                .delete(rest::delete_session)
                .patch(rest::patch_session),
        )
        .with_state(jupyter)
}

/// What the `/api` handlers share.
#[derive(Clone)]
pub(crate) struct Jupyter {
    pub app: AppState,
    /// Kernel id → its hub, for every kernel a Jupyter client started or
    /// connected to.
    pub hubs: Arc<Mutex<HashMap<String, Arc<Hub>>>>,
    /// Jupyter session id → its notebook path and kernel.
    pub sessions: Arc<Mutex<HashMap<String, rest::JSession>>>,
}

impl Jupyter {
    pub(crate) fn hub(&self, id: &str) -> Option<Arc<Hub>> {
        self.hubs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
    }

    /// The hub of kernel `id`, made (with its shell worker) if new.
    pub(crate) fn hub_or_new(&self, id: &str, name: &str) -> Arc<Hub> {
        let mut hubs = self.hubs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(h) = hubs.get(id) {
            return h.clone();
        }
        let hub = Hub::start(self.app.clone(), id, name);
        hubs.insert(id.to_owned(), hub.clone());
        hub
    }

    /// Forget kernel `id`'s hub and close its sockets.
    pub(crate) fn remove(&self, id: &str) {
        let hub = self
            .hubs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
        if let Some(h) = hub {
            let _ = h.shared.closed.send(true);
        }
    }
}

/// Messages for the sockets of a kernel, in order, each for every socket
/// (iopub, `None`) or one (a reply). Messages made together (a reply and
/// the `status: idle` after it) travel as one broadcast, so a socket wakes
/// once for them and writes them with one flush.
#[derive(Debug, Clone)]
pub(crate) struct Broadcast {
    pub msgs: Arc<[(Option<u64>, String)]>,
}

/// A request for the kernel's shell worker.
pub(crate) struct ShellJob {
    pub socket: u64,
    pub msg: messages::Incoming,
}

/// One Jupyter kernel's sockets and shell worker.
pub(crate) struct Hub {
    pub shared: Arc<HubShared>,
    pub shell: mpsc::UnboundedSender<ShellJob>,
}

/// The part of a hub its shell worker holds too.
pub(crate) struct HubShared {
    /// The kernel (= cellhost session) id.
    pub id: String,
    /// The kernelspec it was started as.
    pub name: String,
    /// The `session` of the headers cellhost sends for this kernel.
    pub session: String,
    pub out: broadcast::Sender<Broadcast>,
    /// Set when the kernel is deleted: its sockets close.
    pub closed: watch::Sender<bool>,
    pub connections: AtomicUsize,
    pub next_socket: AtomicU64,
    /// A shell request is being handled.
    pub busy: AtomicBool,
    /// Unix time of the last request.
    pub last_activity: Mutex<f64>,
    /// Hidden cells (completion, inspection) run per kernel process id:
    /// the execution count Jupyter sees leaves them out.
    pub hidden: Mutex<HashMap<String, u64>>,
    /// A state note a hidden cell got, for the next real cell to tell.
    pub pending_note: Mutex<Option<String>>,
}

impl Hub {
    fn start(app: AppState, id: &str, name: &str) -> Arc<Hub> {
        let (out, _) = broadcast::channel(BROADCAST_CAPACITY);
        let (shell, jobs) = mpsc::unbounded_channel();
        let shared = Arc::new(HubShared {
            id: id.to_owned(),
            name: name.to_owned(),
            session: new_uuid(),
            out,
            closed: watch::channel(false).0,
            connections: AtomicUsize::new(0),
            next_socket: AtomicU64::new(1),
            busy: AtomicBool::new(false),
            last_activity: Mutex::new(crate::execute::unix_now()),
            hidden: Mutex::default(),
            pending_note: Mutex::default(),
        });
        tokio::spawn(shell::worker(app, shared.clone(), jobs));
        Arc::new(Hub { shared, shell })
    }
}

impl HubShared {
    /// Send `msg` to every socket (`target: None`) or to one.
    pub(crate) fn send(&self, target: Option<u64>, msg: &messages::Outgoing) {
        self.send_all(&[(target, msg)]);
    }

    /// Send several messages as one broadcast (see [`Broadcast`]).
    pub(crate) fn send_all(&self, msgs: &[(Option<u64>, &messages::Outgoing)]) {
        if msgs.is_empty() {
            return;
        }
        let msgs: Vec<(Option<u64>, String)> =
            msgs.iter().map(|(t, m)| (*t, m.to_text())).collect();
        let _ = self.out.send(Broadcast { msgs: msgs.into() });
    }

    pub(crate) fn touch(&self) {
        *self.last_activity.lock().unwrap_or_else(|e| e.into_inner()) = crate::execute::unix_now();
    }

    pub(crate) fn last_activity(&self) -> f64 {
        *self.last_activity.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

/// A random UUID (version 4), as Jupyter ids are.
pub(crate) fn new_uuid() -> String {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).expect("OS random source");
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Unix seconds as ISO 8601 UTC with microseconds (`…T…Z`).
pub(crate) fn iso_time(unix: f64) -> String {
    let micros = (unix.max(0.0) * 1e6) as i64;
    let secs = micros.div_euclid(1_000_000);
    let frac = micros.rem_euclid(1_000_000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{frac:06}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso_time_formats_utc_with_microseconds() {
        assert_eq!(iso_time(0.0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(iso_time(951_782_400.5), "2000-02-29T00:00:00.500000Z");
        assert_eq!(iso_time(1_798_761_599.0), "2026-12-31T23:59:59.000000Z");
    }

    #[test]
    fn uuids_have_the_v4_shape() {
        let u = new_uuid();
        let parts: Vec<&str> = u.split('-').collect();
        assert_eq!(
            parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12]
        );
        assert!(parts[2].starts_with('4'));
        assert_ne!(u, new_uuid());
    }
}

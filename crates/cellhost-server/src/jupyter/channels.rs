//! `GET /api/kernels/{id}/channels`: the kernel's WebSocket, Jupyter
//! messages as JSON text frames with a `channel` field.
//!
//! Each socket is one task: it reads the client's frames and writes the
//! hub's broadcast (iopub for every socket, replies for itself), so
//! replies and outputs reach a client in the order they were made.
//! Shell requests that touch the kernel go to the hub's shell worker;
//! `kernel_info`, `comm_*`, `interrupt` and `shutdown` are answered here
//! at once, even while a cell runs. A frame that is not a Jupyter
//! message is answered with a stderr `stream` naming what is wrong; the
//! socket stays open, and no other socket notices.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::rejection::PathRejection;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use futures_util::SinkExt;
use serde_json::json;
use tokio::sync::broadcast::error::{RecvError, TryRecvError};

use super::messages::{self, Incoming, Outgoing};
use super::{Broadcast, Hub, Jupyter, ShellJob};
use crate::ApiError;

/// Largest frame a client may send (a cell's code and its envelope).
const MAX_FRAME: usize = 64 << 20;
/// How long a closing handshake may take.
const CLOSE_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

pub(crate) async fn connect(
    State(j): State<Jupyter>,
    scope: crate::tenant::Scope,
    id: Result<Path<String>, PathRejection>,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Response {
    let id = match id {
        Ok(Path(id)) => id,
        Err(r) => {
            return ApiError::bad_request(
                "bad_path",
                format!("the URL path could not be read: {r}"),
            )
            .into_response()
        }
    };
    let ws = match ws {
        Ok(ws) => ws,
        Err(r) => {
            return ApiError::bad_request(
                "websocket_required",
                format!(
                    "this is a kernel's WebSocket: connect with a WebSocket client \
                     (ws://HOST:PORT/api/kernels/{id}/channels) ({r})"
                ),
            )
            .into_response()
        }
    };
    let key = scope.key(&id);
    if j.model(&scope, &key).is_none() {
        return ApiError::new(
            axum::http::StatusCode::NOT_FOUND,
            "unknown_kernel",
            format!("no kernel {id:?} is known here; start one with POST /api/kernels first"),
        )
        .into_response();
    }
    let hub = j.hub_or_new(&key, super::rest::SPEC_NAME);
    ws.max_message_size(MAX_FRAME)
        .on_upgrade(move |socket| run(socket, j, hub))
}

/// Counts the socket among the kernel's connections while it lives.
struct Connected(Arc<Hub>);

impl Drop for Connected {
    fn drop(&mut self) {
        self.0.shared.connections.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn run(mut socket: WebSocket, j: Jupyter, hub: Arc<Hub>) {
    let shared = hub.shared.clone();
    let me = shared.next_socket.fetch_add(1, Ordering::SeqCst);
    shared.connections.fetch_add(1, Ordering::SeqCst);
    let _connected = Connected(hub.clone());
    // Kept from the reaper while a client is attached.
    let _attached = j.app.manager.attach(&shared.id);
    let mut out = shared.out.subscribe();
    let mut closed = shared.closed.subscribe();
    if *closed.borrow() {
        return;
    }
    loop {
        tokio::select! {
            frame = socket.recv() => {
                let text = match frame {
                    None | Some(Err(_)) => break,
                    Some(Ok(Message::Close(_))) => {
                        // Reading once more sends the close reply the
                        // client waits for (websocket-client blocks on it).
                        let _ = tokio::time::timeout(CLOSE_GRACE, socket.recv()).await;
                        break;
                    }
                    Some(Ok(Message::Text(t))) => t,
                    Some(Ok(Message::Binary(_))) => {
                        let m = messages::stream(
                            "stderr",
                            "cellhost: binary WebSocket frames are not supported; \
                             send each Jupyter message as a JSON text frame\n",
                            &shared.session,
                            None,
                        );
                        if socket.send(Message::Text(m.to_text().into())).await.is_err() {
                            break;
                        }
                        continue;
                    }
                    Some(Ok(_)) => continue, // ping/pong: answered by the library
                };
                match Incoming::parse(text.as_str()) {
                    Ok(msg) => handle(&j, &hub, me, msg).await,
                    Err(e) => {
                        let m = messages::stream(
                            "stderr",
                            &format!(
                                "cellhost: ignored a WebSocket frame: {}\n",
                                cellhost::error_chain(&e)
                            ),
                            &shared.session,
                            None,
                        );
                        if socket.send(Message::Text(m.to_text().into())).await.is_err() {
                            break;
                        }
                    }
                }
            }
            b = out.recv() => {
                // Write this broadcast and whatever else is already queued,
                // then flush once: one write for a reply and its idle.
                let mut next = Some(b);
                let mut ok = true;
                while let Some(b) = next.take() {
                    ok = match b {
                        Ok(b) => feed(&mut socket, me, &b).await,
                        Err(RecvError::Lagged(n)) => {
                            let m = messages::stream(
                                "stderr",
                                &format!("cellhost: this client fell behind and missed {n} messages\n"),
                                &shared.session,
                                None,
                            );
                            socket.feed(Message::Text(m.to_text().into())).await.is_ok()
                        }
                        Err(RecvError::Closed) => false,
                    };
                    if !ok {
                        break;
                    }
                    next = match out.try_recv() {
                        Ok(b) => Some(Ok(b)),
                        Err(TryRecvError::Lagged(n)) => Some(Err(RecvError::Lagged(n))),
                        Err(TryRecvError::Closed) => Some(Err(RecvError::Closed)),
                        Err(TryRecvError::Empty) => None,
                    };
                }
                if !ok || socket.flush().await.is_err() {
                    break;
                }
            }
            _ = closed.changed() => {
                let _ = socket.send(Message::Close(None)).await;
                break;
            }
        }
    }
}

/// Queue this socket's messages of `b` on it (sent at the next flush).
async fn feed(socket: &mut WebSocket, me: u64, b: &Broadcast) -> bool {
    for (target, text) in b.msgs.iter() {
        if target.is_none_or(|t| t == me)
            && socket
                .feed(Message::Text(text.as_str().into()))
                .await
                .is_err()
        {
            return false;
        }
    }
    true
}

/// Route one client message.
async fn handle(j: &Jupyter, hub: &Arc<Hub>, me: u64, msg: Incoming) {
    let s = &hub.shared;
    let session = s.session.clone();
    let target = Some(me);
    match msg.msg_type() {
        "execute_request"
        | "complete_request"
        | "inspect_request"
        | "is_complete_request"
        | "history_request" => {
            if hub.shell.send(ShellJob { socket: me, msg }).is_err() {
                // The worker is gone only when the kernel was deleted.
            }
        }
        "kernel_info_request" => {
            s.send_all(&[
                (None, &messages::status("busy", &session, Some(&msg))),
                (target, &messages::reply(&msg, &session, kernel_info())),
                (None, &messages::status("idle", &session, Some(&msg))),
            ]);
        }
        "interrupt_request" => {
            j.app.manager.interrupt(&s.id).await;
            s.send(
                target,
                &messages::reply(&msg, &session, json!({"status": "ok"})),
            );
        }
        "shutdown_request" => {
            let restart = msg.bool_field("restart").unwrap_or(false);
            j.app.manager.dispose_owner(&s.id).await;
            crate::execute::forget_previous(&j.app, &s.id);
            s.send(
                target,
                &messages::reply(&msg, &session, json!({"status": "ok", "restart": restart})),
            );
            if !restart {
                s.send(None, &messages::status("dead", &session, Some(&msg)));
            }
        }
        "comm_info_request" => {
            let content = json!({"status": "ok", "comms": {}});
            s.send(target, &messages::reply(&msg, &session, content));
        }
        "comm_open" => {
            // No comm targets: close it, as ipykernel does for an unknown one.
            let comm_id = msg.str_field("comm_id").unwrap_or("").to_owned();
            let close = Outgoing::new(
                "iopub",
                "comm_close",
                &session,
                Some(&msg),
                json!({"comm_id": comm_id, "data": {}}),
            );
            s.send(target, &close);
        }
        "comm_msg" | "comm_close" | "input_reply" => {}
        other if other.ends_with("_request") => {
            let content = json!({
                "status": "error",
                "ename": "UnsupportedRequest",
                "evalue": format!("cellhost does not support {other}; see docs/jupyter.md"),
                "traceback": [],
            });
            s.send(target, &messages::reply(&msg, &session, content));
        }
        other => {
            let text = format!("cellhost: ignored a {other:?} message (not a request)\n");
            s.send(
                target,
                &messages::stream("stderr", &text, &session, Some(&msg)),
            );
        }
    }
}

fn kernel_info() -> serde_json::Value {
    json!({
        "status": "ok",
        "protocol_version": messages::PROTOCOL_VERSION,
        "implementation": "cellhost",
        "implementation_version": env!("CARGO_PKG_VERSION"),
        "language_info": {
            "name": "python",
            "version": "3",
            "mimetype": "text/x-python",
            "file_extension": ".py",
            "pygments_lexer": "ipython3",
            "codemirror_mode": {"name": "ipython", "version": 3},
            "nbconvert_exporter": "python",
        },
        "banner": "cellhost: a session-persistent Python kernel (sandboxed, with history)",
        "help_links": [],
        "debugger": false,
    })
}

//! The chaos run's moving parts: a worker per session sending random
//! cells and checking every answer, and the fault driver (kernel
//! SIGKILLs, interrupts). Shared state is a few atomics and mutexes.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::client::{Conn, Failure};
use super::model::{Hits, Kind, Session};

/// A small deterministic PRNG (xorshift64*), so a run can be replayed
/// from its seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Faults aimed at one session: (sent, done) times. A fault is written
/// down before it is sent (`done` open until its answer is back): the cell
/// it hits can be answered, and checked, before the fault's own answer.
#[derive(Default)]
pub struct Aimed {
    interrupts: Vec<(Instant, Option<Instant>)>,
    kills: Vec<Instant>,
}

/// What every thread shares.
#[derive(Default)]
pub struct Shared {
    pub stop: AtomicBool,
    pub paused: AtomicBool,
    /// Workers inside a request.
    pub busy: AtomicUsize,
    pub aimed: Mutex<HashMap<String, Aimed>>,
    pub lies: Mutex<Vec<String>>,
    /// Cell ids the daemon answered (must all be in the history).
    pub acked: Mutex<Vec<String>>,
    pub counts: Mutex<HashMap<String, u64>>,
    pub sent: AtomicU64,
}

impl Shared {
    pub fn count(&self, what: &str, by: u64) {
        *self
            .counts
            .lock()
            .unwrap()
            .entry(what.to_owned())
            .or_default() += by;
    }

    fn hits(&self, session: &str, start: Instant, end: Instant) -> Hits {
        let aimed = self.aimed.lock().unwrap();
        let Some(a) = aimed.get(session) else {
            return Hits::default();
        };
        let slack = Duration::from_millis(500);
        Hits {
            interrupted: a
                .interrupts
                .iter()
                .any(|&(s, d)| s <= end && d.is_none_or(|d| d >= start)),
            killed: a.kills.iter().any(|&k| k + slack >= start && k <= end),
        }
    }
}

/// One session's worker: random cells until `stop`, waiting while paused.
pub fn worker(shared: Arc<Shared>, addr: SocketAddr, session: String, seed: u64) {
    let mut rng = Rng::new(seed);
    let mut conn = Conn::new(addr, Duration::from_secs(60));
    let mut model = Session::default();
    let mut seq = 0u64;
    while !shared.stop.load(Ordering::SeqCst) {
        if shared.paused.load(Ordering::SeqCst) {
            conn.disconnect();
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        shared.busy.fetch_add(1, Ordering::SeqCst);
        if shared.paused.load(Ordering::SeqCst) {
            shared.busy.fetch_sub(1, Ordering::SeqCst);
            continue;
        }
        seq += 1;
        let kind = Kind::pick(rng.below(100));
        let reset = rng.below(50) == 0;
        let id = format!("chaos {session} {seq}");
        let (body, timeout) = kind.body();
        let code = format!(
            "# {id}\nn = globals().get('n', 0) + 1\nprint(f'@n={{n}}', flush=True)\n{body}"
        );
        let mut req = json!({"code": code, "reset": reset});
        if let Some(t) = timeout {
            req["timeout"] = json!(t);
        }
        let path = format!("/v1/sessions/{session}/execute");
        let start = Instant::now();
        let answer = conn.post(&path, &req);
        let end = Instant::now();
        shared.sent.fetch_add(1, Ordering::Relaxed);
        match answer {
            Ok((200, v)) => {
                let hits = shared.hits(&session, start, end);
                let lies = model.answer(kind, reset, hits, &v);
                shared.acked.lock().unwrap().push(id.clone());
                shared.count(
                    &format!("status {}", v["status"].as_str().unwrap_or("?")),
                    1,
                );
                if reset {
                    shared.count("resets", 1);
                }
                if v["kernel"]["restored"].is_object() {
                    shared.count("restored from a snapshot", 1);
                }
                for l in lies {
                    shared.lies.lock().unwrap().push(format!(
                        "{id} ({}): {l}; answer {}",
                        kind.name(),
                        brief(&v)
                    ));
                }
            }
            Ok((503, _)) => shared.count("answered 503", 1),
            Ok((code, v)) => shared
                .lies
                .lock()
                .unwrap()
                .push(format!("{id}: HTTP {code}: {v}")),
            Err(Failure::NotSent(_)) => {
                shared.count("not sent (daemon down)", 1);
                seq -= 1;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(Failure::NoAnswer(_)) => {
                shared.count("no answer (daemon killed mid-request)", 1);
                model.unanswered();
            }
        }
        shared.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

fn brief(v: &Value) -> String {
    let mut v = v.clone();
    if let Some(s) = v["stdout"].as_str() {
        v["stdout"] = json!(s.chars().take(80).collect::<String>());
    }
    v.as_object_mut().map(|o| o.remove("traceback"));
    v.to_string()
}

/// The fault driver: every 50–250 ms, SIGKILL a random kernel or
/// interrupt a session whose kernel is busy, until `stop`; idle while
/// paused.
pub fn driver(
    shared: Arc<Shared>,
    addr: SocketAddr,
    seed: u64,
    snapshots: std::path::PathBuf,
    sessions: usize,
) {
    let mut rng = Rng::new(seed);
    let mut conn = Conn::new(addr, Duration::from_secs(10));
    let mut forks = 0u64;
    while !shared.stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(50 + rng.below(200)));
        if shared.paused.load(Ordering::SeqCst) {
            conn.disconnect();
            continue;
        }
        if rng.below(8) == 0 {
            truncate_a_snapshot(&shared, &snapshots, &mut rng);
            continue;
        }
        let Ok((200, ks)) = conn.get("/v1/kernels") else {
            continue;
        };
        if rng.below(6) == 0 {
            snapshot_then_kill(&shared, addr, &ks, &mut rng);
            continue;
        }
        if rng.below(6) == 0 {
            forks += 1;
            fork_and_check(&shared, &mut conn, &ks, &mut rng, (forks, sessions));
            continue;
        }
        let kill = rng.below(2) == 0;
        let targets: Vec<&Value> = ks
            .as_array()
            .map(|a| {
                a.iter()
                    .filter(|k| k["owner"].is_string() && (kill || k["state"] == "busy"))
                    .collect()
            })
            .unwrap_or_default();
        if targets.is_empty() {
            continue;
        }
        let k = targets[rng.below(targets.len() as u64) as usize];
        let (Some(pid), Some(owner)) = (k["pid"].as_u64(), k["owner"].as_str()) else {
            continue;
        };
        if kill {
            if kill_aimed(&shared, owner.to_owned(), pid) {
                shared.count("fault: kernel SIGKILL", 1);
            }
        } else {
            let i = {
                let mut aimed = shared.aimed.lock().unwrap();
                let list = &mut aimed.entry(owner.to_owned()).or_default().interrupts;
                list.push((Instant::now(), None));
                list.len() - 1
            };
            let answer = conn.post(&format!("/v1/sessions/{owner}/interrupt"), &json!({}));
            // Closed even when the answer was lost: the signal may have
            // gone out all the same.
            let done = Instant::now();
            shared
                .aimed
                .lock()
                .unwrap()
                .get_mut(owner)
                .unwrap()
                .interrupts[i]
                .1 = Some(done);
            if let Ok((200, v)) = answer {
                shared.count("fault: interrupt sent", 1);
                shared.count(
                    "fault: interrupt hit a running cell",
                    v["count"].as_u64().unwrap_or(0),
                );
            }
        }
    }
}

/// Fork a session (live, or any one, which may be at rest: its state in
/// a snapshot) into a new one, run a counter cell there, check what its
/// answer says against what it printed, and dispose of it. A source that
/// forks has run a cell: a fork that says its state came back whole
/// (`restored`, not lost) continues the counter (n >= 2) and names its
/// source (a source with no globals yet excepted); one restored in part
/// or from an older snapshot names its source; one whose copy could not
/// be loaded (a truncated file, a daemon killed in between) says the
/// state was lost and starts over (n == 1).
fn fork_and_check(
    shared: &Shared,
    conn: &mut Conn,
    ks: &Value,
    rng: &mut Rng,
    (seq, sessions): (u64, usize),
) {
    // Idle or busy: a fork waits for the running cell (its turn).
    let live: Vec<&str> = ks
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|k| k["state"] == "idle" || k["state"] == "busy")
                .filter_map(|k| k["owner"].as_str())
                .collect()
        })
        .unwrap_or_default();
    // Half the time any session: one at rest (its kernel evicted, its
    // state in a snapshot) forks from that snapshot.
    let source = if rng.below(2) == 0 {
        format!("s{:02}", rng.below(sessions as u64))
    } else if live.is_empty() {
        return;
    } else {
        live[rng.below(live.len() as u64) as usize].to_owned()
    };
    let target = format!("fork{seq}-{}", rng.below(1 << 30));
    // Counted busy, so a checkpoint waits for the fork's kernel to go.
    shared.busy.fetch_add(1, Ordering::SeqCst);
    let asked = conn.post(
        &format!("/v1/sessions/{source}/fork"),
        &json!({"into": target}),
    );
    match asked {
        Ok((200, _)) => {
            shared.count("fault: fork", 1);
            let code =
                json!({"code": "n = globals().get('n', 0) + 1\nprint(f'@n={n}', flush=True)"});
            if let Ok((200, v)) = conn.post(&format!("/v1/sessions/{target}/execute"), &code) {
                let n = super::model::counter(v["stdout"].as_str().unwrap_or("")).unwrap_or(0);
                let k = &v["kernel"];
                let lost = k["state_lost"].as_bool().unwrap_or(false);
                let restored = k["restored"].is_object();
                // (A source whose only cell was interrupted before its
                // counter line had no globals: nothing to continue.)
                let empty = k["restored"]["names"] == 0;
                let truthful = if restored && !lost {
                    (n >= 2 || empty) && k["forked_from"] == source.as_str()
                } else if restored {
                    // Partly restored, or from a snapshot older than the
                    // state (taken on request, then the daemon was killed).
                    k["forked_from"] == source.as_str()
                } else {
                    lost && n == 1
                };
                if !truthful {
                    shared.lies.lock().unwrap().push(format!(
                        "fork of {source} into {target}: n={n}, state_lost={lost}, restored={}, forked_from={}",
                        k["restored"], k["forked_from"]
                    ));
                }
                shared.count(
                    if restored && !lost {
                        "fork: state came back"
                    } else {
                        "fork: copy not loaded, said so"
                    },
                    1,
                );
            }
            let _ = conn.delete(&format!("/v1/sessions/{target}"));
        }
        Ok((code, v)) => shared.count(
            &format!(
                "fork: refused ({code} {})",
                v["error"]["code"].as_str().unwrap_or("?")
            ),
            1,
        ),
        Err(_) => shared.count("fork: no answer", 1),
    }
    shared.busy.fetch_sub(1, Ordering::SeqCst);
}

/// Cut a random snapshot file in half: its session's next restore must
/// fail and say the state was lost.
fn truncate_a_snapshot(shared: &Shared, dir: &std::path::Path, rng: &mut Rng) {
    let files: Vec<_> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "zst"))
                .collect()
        })
        .unwrap_or_default();
    if files.is_empty() {
        return;
    }
    let f = &files[rng.below(files.len() as u64) as usize];
    let Ok(len) = std::fs::metadata(f).map(|m| m.len()) else {
        return;
    };
    let cut = std::fs::OpenOptions::new()
        .write(true)
        .open(f)
        .and_then(|file| file.set_len(len / 2));
    if cut.is_ok() {
        shared.count("fault: snapshot file truncated", 1);
    }
}

/// Ask for a snapshot of an idle session and SIGKILL its kernel while
/// the snapshot may be being written.
fn snapshot_then_kill(shared: &Arc<Shared>, addr: SocketAddr, ks: &Value, rng: &mut Rng) {
    let idle: Vec<&Value> = ks
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|k| k["owner"].is_string() && k["state"] == "idle")
                .collect()
        })
        .unwrap_or_default();
    if idle.is_empty() {
        return;
    }
    let k = idle[rng.below(idle.len() as u64) as usize];
    let (Some(pid), Some(owner)) = (k["pid"].as_u64(), k["owner"].as_str()) else {
        return;
    };
    let owner = owner.to_owned();
    let (sh, who) = (shared.clone(), owner.clone());
    let asked = std::thread::spawn(move || {
        let mut conn = Conn::new(addr, Duration::from_secs(10));
        match conn.post(&format!("/v1/sessions/{who}/snapshot"), &json!({})) {
            Ok((200, _)) => sh.count("snapshot on request: taken", 1),
            Ok((code, v)) => sh.count(
                &format!(
                    "snapshot on request: refused ({code} {})",
                    v["error"]["code"].as_str().unwrap_or("?")
                ),
                1,
            ),
            Err(_) => sh.count("snapshot on request: no answer", 1),
        }
    });
    std::thread::sleep(Duration::from_millis(rng.below(20)));
    if kill_aimed(shared, owner, pid) {
        shared.count("fault: kernel SIGKILL during a snapshot", 1);
    }
    let _ = asked.join();
}

/// SIGKILL `owner`'s kernel `pid`, written down first (the cell it ends
/// can be answered before `kill` returns); whether the signal went out.
fn kill_aimed(shared: &Shared, owner: String, pid: u64) -> bool {
    let sent = Instant::now();
    let mut aimed = shared.aimed.lock().unwrap();
    let kills = &mut aimed.entry(owner).or_default().kills;
    kills.push(sent);
    let sig = nix::sys::signal::Signal::SIGKILL;
    if nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig).is_ok() {
        return true;
    }
    kills.pop();
    false
}

//! The chaos run's truth model: what a session's kernel may hold, and
//! whether an answer's status and state flags tell the truth about it.
//!
//! Every chaos cell first does `n = globals().get('n', 0) + 1` and prints
//! `@n=<n>`: a per-session counter that survives exactly as long as the
//! kernel's state does. A fresh kernel prints `@n=1`; a kept one prints one
//! more than before. So an answer lies when the counter restarted without
//! `state_lost`/`state_reset` (or an earlier answer that said the kernel
//! died), when it continued although the answer says the state was reset
//! or lost by a successful cell, or when it jumped.

use std::collections::BTreeSet;

use serde_json::Value;

/// What a chaos cell does after the counter line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Quick arithmetic: `success`.
    Ok,
    /// Sleeps 0.2 s (a window for interrupts and kills): `success`.
    Sleep,
    /// `raise ValueError`: `error`, state kept.
    Raise,
    /// Sleeps 5 s under a 0.3 s timeout: `timeout`, state kept.
    Timeout,
    /// Prints 200 kB: `success`, stdout truncated.
    Flood,
    /// `os._exit(3)`: `error` (KernelDied), state lost, said on this cell.
    Exit,
}

impl Kind {
    /// Pick by `roll` in 0..100.
    pub fn pick(roll: u64) -> Kind {
        match roll {
            0..=39 => Kind::Ok,
            40..=64 => Kind::Sleep,
            65..=79 => Kind::Raise,
            80..=87 => Kind::Timeout,
            88..=95 => Kind::Flood,
            _ => Kind::Exit,
        }
    }

    /// The cell's body (after the counter line) and its timeout.
    pub fn body(self) -> (&'static str, Option<f64>) {
        match self {
            Kind::Ok => ("sum(range(1000))", None),
            Kind::Sleep => ("import time\ntime.sleep(0.2)", None),
            Kind::Raise => ("raise ValueError('chaos')", None),
            Kind::Timeout => ("import time\ntime.sleep(5)", Some(0.3)),
            Kind::Flood => ("print('y' * 200_000)", None),
            Kind::Exit => ("import os\nos._exit(3)", None),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Ok => "ok",
            Kind::Sleep => "sleep",
            Kind::Raise => "raise",
            Kind::Timeout => "timeout",
            Kind::Flood => "flood",
            Kind::Exit => "exit",
        }
    }
}

/// Faults the driver aimed at this session while the cell ran.
#[derive(Debug, Clone, Copy, Default)]
pub struct Hits {
    pub interrupted: bool,
    pub killed: bool,
}

/// What the kernel of one session may hold between cells.
#[derive(Debug, Clone)]
pub struct Session {
    /// Counter values the kernel may hold; 0: a fresh kernel the client
    /// was already told about (or that never had state).
    possible: BTreeSet<u64>,
}

impl Default for Session {
    fn default() -> Session {
        Session {
            possible: BTreeSet::from([0]),
        }
    }
}

/// The counter a cell printed (`@n=<n>` at the start of its stdout).
pub fn counter(stdout: &str) -> Option<u64> {
    stdout.strip_prefix("@n=")?.split('\n').next()?.parse().ok()
}

impl Session {
    /// The request got no whole answer: it may have run once more.
    pub fn unanswered(&mut self) {
        let more: Vec<u64> = self.possible.iter().map(|p| p + 1).collect();
        self.possible.extend(more);
    }

    /// Check an answer (`r`, a cell result) to a cell of `kind`; returns
    /// what was untrue, if anything, and updates what the kernel holds.
    pub fn answer(&mut self, kind: Kind, reset: bool, hits: Hits, r: &Value) -> Vec<String> {
        let mut lies = Vec::new();
        let status = r["status"].as_str().unwrap_or("?");
        let k = &r["kernel"];
        let flag = |name: &str| k[name].as_bool().unwrap_or(false);
        let (lost, was_reset, ended) = (flag("state_lost"), flag("state_reset"), flag("ended"));
        let n = counter(r["stdout"].as_str().unwrap_or(""));
        let died = r["error"]
            .as_str()
            .is_some_and(|e| e.contains("KernelDied"));
        if let Some(why) = status_lie(kind, status, lost, died, hits, r) {
            lies.push(why);
        }
        if reset && !was_reset {
            lies.push("a reset was asked for and the answer does not say state_reset".into());
        }
        let restored = k["restored"].is_object();
        if restored && status == "success" && n == Some(1) && !lost {
            lies.push("restored from a snapshot, yet the counter restarted".into());
        }
        if let Some(n) = n {
            let fresh = n == 1;
            let continued = self.possible.iter().any(|&p| p > 0 && p + 1 == n);
            // A snapshot older than the state (taken on request, then the
            // daemon was killed) brings an earlier counter back, and says
            // the state was lost.
            let stale = restored && lost;
            if !fresh && !continued && !stale {
                lies.push(format!("the counter went from {:?} to {n}", self.possible));
            }
            if fresh && !self.possible.contains(&0) && !lost && !was_reset {
                lies.push(format!(
                    "a fresh kernel (counter was {:?}) without state_lost or state_reset",
                    self.possible
                ));
            }
            if !fresh && was_reset {
                lies.push(format!("state_reset, yet the counter continued to {n}"));
            }
            if !fresh && lost && status == "success" && !restored {
                lies.push(format!(
                    "state_lost on a successful cell whose counter continued to {n}"
                ));
            }
        }
        self.possible = if ended {
            BTreeSet::from([0])
        } else if lost && status != "success" {
            // Lost before this cell (it ran fresh) or during it (the
            // kernel died): either way the client has been told.
            let mut s = BTreeSet::from([0]);
            s.extend(n);
            s
        } else if let Some(n) = n {
            BTreeSet::from([n])
        } else if lost || was_reset {
            BTreeSet::from([0, 1])
        } else {
            // Stopped before the counter printed (an interrupt): it may
            // or may not have counted.
            let mut s = self.possible.clone();
            s.extend(self.possible.iter().map(|p| p + 1));
            s
        };
        lies
    }
}

/// Whether `status` is one the cell could truly end with.
fn status_lie(
    kind: Kind,
    status: &str,
    lost: bool,
    died: bool,
    hits: Hits,
    r: &Value,
) -> Option<String> {
    if died && !lost {
        return Some("the kernel died (KernelDied) but state_lost is false".into());
    }
    let killed = hits.killed && died && status == "error";
    let interrupted = hits.interrupted && status == "interrupted";
    if killed || interrupted {
        return None;
    }
    let ok = match kind {
        Kind::Ok | Kind::Sleep => status == "success",
        Kind::Flood => status == "success" && r["truncated"]["stdout"] == true,
        Kind::Raise => {
            status == "error"
                && r["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("ValueError"))
        }
        Kind::Timeout => status == "timeout",
        Kind::Exit => status == "error" && died,
    };
    (!ok).then(|| {
        format!(
            "a {} cell answered {status} (error {:?}; interrupted {}, killed {})",
            kind.name(),
            r["error"],
            hits.interrupted,
            hits.killed
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn result(status: &str, n: Option<u64>, lost: bool, reset: bool) -> Value {
        let stdout = n.map(|n| format!("@n={n}\n")).unwrap_or_default();
        json!({"status": status, "stdout": stdout, "error": null,
               "kernel": {"state_lost": lost, "state_reset": reset, "ended": false}})
    }

    #[test]
    fn a_counter_that_restarts_silently_is_a_lie() {
        let mut s = Session::default();
        assert!(s
            .answer(
                Kind::Ok,
                false,
                Hits::default(),
                &result("success", Some(1), false, false)
            )
            .is_empty());
        assert!(s
            .answer(
                Kind::Ok,
                false,
                Hits::default(),
                &result("success", Some(2), false, false)
            )
            .is_empty());
        let lies = s.answer(
            Kind::Ok,
            false,
            Hits::default(),
            &result("success", Some(1), false, false),
        );
        assert_eq!(lies.len(), 1, "{lies:?}");
        // Said so: truthful.
        let mut s2 = Session::default();
        s2.answer(
            Kind::Ok,
            false,
            Hits::default(),
            &result("success", Some(1), false, false),
        );
        assert!(s2
            .answer(
                Kind::Ok,
                false,
                Hits::default(),
                &result("success", Some(1), true, false)
            )
            .is_empty());
    }

    #[test]
    fn a_loss_claimed_while_the_counter_continued_is_a_lie() {
        let mut s = Session::default();
        s.answer(
            Kind::Ok,
            false,
            Hits::default(),
            &result("success", Some(1), false, false),
        );
        let lies = s.answer(
            Kind::Ok,
            false,
            Hits::default(),
            &result("success", Some(2), true, false),
        );
        assert_eq!(lies.len(), 1, "{lies:?}");
    }

    #[test]
    fn an_unanswered_cell_may_or_may_not_have_counted() {
        let mut s = Session::default();
        s.answer(
            Kind::Ok,
            false,
            Hits::default(),
            &result("success", Some(1), false, false),
        );
        s.unanswered();
        assert!(s
            .clone()
            .answer(
                Kind::Ok,
                false,
                Hits::default(),
                &result("success", Some(2), false, false)
            )
            .is_empty());
        assert!(s
            .answer(
                Kind::Ok,
                false,
                Hits::default(),
                &result("success", Some(3), false, false)
            )
            .is_empty());
    }

    #[test]
    fn a_restore_continues_the_counter_or_says_the_state_was_lost() {
        let mut s = Session::default();
        s.answer(
            Kind::Ok,
            false,
            Hits::default(),
            &result("success", Some(1), false, false),
        );
        let mut back = result("success", Some(2), false, false);
        back["kernel"]["restored"] = json!({"names": 1, "from": "evicted"});
        assert!(s
            .clone()
            .answer(Kind::Ok, false, Hits::default(), &back)
            .is_empty());
        let mut lied = result("success", Some(1), false, false);
        lied["kernel"]["restored"] = json!({"names": 1, "from": "evicted"});
        let lies = s.answer(Kind::Ok, false, Hits::default(), &lied);
        assert_eq!(lies.len(), 2, "{lies:?}");
    }

    #[test]
    fn statuses_must_match_what_the_cell_did() {
        let mut s = Session::default();
        let lies = s.answer(
            Kind::Raise,
            false,
            Hits::default(),
            &result("success", Some(1), false, false),
        );
        assert_eq!(lies.len(), 1);
        let lies = s.answer(
            Kind::Ok,
            false,
            Hits::default(),
            &result("interrupted", None, false, false),
        );
        assert_eq!(lies.len(), 1, "nobody interrupted it");
        let hit = Hits {
            interrupted: true,
            killed: false,
        };
        assert!(s
            .answer(
                Kind::Ok,
                false,
                hit,
                &result("interrupted", None, false, false)
            )
            .is_empty());
    }
}

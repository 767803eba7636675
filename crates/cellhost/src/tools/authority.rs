//! A cell's authority over tools: which it may call, how many times, and
//! whether it is still running.
//!
//! The kernel installs a fresh authority in its [`AuthoritySlot`] before it
//! sends a cell and retires it when the cell settles. The tool server looks
//! the slot up on every call, so a call always runs under the cell running
//! *now* (a callable saved in cell 1 and called in cell 2 spends cell 2's
//! budget), and a call made when no cell runs (a thread left over from a
//! finished cell) is refused. Retiring also cancels calls still in flight.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{Tool, ToolError, ToolSet};

/// The current cell's authority, shared by a kernel and its tool server.
pub(crate) type AuthoritySlot = Arc<Mutex<Option<Arc<Authority>>>>;

pub(crate) struct Authority {
    /// The kernel's tools; `None`: this cell was given none.
    tools: Option<ToolSet>,
    /// The cell's allow-list; `None`: every tool of the kernel.
    allowed: Option<BTreeSet<String>>,
    max_calls: u32,
    made: AtomicU32,
    /// `false` once retired. Admitting a call and starting it happen under
    /// this lock, and retiring takes it: after `retire` returns, no call
    /// can reach a tool any more.
    open: Mutex<bool>,
    retired: watch::Sender<bool>,
}

impl Authority {
    pub(crate) fn new(
        tools: Option<ToolSet>,
        allowed: Option<BTreeSet<String>>,
        max_calls: u32,
    ) -> Arc<Authority> {
        Arc::new(Authority {
            tools,
            allowed,
            max_calls,
            made: AtomicU32::new(0),
            open: Mutex::new(true),
            retired: watch::Sender::new(false),
        })
    }

    /// Check a call of `name` and start it, counted against the budget, or
    /// say why it is refused (it never reaches the tool then). The call
    /// runs in its own task (a panic fails only it) and ends with
    /// "cancelled" as soon as the cell settles.
    pub(crate) fn dispatch(
        self: &Arc<Self>,
        name: &str,
        args: Value,
    ) -> Result<JoinHandle<Result<Value, ToolError>>, String> {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if !*open {
            return Err(refused_no_cell(name));
        }
        let tool = self.admit(name)?;
        let me = self.clone();
        let name = name.to_owned();
        Ok(tokio::spawn(async move {
            tokio::select! {
                biased;
                () = me.retired() => Err(ToolError::new(format!(
                    "tool call {name:?} cancelled: its cell ended (timeout, interrupt or kernel \
                     stop) before the tool returned"
                ))),
                r = tool.call(args) => r,
            }
        }))
    }

    fn admit(&self, name: &str) -> Result<Arc<dyn Tool>, String> {
        let Some(tools) = &self.tools else {
            return Err(format!(
                "tool call {name:?} refused: this cell was given no tools"
            ));
        };
        let Some(tool) = tools.get(name) else {
            return Err(format!(
                "unknown tool {name:?}; this kernel's tools are: {}",
                tools.known()
            ));
        };
        if let Some(allowed) = &self.allowed {
            if !allowed.contains(name) {
                let list: Vec<&str> = allowed.iter().map(String::as_str).collect();
                return Err(format!(
                    "tool {name:?} is not allowed in this cell (allowed: {})",
                    if list.is_empty() {
                        "none".to_owned()
                    } else {
                        list.join(", ")
                    }
                ));
            }
        }
        let max = self.max_calls;
        if self
            .made
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .is_err()
        {
            return Err(format!(
                "tool budget exhausted: this cell may make at most {max} tool calls \
                 (max_tool_calls); call fewer tools or ask for a larger budget"
            ));
        }
        Ok(tool.clone())
    }

    /// Calls that reached a tool.
    pub(crate) fn made(&self) -> u64 {
        u64::from(self.made.load(Ordering::Acquire))
    }

    /// The cell settled: refuse new calls and cancel those in flight.
    pub(crate) fn retire(&self) {
        *self.open.lock().unwrap_or_else(|e| e.into_inner()) = false;
        self.retired.send_replace(true);
    }

    /// Resolves once the cell has settled.
    pub(crate) async fn retired(&self) {
        let mut rx = self.retired.subscribe();
        let _ = rx.wait_for(|r| *r).await;
    }
}

/// Why a call made when no cell runs is refused.
pub(crate) fn refused_no_cell(name: &str) -> String {
    format!(
        "tool call {name:?} refused: no cell is running in this kernel (a thread left over \
         from a finished cell?); tools can be called only while a cell runs"
    )
}

/// Install `authority` as the running cell's (in `slot`, where the
/// kernel's tool server looks it up; a remote kernel serves its calls
/// itself and has none), returning a guard that retires it (however the
/// cell ends, even if the caller is dropped).
pub(crate) fn install(slot: Option<&AuthoritySlot>, authority: Arc<Authority>) -> Installed {
    if let Some(slot) = slot {
        *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(authority.clone());
    }
    Installed {
        slot: slot.cloned(),
        authority,
    }
}

pub(crate) struct Installed {
    slot: Option<AuthoritySlot>,
    authority: Arc<Authority>,
}

impl Installed {
    /// The running cell's authority.
    pub(crate) fn authority(&self) -> &Arc<Authority> {
        &self.authority
    }

    /// Retire now and say how many calls reached a tool (counted after
    /// retiring, so none can be added later).
    pub(crate) fn settle(self) -> u64 {
        self.retire();
        self.authority.made()
    }

    fn retire(&self) {
        if let Some(slot) = &self.slot {
            let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
            if slot
                .as_ref()
                .is_some_and(|a| Arc::ptr_eq(a, &self.authority))
            {
                *slot = None;
            }
        }
        self.authority.retire();
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        self.retire();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::FnTool;
    use serde_json::{json, Value};

    fn set() -> ToolSet {
        let t = |n: &str| {
            FnTool::new(n, "x", json!({}), |_| {
                std::future::ready(Ok::<_, crate::tools::ToolError>(Value::Null))
            })
        };
        ToolSet::new().with(t("a")).unwrap().with(t("b")).unwrap()
    }

    #[test]
    fn budget_allow_list_and_unknown_tools() {
        let a = Authority::new(Some(set()), Some(["a".to_owned()].into()), 2);
        assert!(a.admit("a").is_ok());
        let e = a.admit("b").err().unwrap();
        assert!(e.contains("not allowed in this cell (allowed: a)"), "{e}");
        let e = a.admit("zz").err().unwrap();
        assert!(
            e.contains("unknown tool \"zz\"; this kernel's tools are: a, b"),
            "{e}"
        );
        assert!(a.admit("a").is_ok());
        let e = a.admit("a").err().unwrap();
        assert!(e.contains("at most 2 tool calls"), "{e}");
        assert_eq!(a.made(), 2, "refused calls are not counted");
        let none = Authority::new(None, None, 5);
        let e = none.admit("a").err().unwrap();
        assert!(e.contains("this cell was given no tools"), "{e}");
    }

    #[tokio::test]
    async fn a_retired_authority_starts_nothing() {
        let a = Authority::new(Some(set()), None, 5);
        assert!(a.dispatch("a", Value::Null).unwrap().await.unwrap().is_ok());
        a.retire();
        let e = a.dispatch("a", Value::Null).err().unwrap();
        assert!(e.contains("no cell is running"), "{e}");
        assert_eq!(a.made(), 1);
    }

    #[tokio::test]
    async fn a_settled_cell_leaves_no_authority_and_cancels_waiters() {
        let slot = AuthoritySlot::default();
        let a = Authority::new(Some(set()), None, 5);
        let installed = install(Some(&slot), a.clone());
        assert!(slot.lock().unwrap().is_some());
        let waiter = tokio::spawn({
            let a = a.clone();
            async move { a.retired().await }
        });
        assert_eq!(installed.settle(), 0);
        assert!(slot.lock().unwrap().is_none());
        waiter.await.unwrap();
        // A later cell's authority is not removed by an older guard.
        let b = Authority::new(Some(set()), None, 5);
        let old = install(Some(&slot), a);
        let new = install(Some(&slot), b.clone());
        drop(old);
        assert!(slot
            .lock()
            .unwrap()
            .as_ref()
            .is_some_and(|x| Arc::ptr_eq(x, &b)));
        drop(new);
    }
}

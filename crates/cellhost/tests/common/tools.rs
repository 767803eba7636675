//! Real tools for the tool RPC tests: each records what reached it.
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cellhost::tools::{FnTool, ToolError, ToolSet};
use serde_json::{json, Value};

/// What reached the tools: (tool, args) in arrival order.
#[derive(Clone, Default)]
pub struct Log {
    pub calls: Arc<Mutex<Vec<(String, Value)>>>,
    /// Calls running right now, and the most ever at once.
    pub running: Arc<AtomicUsize>,
    pub most_at_once: Arc<AtomicUsize>,
    /// Set when a slow call's future was dropped before it finished.
    pub cancelled: Arc<AtomicBool>,
    pub slow_started: Arc<AtomicBool>,
}

impl Log {
    pub fn names(&self) -> Vec<String> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .map(|(n, _)| n.clone())
            .collect()
    }

    pub fn count(&self, name: &str) -> usize {
        self.names().iter().filter(|n| *n == name).count()
    }

    fn record(&self, name: &str, args: &Value) {
        self.calls
            .lock()
            .unwrap()
            .push((name.to_owned(), args.clone()));
    }
}

struct Running(Arc<AtomicUsize>);
impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

struct SetOnDrop(Arc<AtomicBool>, bool);
impl Drop for SetOnDrop {
    fn drop(&mut self) {
        if !self.1 {
            self.0.store(true, Ordering::SeqCst);
        }
    }
}

/// `echo(text, n=1)` → {"echo": text * n}; `fail(why)` → ToolError(why);
/// `boom()` panics; `nap(ms)` sleeps ms and counts concurrency;
/// `slow()` sleeps 60 s unless cancelled; `noop()` → null.
pub fn toolset(log: &Log) -> ToolSet {
    let l = log.clone();
    let echo = FnTool::new(
        "echo",
        "Repeat `text` n times.",
        json!({"type": "object",
               "properties": {"text": {"type": "string", "description": "what to repeat"},
                              "n": {"type": "integer"}},
               "required": ["text"]}),
        move |args| {
            let l = l.clone();
            async move {
                l.record("echo", &args);
                let text = args["text"].as_str().ok_or("text must be a string")?;
                let n = args.get("n").and_then(Value::as_u64).unwrap_or(1) as usize;
                Ok(json!({"echo": text.repeat(n)}))
            }
        },
    );
    let l = log.clone();
    let fail = FnTool::new(
        "fail",
        "Always fails.",
        json!({"type": "object", "properties": {"why": {"type": "string"}}}),
        move |args| {
            let l = l.clone();
            async move {
                l.record("fail", &args);
                Err(ToolError::new(format!(
                    "failed on purpose: {}",
                    args["why"].as_str().unwrap_or("?")
                )))
            }
        },
    );
    let l = log.clone();
    let boom = FnTool::new("boom", "Panics.", json!({"type": "object"}), move |args| {
        let l = l.clone();
        async move {
            l.record("boom", &args);
            if args.is_object() {
                panic!("the boom tool exploded");
            }
            Ok(Value::Null)
        }
    });
    let l = log.clone();
    let nap = FnTool::new(
        "nap",
        "Sleep ms milliseconds.",
        json!({"type": "object", "properties": {"ms": {"type": "integer"}}, "required": ["ms"]}),
        move |args| {
            let l = l.clone();
            async move {
                l.record("nap", &args);
                let now = l.running.fetch_add(1, Ordering::SeqCst) + 1;
                let _running = Running(l.running.clone());
                l.most_at_once.fetch_max(now, Ordering::SeqCst);
                let ms = args["ms"].as_u64().unwrap_or(0);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Ok(json!(ms))
            }
        },
    );
    let l = log.clone();
    let slow = FnTool::new("slow", "Sleeps a minute.", json!({}), move |args| {
        let l = l.clone();
        async move {
            l.record("slow", &args);
            l.slow_started.store(true, Ordering::SeqCst);
            let mut guard = SetOnDrop(l.cancelled.clone(), false);
            tokio::time::sleep(Duration::from_secs(60)).await;
            guard.1 = true;
            Ok(json!("done"))
        }
    });
    let l = log.clone();
    let noop = FnTool::new("noop", "Does nothing.", json!({}), move |args| {
        let l = l.clone();
        async move {
            l.record("noop", &args);
            Ok(Value::Null)
        }
    });
    ToolSet::new()
        .with(echo)
        .and_then(|s| s.with(fail))
        .and_then(|s| s.with(boom))
        .and_then(|s| s.with(nap))
        .and_then(|s| s.with(slow))
        .and_then(|s| s.with(noop))
        .unwrap()
}

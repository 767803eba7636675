use super::*;
use cellhost_protocol::{KernelInfo, Status, Truncated};

fn result(stdout: &str) -> CellResult {
    CellResult {
        status: Status::Success,
        stdout: stdout.into(),
        stderr: String::new(),
        value: Some("2".into()),
        error: None,
        traceback: None,
        hint: None,
        displays: vec![],
        value_display: None,
        truncated: Truncated::default(),
        tool_calls_made: 1,
        duration_seconds: 0.01,
        kernel: KernelInfo {
            id: "k-1".into(),
            execution_count: 3,
            ..KernelInfo::default()
        },
    }
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

use std::future::Future;
use std::time::SystemTime;

#[test]
fn the_history_is_private_to_its_user() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data/history.sqlite");
    let h = History::open(&path, &HistoryConfig::default(), []).unwrap();
    h.record(HistoryEntry::of("s", None, "x", now(), &result("out")));
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir.path().join("data")), 0o700);
    assert_eq!(mode(&path), 0o600);
    for side in ["history.sqlite-wal", "history.sqlite-shm"] {
        let p = dir.path().join("data").join(side);
        assert!(p.exists(), "{side}");
        assert_eq!(mode(&p), 0o600, "{side}");
    }
    h.close();
    // An older, world-readable database is tightened on open.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let h = History::open(&path, &HistoryConfig::default(), []).unwrap();
    assert_eq!(mode(&path), 0o600);
    h.close();
}

#[test]
fn rows_survive_reopening_and_come_back_oldest_first() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h/history.sqlite");
    let h = History::open(&path, &HistoryConfig::default(), []).unwrap();
    for i in 0..5 {
        h.record(HistoryEntry::of(
            "s1",
            None,
            &format!("x={i}"),
            now(),
            &result("out"),
        ));
    }
    h.record(HistoryEntry::of("s2", Some("c"), "y", now(), &result("")));
    h.close();
    let h = History::open(&path, &HistoryConfig::default(), []).unwrap();
    let rows = h.session("s1", 3).unwrap();
    let codes: Vec<_> = rows.iter().map(|r| r.code.as_str()).collect();
    assert_eq!(codes, ["x=2", "x=3", "x=4"]);
    assert_eq!(rows[0].kernel_id, "k-1");
    assert_eq!((rows[0].execution_count, rows[0].tool_calls_made), (3, 1));
    let other = h.session("s2", 10).unwrap();
    assert_eq!(other[0].child.as_deref(), Some("c"));
    assert_eq!(h.recent(100).unwrap().len(), 6);
}

#[test]
fn retention_keeps_at_most_max_rows_and_drops_old_days() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("history.sqlite");
    let config = HistoryConfig {
        max_rows: 10,
        max_days: 1,
        ..HistoryConfig::default()
    };
    let h = History::open(&path, &config, []).unwrap();
    h.record(HistoryEntry::of(
        "old",
        None,
        "x",
        now() - 3.0 * 86_400.0,
        &result(""),
    ));
    for i in 0..(PRUNE_EVERY + 5) {
        h.record(HistoryEntry::of(
            "s",
            None,
            &format!("{i}"),
            now(),
            &result(""),
        ));
    }
    h.close();
    let h = History::open(&path, &config, []).unwrap();
    let all = h.recent(1000).unwrap();
    assert_eq!(all.len(), 10);
    assert_eq!(all.last().unwrap().code, format!("{}", PRUNE_EVERY + 4));
    assert!(h.session("old", 10).unwrap().is_empty());
}

#[test]
fn secrets_in_code_are_redacted_before_they_are_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("history.sqlite");
    let h = History::open(
        &path,
        &HistoryConfig::default(),
        ["s3cr3tvalue!".to_owned()],
    )
    .unwrap();
    let code = "key = 'sk-abcdefghijklmnopqrstuvwxyz012345'; pw = 's3cr3tvalue!'";
    h.record(HistoryEntry::of("s", None, code, now(), &result("")));
    h.flush();
    let row = &h.session("s", 1).unwrap()[0];
    assert!(!row.code.contains("abcdefghijklmnop"), "{}", row.code);
    assert!(!row.code.contains("s3cr3tvalue!"), "{}", row.code);
    let raw = std::fs::read(&path).unwrap();
    assert!(!raw.windows(12).any(|w| w == b"s3cr3tvalue!"));
}

#[test]
fn a_file_that_is_not_a_database_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("history.sqlite");
    std::fs::write(&path, vec![b'x'; 4096]).unwrap();
    let err = History::open(&path, &HistoryConfig::default(), []).unwrap_err();
    assert!(err.to_string().contains("history"), "{err}");
    // The message names what failed, its source why: printed as a chain,
    // the cause appears once.
    let line = crate::error_chain(&err);
    let cause = std::error::Error::source(&err).unwrap().to_string();
    assert!(!err.to_string().contains(&cause), "{err}");
    assert_eq!(line.matches(&cause).count(), 1, "{line}");
}

#[tokio::test]
async fn a_committed_row_is_readable_without_a_flush_and_a_closed_writer_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("history.sqlite");
    let h = History::open(&path, &HistoryConfig::default(), []).unwrap();
    // A lingering unacknowledged row goes with the next committed one.
    h.record(HistoryEntry::of("s", None, "a", now(), &result("1")));
    assert!(
        h.record_committed(HistoryEntry::of("s", None, "b", now(), &result("2")))
            .await
    );
    let rows = h.session("s", 10).unwrap();
    assert_eq!(
        rows.iter().map(|r| r.code.as_str()).collect::<Vec<_>>(),
        ["a", "b"]
    );
    h.close();
    assert!(
        !h.record_committed(HistoryEntry::of("s", None, "c", now(), &result("3")))
            .await
    );
}

#[tokio::test]
async fn without_wait_for_commit_the_answer_does_not_wait_but_the_row_lands() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("history.sqlite");
    let config = HistoryConfig {
        wait_for_commit: false,
        ..HistoryConfig::default()
    };
    let h = History::open(&path, &config, []).unwrap();
    assert!(
        h.record_committed(HistoryEntry::of("s", None, "a", now(), &result("1")))
            .await
    );
    h.flush();
    let rows = h.session("s", 10).unwrap();
    assert_eq!(rows.len(), 1);
    h.close();
}

#[test]
fn pages_are_bounded_by_rows_and_bytes_and_continue_where_they_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let h = History::open(&dir.path().join("h.sqlite"), &HistoryConfig::default(), []).unwrap();
    for i in 0..5 {
        h.record(HistoryEntry::of(
            "s",
            None,
            "c",
            now(),
            &result(&format!("{i}").repeat(1000)),
        ));
    }
    h.record(HistoryEntry::of("t", None, "c", now(), &result("other")));
    h.flush();
    let q = |before, after, max_bytes| PageQuery {
        session: Some("s".into()),
        tenant: None,
        limit: 100,
        max_bytes,
        before,
        after,
    };
    let first = h.page(&q(None, None, 2500)).unwrap();
    let ids: Vec<i64> = first.rows.iter().map(|r| r.id).collect();
    assert_eq!(ids, [4, 5], "newest rows, oldest first");
    assert_eq!(first.next_before, Some(4));
    let rest = h.page(&q(Some(4), None, 1 << 20)).unwrap();
    assert_eq!(
        rest.rows.iter().map(|r| r.id).collect::<Vec<_>>(),
        [1, 2, 3]
    );
    assert_eq!(rest.next_before, None);
    // One row larger than the bound still comes, alone.
    let one = h.page(&q(None, None, 10)).unwrap();
    assert_eq!((one.rows.len(), one.next_before), (1, Some(5)));
    let new = h.page(&q(None, Some(3), 1 << 20)).unwrap();
    assert_eq!(new.rows.iter().map(|r| r.id).collect::<Vec<_>>(), [4, 5]);
    assert_eq!(h.health(), HistoryHealth::default());
}

#[test]
fn long_code_is_stored_as_head_tail_and_hash() {
    let dir = tempfile::tempdir().unwrap();
    let config = HistoryConfig {
        max_field_bytes: 2048,
        ..HistoryConfig::default()
    };
    let h = History::open(&dir.path().join("h.sqlite"), &config, []).unwrap();
    let code = format!("first = 1\n{}\nlast = 2", "#".repeat(50_000));
    h.record(HistoryEntry::of("s", None, &code, now(), &result("x")));
    h.flush();
    let row = &h.session("s", 10).unwrap()[0];
    assert!(row.code.len() <= 2048, "{}", row.code.len());
    assert!(row.code.starts_with("first = 1") && row.code.ends_with("last = 2"));
    assert!(row.code.contains(&sha256_hex(code.as_bytes())));
}

#[test]
fn rows_carry_their_tenant_and_pages_filter_by_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h.sqlite");
    // A database from before tenants: no tenant column yet.
    {
        let c = rusqlite::Connection::open(&path).unwrap();
        c.execute_batch(
            "CREATE TABLE cells (id INTEGER PRIMARY KEY AUTOINCREMENT, session TEXT NOT NULL,
             child TEXT, code TEXT NOT NULL, status TEXT NOT NULL, stdout TEXT NOT NULL,
             stderr TEXT NOT NULL, value TEXT, error TEXT, started_at REAL NOT NULL,
             duration_seconds REAL NOT NULL, execution_count INTEGER NOT NULL,
             kernel_id TEXT NOT NULL, tool_calls_made INTEGER NOT NULL DEFAULT 0,
             state_reset INTEGER NOT NULL DEFAULT 0, state_lost INTEGER NOT NULL DEFAULT 0,
             note TEXT);",
        )
        .unwrap();
    }
    let h = History::open(&path, &HistoryConfig::default(), []).unwrap();
    h.record(HistoryEntry::of("s1", None, "admin", now(), &result("x")));
    for t in ["a", "b"] {
        let mut e = HistoryEntry::of(&format!("{t}:s1"), None, t, now(), &result("x"));
        e.tenant = Some(t.into());
        h.record(e);
    }
    h.flush();
    let q = |tenant: Option<&str>, session: Option<&str>| PageQuery {
        session: session.map(Into::into),
        tenant: tenant.map(Into::into),
        limit: 100,
        max_bytes: 1 << 20,
        before: None,
        after: None,
    };
    let codes = |q| {
        h.page(&q)
            .unwrap()
            .rows
            .into_iter()
            .map(|r| (r.code, r.tenant))
            .collect::<Vec<_>>()
    };
    assert_eq!(codes(q(Some("a"), None)), [("a".into(), Some("a".into()))]);
    assert_eq!(codes(q(Some("b"), Some("a:s1"))), []);
    assert_eq!(codes(q(None, None)).len(), 3);
    assert_eq!(codes(q(None, Some("s1"))), [("admin".into(), None)]);
}

#[test]
fn displays_and_the_client_are_kept_bounded_and_an_older_database_gains_their_columns() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("history.sqlite");
    // A database made before the columns existed, with one row.
    {
        let c = rusqlite::Connection::open(&path).unwrap();
        c.execute_batch(
            "CREATE TABLE cells (id INTEGER PRIMARY KEY AUTOINCREMENT, session TEXT NOT NULL,
             child TEXT, code TEXT NOT NULL, status TEXT NOT NULL, stdout TEXT NOT NULL,
             stderr TEXT NOT NULL, value TEXT, error TEXT, started_at REAL NOT NULL,
             duration_seconds REAL NOT NULL, execution_count INTEGER NOT NULL,
             kernel_id TEXT NOT NULL, tool_calls_made INTEGER NOT NULL DEFAULT 0,
             state_reset INTEGER NOT NULL DEFAULT 0, state_lost INTEGER NOT NULL DEFAULT 0,
             note TEXT);
             INSERT INTO cells (session, code, status, stdout, stderr, started_at,
             duration_seconds, execution_count, kernel_id) VALUES ('old', 'x', 'success', '',
             '', CAST(strftime('%s','now') AS REAL), 0.1, 1, 'k-0');",
        )
        .unwrap();
    }
    let config = HistoryConfig {
        max_field_bytes: 1024,
        ..HistoryConfig::default()
    };
    let h = History::open(&path, &config, []).unwrap();
    let mut r = result("");
    let item = |mime: &str, data: String, display| DisplayItem {
        mime: mime.into(),
        data,
        display,
    };
    r.displays = vec![
        item("image/png", "QUJD".into(), 0),
        // Over 8 × 1024 bytes: left out of the row, the rest kept.
        item("image/png", "A".repeat(9000), 1),
        item("text/plain", "<Figure>".into(), 1),
    ];
    let mut e = HistoryEntry::of("s", None, "plot()", now(), &r);
    e.client = Some("claude-code".into());
    h.record(e);
    h.flush();
    let old = &h.session("old", 1).unwrap()[0];
    assert!(old.displays.is_empty() && old.client.is_none());
    let row = &h.session("s", 1).unwrap()[0];
    assert_eq!(row.client.as_deref(), Some("claude-code"));
    let kept: Vec<_> = row.displays.iter().map(|d| d.data.as_str()).collect();
    assert_eq!(kept, ["QUJD", "<Figure>"]);
    let json = serde_json::to_value(row).unwrap();
    assert_eq!(json["displays"][0]["mime"], "image/png");
    assert!(serde_json::to_value(old).unwrap().get("displays").is_none());
}

#[test]
fn the_caller_commits_its_own_row_after_one_yield() {
    let dir = tempfile::tempdir().unwrap();
    let h = History::open(&dir.path().join("h.sqlite"), &HistoryConfig::default(), []).unwrap();
    let mut committed = h.record_committed(HistoryEntry::of("s", None, "a", now(), &result("1")));
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    // The first poll yields (so other callers can queue theirs), the
    // second commits on this thread: no writer thread is waited for.
    assert!(std::pin::Pin::new(&mut committed)
        .poll(&mut cx)
        .is_pending());
    assert_eq!(
        std::pin::Pin::new(&mut committed).poll(&mut cx),
        std::task::Poll::Ready(true)
    );
    assert_eq!(h.session("s", 10).unwrap().len(), 1);
    // A claimed commit that is dropped unpolled still commits what it
    // claimed, its own row and a later caller's.
    let first = h.record_committed(HistoryEntry::of("s", None, "b", now(), &result("2")));
    let mut second = h.record_committed(HistoryEntry::of("s", None, "c", now(), &result("3")));
    drop(first);
    assert_eq!(
        std::pin::Pin::new(&mut second).poll(&mut cx),
        std::task::Poll::Ready(true)
    );
    assert_eq!(h.session("s", 10).unwrap().len(), 3);
    h.close();
}

#[tokio::test(flavor = "current_thread")]
async fn callers_ready_together_on_one_thread_share_one_commit() {
    let dir = tempfile::tempdir().unwrap();
    let h = Arc::new(
        History::open(&dir.path().join("h.sqlite"), &HistoryConfig::default(), []).unwrap(),
    );
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let h = h.clone();
            tokio::spawn(async move {
                h.record_committed(HistoryEntry::of(
                    "s",
                    None,
                    &format!("c{i}"),
                    now(),
                    &result("1"),
                ))
                .await
            })
        })
        .collect();
    for t in tasks {
        assert!(t.await.unwrap());
    }
    assert_eq!(
        h.commits(),
        1,
        "16 rows queued on one thread before the first commit"
    );
    assert_eq!(h.session("s", 100).unwrap().len(), 16);
    h.close();
}

#[test]
fn a_burst_of_waiting_answers_is_committed_by_the_background_thread_and_every_waiter_told() {
    // 32 answers ready at once on one runtime thread: the first claims the
    // commit, yields, finds the others queued and hands the batch to the
    // background thread (the load path); every wait must still resolve.
    let dir = tempfile::tempdir().unwrap();
    let h = Arc::new(
        History::open(&dir.path().join("h.sqlite"), &HistoryConfig::default(), []).unwrap(),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for round in 0..20 {
        let answered = rt.block_on(async {
            let tasks: Vec<_> = (0..32)
                .map(|i| {
                    let h = h.clone();
                    tokio::spawn(async move {
                        let code = format!("r{round}-{i}");
                        let row = HistoryEntry::of("burst", None, &code, now(), &result("1"));
                        h.record_committed(row).await
                    })
                })
                .collect();
            let mut all = true;
            for t in tasks {
                all &= tokio::time::timeout(std::time::Duration::from_secs(10), t)
                    .await
                    .expect("a waiting answer was never told its row committed")
                    .unwrap();
            }
            all
        });
        assert!(answered, "round {round}: a row was not committed");
    }
    assert_eq!(h.session("burst", 1000).unwrap().len(), 640);
    h.close();
}

#[test]
fn concurrent_callers_share_commits_and_every_row_lands() {
    let dir = tempfile::tempdir().unwrap();
    let h = Arc::new(
        History::open(&dir.path().join("h.sqlite"), &HistoryConfig::default(), []).unwrap(),
    );
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let h = h.clone();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap();
                for i in 0..100 {
                    let code = format!("t{t}-{i}");
                    let row = HistoryEntry::of(&format!("s{t}"), None, &code, now(), &result("1"));
                    assert!(rt.block_on(h.record_committed(row)), "{code}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    for t in 0..8 {
        let rows = h.session(&format!("s{t}"), 1000).unwrap();
        let codes: Vec<String> = rows.into_iter().map(|r| r.code).collect();
        let want: Vec<String> = (0..100).map(|i| format!("t{t}-{i}")).collect();
        assert_eq!(codes, want, "each caller's rows land, in its order");
    }
    h.close();
}

#[test]
fn the_wal_is_checkpointed_off_the_commit_path_and_stays_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h.sqlite");
    let h = History::open(&path, &HistoryConfig::default(), []).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    // 3,000 one-row transactions write ~15,000 WAL frames (~60 MB) if
    // nothing checkpoints: the writer itself never does
    // (wal_autocheckpoint = 0), the background thread must.
    for i in 0..3000 {
        let row = HistoryEntry::of("s", None, &format!("c{i}"), now(), &result("1"));
        assert!(rt.block_on(h.record_committed(row)));
    }
    let wal = std::fs::metadata(dir.path().join("h.sqlite-wal"))
        .unwrap()
        .len();
    assert!(wal < 16 << 20, "the WAL grew to {wal} bytes");
    h.close();
    assert_eq!(
        History::open(&path, &HistoryConfig::default(), [])
            .unwrap()
            .recent(5000)
            .unwrap()
            .len(),
        3000
    );
}

#[test]
fn a_new_database_has_small_pages_and_tenant_queries_use_the_tenants_index() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h.sqlite");
    let h = History::open(&path, &HistoryConfig::default(), []).unwrap();
    let mut e = HistoryEntry::of("acme:s", None, "a", now(), &result("1"));
    e.tenant = Some("acme".into());
    h.record(e);
    h.record(HistoryEntry::of("s", None, "b", now(), &result("2")));
    h.flush();
    let conn = rusqlite::Connection::open(&path).unwrap();
    let page: i64 = conn
        .query_row("PRAGMA page_size", [], |r| r.get(0))
        .unwrap();
    assert_eq!(page, 1024, "a commit writes whole pages to the WAL");
    let plan: Vec<String> = conn
        .prepare(
            "EXPLAIN QUERY PLAN SELECT id FROM cells WHERE tenant = ?1 ORDER BY id DESC LIMIT 5",
        )
        .unwrap()
        .query_map(["acme"], |r| r.get(3))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(
        plan.iter().any(|p| p.contains("cells_tenant_set")),
        "{plan:?}"
    );
    let q = PageQuery {
        tenant: Some("acme".into()),
        limit: 10,
        max_bytes: 1 << 20,
        ..PageQuery::default()
    };
    let rows = h.page(&q).unwrap().rows;
    assert_eq!(
        rows.iter().map(|r| r.code.as_str()).collect::<Vec<_>>(),
        ["a"]
    );
    h.close();
}

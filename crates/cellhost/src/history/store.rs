//! The SQLite side of the history: schema, inserts, retention,
//! checkpoints and queries.

use std::path::Path;
use std::time::{Duration, SystemTime};

use rusqlite::{params, Connection};

use super::{HistoryEntry, HistoryError, Page, PageQuery};
use crate::config::HistoryConfig;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS cells (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session TEXT NOT NULL,
    child TEXT,
    code TEXT NOT NULL,
    status TEXT NOT NULL,
    stdout TEXT NOT NULL,
    stderr TEXT NOT NULL,
    value TEXT,
    error TEXT,
    started_at REAL NOT NULL,
    duration_seconds REAL NOT NULL,
    execution_count INTEGER NOT NULL,
    kernel_id TEXT NOT NULL,
    tool_calls_made INTEGER NOT NULL DEFAULT 0,
    state_reset INTEGER NOT NULL DEFAULT 0,
    state_lost INTEGER NOT NULL DEFAULT 0,
    note TEXT
);
CREATE INDEX IF NOT EXISTS cells_session ON cells(session, id);
CREATE INDEX IF NOT EXISTS cells_started ON cells(started_at);
";

pub(super) struct Retention {
    max_rows: u64,
    max_age: Option<Duration>,
}

impl From<&HistoryConfig> for Retention {
    fn from(c: &HistoryConfig) -> Retention {
        Retention {
            max_rows: c.max_rows,
            max_age: (c.max_days > 0).then(|| Duration::from_secs(c.max_days * 86_400)),
        }
    }
}

fn sqlite(about: &'static str, path: &Path) -> impl FnOnce(rusqlite::Error) -> HistoryError {
    let path = path.to_owned();
    move |source| HistoryError::Sqlite {
        about,
        path,
        source,
    }
}

pub(super) fn open_writer(path: &Path) -> Result<Connection, HistoryError> {
    let conn = Connection::open(path).map_err(sqlite("open the history database", path))?;
    conn.busy_timeout(Duration::from_secs(5))
        .map_err(sqlite("configure the history database", path))?;
    // A new database gets 1 KiB pages (a no-op on an existing one): a
    // commit writes each page it touches to the WAL whole, and a cell's row
    // touches about five (the table, its indexes, the id sequence), so a
    // one-line cell's commit writes ~6 KiB instead of ~22 KiB (bench-history).
    conn.execute_batch("PRAGMA page_size=1024;")
        .map_err(sqlite("configure the history database", path))?;
    let _: String = conn
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .map_err(sqlite("switch the history database to WAL", path))?;
    // Checkpoints are the background thread's, from its own connection
    // (see `commit`): never on a commit's path.
    conn.execute_batch("PRAGMA synchronous=NORMAL; PRAGMA wal_autocheckpoint=0;")
        .map_err(sqlite("configure the history database", path))?;
    conn.execute_batch(SCHEMA)
        .map_err(sqlite("create the history tables", path))?;
    migrate(&conn).map_err(sqlite("add the history's new columns", path))?;
    // Tenants' rows only: the admin's (tenant NULL, the common case) cost
    // no index page per commit. `tenant = ?` implies NOT NULL, so tenant
    // queries use it. Databases before this had a full index.
    conn.execute_batch(
        "DROP INDEX IF EXISTS cells_tenant;
         CREATE INDEX IF NOT EXISTS cells_tenant_set ON cells(tenant, id) WHERE tenant IS NOT NULL;",
    )
    .map_err(sqlite("create the history tables", path))?;
    Ok(conn)
}

/// The background thread's connection for WAL checkpoints.
pub(super) fn open_checkpointer(path: &Path) -> Result<Connection, HistoryError> {
    let conn = Connection::open(path).map_err(sqlite("open the history database", path))?;
    conn.execute_batch("PRAGMA synchronous=NORMAL;")
        .map_err(sqlite("configure the history database", path))?;
    Ok(conn)
}

/// Copy the WAL into the database as far as readers allow, without
/// waiting for anyone (the next commit then starts the WAL over).
pub(super) fn checkpoint(conn: &Connection) -> rusqlite::Result<()> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
}

/// Columns added after the first schema, added to an older database
/// (NULL in its rows).
const ADDED: [(&str, &str); 3] = [("tenant", "TEXT"), ("displays", "TEXT"), ("client", "TEXT")];

fn migrate(conn: &Connection) -> rusqlite::Result<()> {
    let mut stmt = conn.prepare("SELECT name FROM pragma_table_info('cells')")?;
    let have: Vec<String> = stmt
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    for (name, ty) in ADDED {
        if !have.iter().any(|h| h == name) {
            conn.execute_batch(&format!("ALTER TABLE cells ADD COLUMN {name} {ty}"))?;
        }
    }
    Ok(())
}

pub(super) fn prune(conn: &Connection, r: &Retention) -> rusqlite::Result<()> {
    if let Some(age) = r.max_age {
        let cutoff = now() - age.as_secs_f64();
        conn.execute("DELETE FROM cells WHERE started_at < ?1", params![cutoff])?;
    }
    if r.max_rows > 0 {
        // Ids only grow (AUTOINCREMENT) and rows are deleted only here and
        // by age, oldest first: the newest `max_rows` ids are the newest
        // `max_rows` cells, found by two seeks. (Counting rows back from
        // the newest walked up to `max_rows` index entries every
        // PRUNE_EVERY rows, most of the history's CPU under load, and read
        // the pages of a history too big for the cache from disk.)
        conn.execute(
            "DELETE FROM cells WHERE id <= (SELECT max(id) FROM cells) - ?1",
            params![r.max_rows as i64],
        )?;
    }
    Ok(())
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

pub(super) fn insert(conn: &mut Connection, rows: &[Box<HistoryEntry>]) -> rusqlite::Result<()> {
    let tx = conn.transaction()?;
    {
        let mut stmt = tx.prepare_cached(
            "INSERT INTO cells (session, child, code, status, stdout, stderr, value, error,
             started_at, duration_seconds, execution_count, kernel_id, tool_calls_made,
             state_reset, state_lost, note, tenant, displays, client)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16,
                     ?17, ?18, ?19)",
        )?;
        for e in rows {
            stmt.execute(params![
                e.session,
                e.child,
                e.code,
                e.status,
                e.stdout,
                e.stderr,
                e.value,
                e.error,
                e.started_at,
                e.duration_seconds,
                e.execution_count as i64,
                e.kernel_id,
                e.tool_calls_made as i64,
                e.state_reset,
                e.state_lost,
                e.note,
                e.tenant,
                (!e.displays.is_empty())
                    .then(|| serde_json::to_string(&e.displays).unwrap_or_default()),
                e.client,
            ])?;
        }
    }
    tx.commit()
}

fn reader(path: &Path) -> Result<Connection, HistoryError> {
    let conn = Connection::open_with_flags(
        path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(sqlite("read the history database", path))?;
    conn.busy_timeout(Duration::from_secs(5))
        .map_err(sqlite("read the history database", path))?;
    Ok(conn)
}

pub(super) fn owners(path: &Path) -> Result<Vec<(String, Option<String>)>, HistoryError> {
    let err = || sqlite("read the history database", path);
    let conn = reader(path)?;
    let mut stmt = conn
        .prepare("SELECT DISTINCT session, child FROM cells")
        .map_err(err())?;
    let it = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .map_err(err())?;
    it.collect::<Result<_, _>>().map_err(err())
}

pub(super) fn query(
    path: &Path,
    session: Option<&str>,
    limit: usize,
) -> Result<Vec<HistoryEntry>, HistoryError> {
    let err = || sqlite("read the history database", path);
    let conn = reader(path)?;
    let cols = COLS;
    let limit = limit.min(i64::MAX as usize) as i64;
    let mut rows: Vec<HistoryEntry> = match session {
        Some(s) => {
            let mut stmt = conn
                .prepare(&format!(
                    "SELECT {cols} FROM cells WHERE session = ?1 ORDER BY id DESC LIMIT ?2"
                ))
                .map_err(err())?;
            let it = stmt.query_map(params![s, limit], row).map_err(err())?;
            it.collect::<Result<_, _>>().map_err(err())?
        }
        None => {
            let mut stmt = conn
                .prepare(&format!(
                    "SELECT {cols} FROM cells ORDER BY id DESC LIMIT ?1"
                ))
                .map_err(err())?;
            let it = stmt.query_map(params![limit], row).map_err(err())?;
            it.collect::<Result<_, _>>().map_err(err())?
        }
    };
    rows.reverse();
    Ok(rows)
}

/// The newest rows matching `q` within its row and byte bounds, oldest
/// first. Sizes are read first (`octet_length` needs no row content), so
/// rows left out of the page are never loaded.
pub(super) fn page(path: &Path, q: &PageQuery) -> Result<Page, HistoryError> {
    let err = || sqlite("read the history database", path);
    let conn = reader(path)?;
    let mut filter = String::from("WHERE 1");
    let mut args: Vec<rusqlite::types::Value> = Vec::new();
    if let Some(s) = &q.session {
        args.push(s.clone().into());
        filter.push_str(&format!(" AND session = ?{}", args.len()));
    }
    if let Some(t) = &q.tenant {
        args.push(t.clone().into());
        filter.push_str(&format!(" AND tenant = ?{}", args.len()));
    }
    if let Some(b) = q.before {
        args.push(b.into());
        filter.push_str(&format!(" AND id < ?{}", args.len()));
    }
    if let Some(a) = q.after {
        args.push(a.into());
        filter.push_str(&format!(" AND id > ?{}", args.len()));
    }
    let limit = q.limit.clamp(1, i64::MAX as usize - 1);
    args.push(((limit + 1) as i64).into());
    let sizes = format!(
        "SELECT id, octet_length(code) + octet_length(stdout) + octet_length(stderr)
                + coalesce(octet_length(value), 0) + coalesce(octet_length(error), 0)
                + coalesce(octet_length(note), 0) + coalesce(octet_length(displays), 0)
         FROM cells {filter} ORDER BY id DESC LIMIT ?{}",
        args.len()
    );
    let mut stmt = conn.prepare(&sizes).map_err(err())?;
    let sized: Vec<(i64, i64)> = stmt
        .query_map(rusqlite::params_from_iter(&args), |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .map_err(err())?
        .collect::<Result<_, _>>()
        .map_err(err())?;
    let mut bytes = 0usize;
    let mut taken = 0usize;
    for (_, size) in &sized {
        let size = usize::try_from(*size).unwrap_or(0);
        if taken == limit || (taken > 0 && bytes + size > q.max_bytes) {
            break;
        }
        bytes += size;
        taken += 1;
    }
    let next_before = (taken < sized.len()).then(|| sized[taken - 1].0);
    let Some(&(newest, _)) = sized.first() else {
        return Ok(Page::default());
    };
    let oldest = sized[taken - 1].0;
    let mut scope = String::new();
    args.truncate(0);
    if let Some(s) = &q.session {
        args.push(s.clone().into());
        scope.push_str(&format!("session = ?{} AND ", args.len()));
    }
    if let Some(t) = &q.tenant {
        args.push(t.clone().into());
        scope.push_str(&format!("tenant = ?{} AND ", args.len()));
    }
    args.push(oldest.into());
    args.push(newest.into());
    let n = args.len();
    let session = scope;
    let mut stmt = conn
        .prepare(&format!(
            "SELECT {COLS} FROM cells WHERE {session} id >= ?{} AND id <= ?{n} ORDER BY id",
            n - 1
        ))
        .map_err(err())?;
    let rows = stmt
        .query_map(rusqlite::params_from_iter(&args), row)
        .map_err(err())?
        .collect::<Result<_, _>>()
        .map_err(err())?;
    Ok(Page { rows, next_before })
}

const COLS: &str = "id, session, child, code, status, stdout, stderr, value, error, started_at,
                duration_seconds, execution_count, kernel_id, tool_calls_made, state_reset,
                state_lost, note, tenant, displays, client";

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<HistoryEntry> {
    Ok(HistoryEntry {
        id: r.get(0)?,
        session: r.get(1)?,
        child: r.get(2)?,
        code: r.get(3)?,
        status: r.get(4)?,
        stdout: r.get(5)?,
        stderr: r.get(6)?,
        value: r.get(7)?,
        error: r.get(8)?,
        started_at: r.get(9)?,
        duration_seconds: r.get(10)?,
        execution_count: r.get::<_, i64>(11)? as u64,
        kernel_id: r.get(12)?,
        tool_calls_made: r.get::<_, i64>(13)? as u64,
        state_reset: r.get(14)?,
        state_lost: r.get(15)?,
        note: r.get(16)?,
        tenant: r.get(17)?,
        displays: r
            .get::<_, Option<String>>(18)?
            .and_then(|j| serde_json::from_str(&j).ok())
            .unwrap_or_default(),
        client: r.get(19)?,
    })
}

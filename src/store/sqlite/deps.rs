//! Dependencies in the embedded store, by the rules of MongoDB's (see its `deps`): a
//! blocked task's `after` column holds what it was submitted after (a JSON array of
//! keys), and `task_deps(child, dep, met)` one row per dependency, `met` null while it
//! waits for it, found by dependency through `task_deps_dep` (which also lists a task's
//! children); `dependents` marks a task (or, in `batches`, a
//! batch) waited for until its end is settled. Each resolution is one transaction.

use bson::oid::ObjectId;
use bson::DateTime;
use rusqlite::{params, Transaction};

use super::records::{add_columns, bson_bytes, db_err};
use super::SqliteStore;
use crate::model::status;
use crate::store::{Dependency, PendingChange, StoreResult};

/// The `task_deps` table.
pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS task_deps (
    child TEXT NOT NULL,
    dep TEXT NOT NULL,
    met INTEGER,
    PRIMARY KEY (child, dep)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS task_deps_dep ON task_deps (dep);";

/// SQL of the ended statuses of `tasks.status` ([`status::finished`]).
fn ended() -> String {
    let held: Vec<String> = status::ENDED_HELD.iter().map(i32::to_string).collect();
    format!("(status > 0 OR status IN ({}))", held.join(", "))
}

/// Adds `batches.dependents` and `batches.closed` to a database file created before them.
pub(super) fn migrate(conn: &rusqlite::Connection) -> StoreResult<()> {
    add_columns(conn, "batches", &[("dependents", "INTEGER"), ("closed", "INTEGER")])
}

/// Records, in the transaction that inserts task `child`, what it waits for.
pub(super) fn insert_deps(tx: &Transaction<'_>, child: &str, deps: &[Dependency]) -> StoreResult<()> {
    let mut stmt = tx
        .prepare_cached("INSERT OR IGNORE INTO task_deps (child, dep) VALUES (?1, ?2)")
        .map_err(db_err("create tasks"))?;
    for d in deps {
        stmt.execute(params![child, d.key()]).map_err(db_err("create tasks"))?;
    }
    Ok(())
}

/// The `after` column of a task waiting for `deps`: their keys as a JSON array.
pub(super) fn after_column(deps: &[Dependency]) -> Option<String> {
    (!deps.is_empty())
        .then(|| serde_json::Value::from(deps.iter().map(Dependency::key).collect::<Vec<_>>()).to_string())
}

impl SqliteStore {
    /// [`Store::mark_dependents`](crate::store::Store::mark_dependents).
    pub(super) async fn mark_dependents(&self, deps: &[Dependency]) -> StoreResult<()> {
        let deps = deps.to_vec();
        self.write_quiet("mark tasks waited for", move |tx| {
            let err = db_err("mark tasks waited for");
            for d in &deps {
                match d {
                    Dependency::Task(id) => tx.execute("UPDATE tasks SET dependents = 1 WHERE id = ?1", [id.to_hex()]),
                    Dependency::Batch(b) => tx.execute("UPDATE batches SET dependents = 1 WHERE id = ?1", [b]),
                }
                .map_err(&err)?;
            }
            Ok(())
        })
        .await
    }

    /// [`Store::blocked_on`](crate::store::Store::blocked_on).
    pub(super) async fn blocked_on(&self, dep: &Dependency, limit: usize) -> StoreResult<Vec<ObjectId>> {
        let key = dep.key();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.with(move |conn| {
            let err = db_err("find tasks blocked on another");
            let mut stmt = conn
                .prepare_cached(
                    "SELECT d.child FROM task_deps d JOIN tasks t ON t.id = d.child
                     WHERE d.dep = ?1 AND d.met IS NULL AND t.status = ?2 LIMIT ?3",
                )
                .map_err(&err)?;
            let rows = stmt
                .query_map(params![key, status::BLOCKED, limit], |r| r.get::<_, String>(0))
                .map_err(&err)?;
            let ids = rows.collect::<Result<Vec<_>, _>>().map_err(&err)?;
            Ok(ids.iter().filter_map(|s| ObjectId::parse_str(s).ok()).collect())
        })
        .await
    }

    /// [`Store::settled`](crate::store::Store::settled).
    pub(super) async fn settled(&self, dep: &Dependency) -> StoreResult<()> {
        let dep = dep.clone();
        self.write_quiet("mark a dependency settled", move |tx| {
            match &dep {
                Dependency::Task(id) => tx.execute(
                    &format!("UPDATE tasks SET dependents = NULL WHERE id = ?1 AND {}", ended()),
                    [id.to_hex()],
                ),
                Dependency::Batch(b) => tx.execute("UPDATE batches SET dependents = NULL WHERE id = ?1", [b]),
            }
            .map_err(db_err("mark a dependency settled"))?;
            Ok(())
        })
        .await
    }

    /// [`Store::unsettled`](crate::store::Store::unsettled).
    pub(super) async fn unsettled(&self, limit: usize) -> StoreResult<Vec<Dependency>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.with(move |conn| {
            let err = db_err("find unsettled dependencies");
            let mut out = Vec::new();
            let mut stmt = conn
                .prepare_cached(&format!(
                    "SELECT id FROM tasks WHERE dependents = 1 AND {} LIMIT ?1",
                    ended()
                ))
                .map_err(&err)?;
            for id in stmt.query_map([limit], |r| r.get::<_, String>(0)).map_err(&err)? {
                if let Ok(id) = ObjectId::parse_str(id.map_err(&err)?) {
                    out.push(Dependency::Task(id));
                }
            }
            let mut stmt = conn
                .prepare_cached("SELECT id FROM batches WHERE dependents = 1 LIMIT ?1")
                .map_err(&err)?;
            for b in stmt.query_map([limit], |r| r.get::<_, String>(0)).map_err(&err)? {
                out.push(Dependency::Batch(b.map_err(&err)?));
            }
            Ok(out)
        })
        .await
    }
}

/// [`Store::resolve_pending`](crate::store::Store::resolve_pending), in one transaction:
/// the task still blocked (-4) and its unmet `task_deps` rows still `expect`, then the
/// change.
pub(super) async fn resolve_pending(
    store: &SqliteStore,
    task: ObjectId,
    expect: &[String],
    change: PendingChange<'_>,
) -> StoreResult<bool> {
    enum Write {
        Met(String),
        Release(i32),
        Stop(i32, Vec<u8>),
    }
    let write = match change {
        PendingChange::Met(dep) => Write::Met(dep.key()),
        PendingChange::Release(to) => Write::Release(to),
        PendingChange::Stop(to, stop) => Write::Stop(to, bson_bytes(&stop.to_document())?),
    };
    let queued = matches!(write, Write::Release(to) if to == status::QUEUED);
    let mut expect = expect.to_vec();
    expect.sort();
    let done = store
        .write_task("resolve what a blocked task waits for", task, move |tx| {
            let err = db_err("resolve what a blocked task waits for");
            let id = task.to_hex();
            let blocked: bool = tx
                .query_row(
                    "SELECT EXISTS (SELECT 1 FROM tasks WHERE id = ?1 AND status = ?2)",
                    params![id, status::BLOCKED],
                    |r| r.get(0),
                )
                .map_err(&err)?;
            let mut stmt = tx
                .prepare_cached("SELECT dep FROM task_deps WHERE child = ?1 AND met IS NULL ORDER BY dep")
                .map_err(&err)?;
            let pending = stmt
                .query_map([&id], |r| r.get::<_, String>(0))
                .map_err(&err)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(&err)?;
            if !blocked || pending != expect {
                return Ok(false);
            }
            let now = DateTime::now().timestamp_millis();
            match &write {
                Write::Met(key) => tx.execute(
                    "UPDATE task_deps SET met = 1 WHERE child = ?1 AND dep = ?2",
                    params![id, key],
                ),
                Write::Release(to) => {
                    tx.execute("UPDATE task_deps SET met = 1 WHERE child = ?1 AND met IS NULL", [&id])
                        .map_err(&err)?;
                    tx.execute(
                        "UPDATE tasks SET status = ?1, mtime = ?2 WHERE id = ?3",
                        params![to, now, id],
                    )
                }
                Write::Stop(to, stop) => tx.execute(
                    "UPDATE tasks SET status = ?1, stop = ?2, mtime = ?3 WHERE id = ?4",
                    params![to, stop, now, id],
                ),
            }
            .map_err(&err)?;
            Ok(true)
        })
        .await?;
    if done && queued {
        store.signal_queued();
    }
    Ok(done)
}

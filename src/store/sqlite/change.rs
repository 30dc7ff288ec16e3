//! Fenced task changes on the embedded store ([`crate::store::change`]): a fence becomes
//! a `WHERE` clause, a change the `SET` list of one `UPDATE`, run on the writer thread.
//!
//! Stop requests are stored as BSON; the SQL function `stop_action(stop)` (registered on
//! every connection, see [`register`]) reads their `action`, so "asked to kill" means the
//! same here as on MongoDB (`stop.action` is `kill`).

use bson::oid::ObjectId;
use bson::{Bson, DateTime};
use rusqlite::functions::FunctionFlags;
use rusqlite::types::{Value, ValueRef};
use rusqlite::{params_from_iter, Connection, OptionalExtension, Transaction};

use super::records::{attempts_column, bson_bytes, db_err, output_columns};
use super::{SqliteStore, Touched};
use crate::model::{status, Attempt};
use crate::store::change::{NodeIs, StopIs, TaskChange, TaskFence, Write};
use crate::store::{StoreResult, TaskTarget};

/// Registers `stop_action(stop)` on `conn`: the `action` of a stored stop request, or NULL
/// when there is none or it cannot be read.
pub(super) fn register(conn: &Connection) -> rusqlite::Result<()> {
    conn.create_scalar_function(
        "stop_action",
        1,
        FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DETERMINISTIC,
        |ctx| {
            Ok(match ctx.get_raw(0) {
                ValueRef::Blob(b) => bson::Document::from_reader(&mut &b[..])
                    .ok()
                    .and_then(|d| d.get_str("action").ok().map(str::to_owned)),
                _ => None,
            })
        },
    )
}

/// A `WHERE` clause (without the word) and the values it binds, numbered from `?1`.
#[derive(Default)]
struct Sql {
    parts: Vec<String>,
    values: Vec<Value>,
}

impl Sql {
    fn bind(&mut self, v: Value) -> String {
        self.values.push(v);
        format!("?{}", self.values.len())
    }
}

/// The conditions of `fence`, appended to `sql`. Statuses are written out, not bound, so
/// the partial indexes over one status serve the search.
fn fence_sql(fence: &TaskFence, sql: &mut Sql) {
    match fence.statuses.as_deref() {
        None => {}
        Some([]) => sql.parts.push("0".into()),
        Some([one]) => sql.parts.push(format!("status = {one}")),
        Some(many) => sql.parts.push(format!(
            "status IN ({})",
            many.iter().map(i32::to_string).collect::<Vec<_>>().join(", ")
        )),
    }
    match &fence.node {
        NodeIs::Any => {}
        NodeIs::Unclaimed => sql.parts.push("node IS NULL".into()),
        NodeIs::Node(n) => {
            let p = sql.bind(Value::Text(n.clone()));
            sql.parts.push(format!("node = {p}"));
        }
    }
    if let Some(t) = fence.mtime {
        let p = sql.bind(Value::Integer(t.timestamp_millis()));
        sql.parts.push(format!("mtime = {p}"));
    }
    match fence.stop {
        StopIs::Any => {}
        StopIs::None => sql.parts.push("stop IS NULL".into()),
        StopIs::Kill => sql.parts.push("stop_action(stop) = 'kill'".into()),
        StopIs::NotKill => sql.parts.push("stop_action(stop) IS NOT 'kill'".into()),
    }
    match fence.rerun {
        None => {}
        Some(true) => sql.parts.push("rerun = 1".into()),
        Some(false) => sql.parts.push("COALESCE(rerun, 0) = 0".into()),
    }
    if let Some(t) = fence.due_by {
        let p = sql.bind(Value::Integer(t.timestamp_millis()));
        sql.parts.push(format!("run_at <= {p}"));
    }
}

/// The condition selecting `target`'s tasks, appended to `sql`.
fn target_sql(target: TaskTarget, sql: &mut Sql) {
    match target {
        TaskTarget::Task(id) => {
            let p = sql.bind(Value::Text(id.to_hex()));
            sql.parts.push(format!("id = {p}"));
        }
        TaskTarget::Queue(q) => {
            let p = sql.bind(Value::Text(q.to_hex()));
            sql.parts.push(format!("queue = {p}"));
        }
        TaskTarget::All => {}
    }
}

fn text(s: Option<String>) -> Value {
    s.map_or(Value::Null, Value::Text)
}

/// The `SET` list of `change` (without the word), its values bound in `sql`; the attempts
/// column as `attempts` (already appended) when the change appends one.
fn set_sql(change: &TaskChange, attempts: Option<Vec<u8>>, now: DateTime, sql: &mut Sql) -> StoreResult<String> {
    let mut set: Vec<String> = Vec::new();
    let mut put = |sql: &mut Sql, col: &str, v: Value| {
        let p = sql.bind(v);
        set.push(format!("{col} = {p}"));
    };
    if let Some(s) = change.status {
        put(sql, "status", Value::Integer(s.into()));
    }
    match &change.node {
        Write::Keep => {}
        Write::Clear => put(sql, "node", Value::Null),
        Write::Set(n) => put(sql, "node", Value::Text(n.clone())),
    }
    for (w, col) in [(&change.stdout, "stdout"), (&change.stderr, "stderr")] {
        let (t, f) = match w {
            Write::Keep => continue,
            Write::Clear => (None, None),
            Write::Set(v) => output_columns(v),
        };
        put(sql, col, text(t));
        put(sql, &format!("{col}_file"), text(f));
    }
    match &change.progress {
        Write::Keep => {}
        Write::Clear => put(sql, "progress", Value::Null),
        Write::Set(p) => put(sql, "progress", Value::Blob(bson_bytes(&p.to_document())?)),
    }
    match &change.stop {
        Write::Keep => {}
        Write::Clear => put(sql, "stop", Value::Null),
        Write::Set(s) => put(sql, "stop", Value::Blob(bson_bytes(&s.to_document())?)),
    }
    match change.rerun {
        None => {}
        Some(true) => put(sql, "rerun", Value::Integer(1)),
        Some(false) => put(sql, "rerun", Value::Null),
    }
    match &change.run_at {
        Write::Keep => {}
        Write::Clear => put(sql, "run_at", Value::Null),
        Write::Set(t) => put(sql, "run_at", Value::Integer(t.timestamp_millis())),
    }
    if let Some(t) = change.started {
        put(sql, "started", Value::Integer(t.timestamp_millis()));
    }
    if let Some(p) = change.priority {
        put(sql, "priority", Value::Integer(p));
    }
    match &change.avoid {
        Write::Keep => {}
        Write::Clear => {
            put(sql, "avoid_node", Value::Null);
            put(sql, "avoid_until", Value::Null);
        }
        Write::Set((n, until)) => {
            put(sql, "avoid_node", Value::Text(n.clone()));
            put(sql, "avoid_until", Value::Integer(until.timestamp_millis()));
        }
    }
    if let Some(p) = &change.params {
        put(sql, "params", Value::Blob(bson_bytes(p)?));
    }
    if let Some(a) = attempts {
        put(sql, "attempts", Value::Blob(a));
    }
    if change.touch {
        put(sql, "mtime", Value::Integer(now.timestamp_millis()));
    }
    Ok(set.join(", "))
}

/// Writes `change` to task `id` in `tx` when `fence` holds; whether it did.
pub(super) fn change_one(
    tx: &Transaction<'_>,
    id: ObjectId,
    fence: &TaskFence,
    change: &TaskChange,
) -> StoreResult<bool> {
    let key = id.to_hex();
    let attempts = change.attempt.as_ref().map(|a| appended(tx, &key, a)).transpose()?;
    let mut sql = Sql::default();
    let set = set_sql(change, attempts, DateTime::now(), &mut sql)?;
    let p = sql.bind(Value::Text(key));
    sql.parts.push(format!("id = {p}"));
    fence_sql(fence, &mut sql);
    let n = tx
        .prepare_cached(&format!("UPDATE tasks SET {set} WHERE {}", sql.parts.join(" AND ")))
        .and_then(|mut s| s.execute(params_from_iter(sql.values.iter())))
        .map_err(db_err("change task"))?;
    Ok(n == 1)
}

/// Whether a change puts its tasks in their queue (for the watchers of queued tasks).
pub(super) fn queues(change: &TaskChange) -> bool {
    change.status == Some(status::QUEUED)
}

impl SqliteStore {
    /// [`Store::change_tasks`](crate::store::Store::change_tasks) in one transaction.
    pub(super) async fn change_tasks(&self, changes: &[(ObjectId, TaskFence, TaskChange)]) -> StoreResult<Vec<bool>> {
        for (_, _, c) in changes {
            c.check_for_named()?;
        }
        let entries = changes.to_vec();
        let ids: Vec<ObjectId> = changes.iter().map(|(id, _, _)| *id).collect();
        let queueing: Vec<bool> = changes.iter().map(|(_, _, c)| queues(c)).collect();
        let done = self
            .write_touching(
                "change tasks",
                move |tx| {
                    entries
                        .iter()
                        .map(|(id, fence, change)| change_one(tx, *id, fence, change))
                        .collect::<StoreResult<Vec<bool>>>()
                },
                |done| Touched::Tasks(ids.iter().zip(done).filter(|(_, d)| **d).map(|(id, _)| *id).collect()),
            )
            .await?;
        if done.iter().zip(&queueing).any(|(d, q)| *d && *q) {
            self.signal_queued();
        }
        Ok(done)
    }

    /// [`Store::change_where`](crate::store::Store::change_where): one `UPDATE … RETURNING id`.
    pub(super) async fn change_where(
        &self,
        target: TaskTarget,
        fence: &TaskFence,
        change: &TaskChange,
    ) -> StoreResult<Vec<ObjectId>> {
        change.check_for_matching()?;
        let (fence, change) = (fence.clone(), change.clone());
        let queueing = queues(&change);
        let ids = self
            .write_touching(
                "change tasks",
                move |tx| {
                    let mut sql = Sql::default();
                    let set = set_sql(&change, None, DateTime::now(), &mut sql)?;
                    target_sql(target, &mut sql);
                    fence_sql(&fence, &mut sql);
                    let cond = if sql.parts.is_empty() {
                        "1".to_string()
                    } else {
                        sql.parts.join(" AND ")
                    };
                    let err = db_err("change tasks");
                    let mut stmt = tx
                        .prepare(&format!("UPDATE tasks SET {set} WHERE {cond} RETURNING id"))
                        .map_err(&err)?;
                    let rows = stmt
                        .query_map(params_from_iter(sql.values.iter()), |r| r.get::<_, String>(0))
                        .map_err(&err)?;
                    let ids = rows.collect::<Result<Vec<_>, _>>().map_err(&err)?;
                    Ok(ids
                        .iter()
                        .filter_map(|s| ObjectId::parse_str(s).ok())
                        .collect::<Vec<_>>())
                },
                |ids| Touched::Tasks(ids.clone()),
            )
            .await?;
        if queueing && !ids.is_empty() {
            self.signal_queued();
        }
        Ok(ids)
    }
}

/// The `attempts` column holds the BSON of `{list: [record, …], recorded: n}`: the last
/// [`ATTEMPTS_KEPT`](crate::model::ATTEMPTS_KEPT) records and the count of records ever
/// appended. A record is appended by reading and rewriting it in the same write
/// transaction.
/// The `attempts` column of task `id` with `attempt` appended.
pub(super) fn appended(tx: &Transaction<'_>, id: &str, attempt: &Attempt) -> StoreResult<Vec<u8>> {
    let stored: Option<Option<Vec<u8>>> = tx
        .query_row("SELECT attempts FROM tasks WHERE id = ?1", [id], |r| r.get(0))
        .optional()
        .map_err(db_err("read attempts"))?;
    let (kept, dropped) = attempts_column(id, stored.flatten().as_deref());
    let mut list: Vec<Bson> = kept.iter().map(|a| Bson::Document(a.to_document())).collect();
    let recorded = u64::try_from(list.len())
        .unwrap_or(u64::MAX)
        .saturating_add(dropped)
        .saturating_add(1);
    list.push(Bson::Document(attempt.to_document()));
    let over = list.len().saturating_sub(crate::model::ATTEMPTS_KEPT);
    list.drain(..over);
    bson_bytes(&bson::doc! { "list": list, "recorded": i64::try_from(recorded).unwrap_or(i64::MAX) })
}

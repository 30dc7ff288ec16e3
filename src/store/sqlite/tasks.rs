//! Tasks as the DCI sees them in the embedded store: creating, finding, counting, and
//! reading outputs.

use bson::oid::ObjectId;
use bson::DateTime;
use rusqlite::{params, OptionalExtension};

use super::records::{bson_bytes, db_err, read_attempts, task_or_problem_from_row, TASK_COLUMNS};
use super::{deps, SqliteStore, Touched, OUTPUT_FILES};
use crate::model::{Output, Task};
use crate::store::{HeadFilter, HeadNode, NewTask, Page, StoreError, StoreResult, TaskFilter, TaskHead};

/// Whether a task of `queue` holds `key`: then an insert that failed on a keyed row failed
/// on its key (possibly held by the very task, inserted before by a write whose reply was
/// lost), and not on its `id` alone or another constraint.
fn key_held(tx: &rusqlite::Transaction<'_>, queue: &str, key: &str) -> StoreResult<bool> {
    tx.prepare_cached("SELECT EXISTS (SELECT 1 FROM tasks WHERE queue = ?1 AND key = ?2)")
        .and_then(|mut s| s.query_row(params![queue, key], |r| r.get(0)))
        .map_err(db_err("create tasks"))
}

impl SqliteStore {
    pub(super) async fn insert_tasks(&self, queue: ObjectId, tasks: Vec<NewTask>) -> StoreResult<()> {
        if tasks.is_empty() {
            return Ok(());
        }
        let now = DateTime::now();
        let encoded = tasks
            .iter()
            .map(|t| {
                let run_at = t.run_at.map(|d| d.timestamp_millis());
                bson_bytes(&t.params).map(|bytes| {
                    (
                        t.id.to_hex(),
                        bytes,
                        t.initial_status(now),
                        run_at,
                        t.priority,
                        t.key.clone(),
                        t.batch.clone(),
                        (t.after.clone(), t.after_failure_runs, t.dependents),
                    )
                })
            })
            .collect::<StoreResult<Vec<_>>>()?;
        let touched: Vec<ObjectId> = tasks.iter().map(|t| t.id).collect();
        self.write_touching(
            "create tasks",
            move |tx| {
                let err = db_err("create tasks");
                let q = queue.to_hex();
                let mut stmt = tx
                .prepare_cached(
                    "INSERT INTO tasks (id, queue, ctime, mtime, node, status, params, run_at, priority, key, batch,
                                        after, after_failure, dependents)
                     VALUES (?1, ?2, ?3, ?3, NULL, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
                )
                .map_err(&err)?;
                for (id, bytes, status, run_at, priority, key, batch, (after, runs_anyway, dependents)) in &encoded {
                    deps::insert_deps(tx, id, after)?;
                    match stmt.execute(params![
                        id,
                        q,
                        now.timestamp_millis(),
                        status,
                        bytes,
                        run_at,
                        priority,
                        key,
                        batch,
                        deps::after_column(after),
                        runs_anyway.then_some(1),
                        dependents.then_some(1)
                    ]) {
                        Ok(_) => {}
                        Err(e) => {
                            return Err(match key {
                                Some(k) if key_held(tx, &q, k)? => StoreError::Duplicate {
                                    what: "task key",
                                    name: k.clone(),
                                },
                                _ => err(e),
                            })
                        }
                    }
                }
                Ok(())
            },
            move |_| Touched::Tasks(touched),
        )
        .await?;
        self.signal_queued();
        Ok(())
    }

    pub(super) async fn find_tasks(&self, filter: &TaskFilter, page: Page) -> StoreResult<Vec<Task>> {
        if page.limit == 0 {
            return Ok(Vec::new());
        }
        let (clause, mut args) = filter_sql(filter);
        args.push(rusqlite::types::Value::Integer(
            i64::try_from(page.limit).unwrap_or(i64::MAX),
        ));
        args.push(rusqlite::types::Value::Integer(
            i64::try_from(page.skip).unwrap_or(i64::MAX),
        ));
        let order = if page.oldest_first { "ASC" } else { "DESC" };
        let sql = format!("SELECT {TASK_COLUMNS} FROM tasks{clause} ORDER BY id {order} LIMIT ? OFFSET ?");
        self.with(move |conn| {
            let err = db_err("find tasks");
            let mut stmt = conn.prepare(&sql).map_err(&err)?;
            let rows = stmt
                .query_map(rusqlite::params_from_iter(args), task_or_problem_from_row)
                .map_err(&err)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(&err)?;
            Ok(rows.into_iter().filter_map(|(_, t)| t).collect())
        })
        .await
    }

    pub(super) async fn count_tasks(&self, filter: &TaskFilter) -> StoreResult<u64> {
        let (clause, args) = filter_sql(filter);
        let sql = format!("SELECT COUNT(*) FROM tasks{clause}");
        let n: i64 = self
            .with(move |conn| {
                conn.query_row(&sql, rusqlite::params_from_iter(args), |r| r.get(0))
                    .map_err(db_err("count tasks"))
            })
            .await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    pub(super) async fn task(&self, id: ObjectId) -> StoreResult<Option<Task>> {
        let sql = format!("SELECT {TASK_COLUMNS} FROM tasks WHERE id = ?1");
        let found = self
            .with(move |conn| {
                conn.query_row(&sql, [id.to_hex()], task_or_problem_from_row)
                    .optional()
                    .map_err(db_err("find task"))
            })
            .await?;
        Ok(found.and_then(|(_, t)| t))
    }

    pub(super) async fn read_output(&self, output: &Output) -> StoreResult<String> {
        let id = match output {
            Output::Inline(s) => return Ok(s.clone()),
            Output::File(id) => *id,
        };
        let found: Option<(String, i64)> = self
            .with(move |conn| {
                conn.query_row(
                    "SELECT data, length FROM output_files WHERE id = ?1",
                    [id.to_hex()],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()
                .map_err(db_err("read output file"))
            })
            .await?;
        let Some((text, length)) = found else {
            return Err(StoreError::Malformed {
                collection: OUTPUT_FILES,
                id: id.to_hex(),
                reason: "no such file".to_string(),
            });
        };
        if usize::try_from(length).ok() != Some(text.len()) {
            return Err(StoreError::Malformed {
                collection: OUTPUT_FILES,
                id: id.to_hex(),
                reason: format!("length is {length} but the data has {} bytes", text.len()),
            });
        }
        Ok(text)
    }
}

/// Appends the SQL conditions and parameters of a task search.
fn filter_sql(filter: &TaskFilter) -> (String, Vec<rusqlite::types::Value>) {
    use rusqlite::types::Value;
    let mut clauses = Vec::new();
    let mut args = Vec::new();
    if let Some(id) = filter.id {
        clauses.push("id = ?".to_string());
        args.push(Value::Text(id.to_hex()));
    }
    if let Some(queue) = filter.queue {
        clauses.push("queue = ?".to_string());
        args.push(Value::Text(queue.to_hex()));
    }
    if let Some(statuses) = &filter.status {
        if statuses.is_empty() {
            clauses.push("0".to_string());
        } else {
            clauses.push(format!("status IN ({})", vec!["?"; statuses.len()].join(", ")));
            args.extend(statuses.iter().map(|s| Value::Integer(i64::from(*s))));
        }
    }
    if let Some(ids) = &filter.ids {
        if ids.is_empty() {
            clauses.push("0".to_string());
        } else {
            clauses.push(format!("id IN ({})", vec!["?"; ids.len()].join(", ")));
            args.extend(ids.iter().map(|i| Value::Text(i.to_hex())));
        }
    }
    if let Some(key) = &filter.key {
        clauses.push("key = ?".to_string());
        args.push(Value::Text(key.clone()));
    }
    if let Some(batch) = &filter.batch {
        clauses.push("batch = ?".to_string());
        args.push(Value::Text(batch.clone()));
    }
    if let Some(dep) = &filter.after {
        clauses.push("id IN (SELECT child FROM task_deps WHERE dep = ?)".to_string());
        args.push(Value::Text(dep.key()));
    }
    if let Some(id) = filter.newer_than {
        clauses.push("id > ?".to_string());
        args.push(Value::Text(id.to_hex()));
    }
    if let Some(id) = filter.older_than {
        clauses.push("id < ?".to_string());
        args.push(Value::Text(id.to_hex()));
    }
    match &filter.node {
        Some(None) => clauses.push("node IS NULL".to_string()),
        Some(Some(n)) => {
            clauses.push("node = ?".to_string());
            args.push(Value::Text(n.clone()));
        }
        None => {}
    }
    let sql = if clauses.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", clauses.join(" AND "))
    };
    (sql, args)
}

/// The `WHERE` clause of `filter` and the values it binds. Statuses are written out, not
/// bound, so the partial indexes over one status serve the search.
fn head_sql(filter: &HeadFilter) -> (String, Vec<rusqlite::types::Value>) {
    use rusqlite::types::Value;
    let statuses: Vec<String> = filter.statuses.iter().map(i32::to_string).collect();
    let mut parts = vec![format!("status IN ({})", statuses.join(", "))];
    let mut values = Vec::new();
    match &filter.node {
        HeadNode::Any => {}
        HeadNode::Is(n) => {
            values.push(Value::Text(n.clone()));
            parts.push("node = ?".into());
        }
        HeadNode::NoneOf(names) if names.is_empty() => {}
        HeadNode::NoneOf(names) => {
            values.extend(names.iter().map(|n| Value::Text(n.clone())));
            let marks = vec!["?"; names.len()].join(", ");
            parts.push(format!("(node IS NULL OR node NOT IN ({marks}))"));
        }
    }
    if let Some(t) = filter.mtime_before {
        values.push(Value::Integer(t.timestamp_millis()));
        parts.push("mtime < ?".into());
    }
    (parts.join(" AND "), values)
}

impl SqliteStore {
    /// [`Store::task_heads`](crate::store::Store::task_heads).
    pub(super) async fn task_heads(&self, filter: &HeadFilter, limit: usize) -> StoreResult<Vec<TaskHead>> {
        if limit == 0 || filter.statuses.is_empty() {
            return Ok(Vec::new());
        }
        let (clause, mut args) = head_sql(filter);
        args.push(rusqlite::types::Value::Integer(
            i64::try_from(limit).unwrap_or(i64::MAX),
        ));
        let sql = format!(
            "SELECT id, queue, status, node, mtime, stop_action(stop) IS 'kill', COALESCE(priority, 0), attempts
             FROM tasks WHERE {clause} LIMIT ?"
        );
        self.with(move |conn| {
            let err = db_err("read task heads");
            let mut stmt = conn.prepare(&sql).map_err(&err)?;
            let rows = stmt
                .query_map(rusqlite::params_from_iter(args), |r| {
                    let id: String = r.get(0)?;
                    let queue: Option<String> = r.get(1)?;
                    let mtime: Option<i64> = r.get(4)?;
                    let attempts: Option<Vec<u8>> = r.get(7)?;
                    Ok((id, queue, r.get(2)?, r.get(3)?, mtime, r.get(5)?, r.get(6)?, attempts))
                })
                .map_err(&err)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(&err)?;
            Ok(rows
                .into_iter()
                .filter_map(|(id, queue, status, node, mtime, kill, priority, attempts)| {
                    Some(TaskHead {
                        id: ObjectId::parse_str(&id).ok()?,
                        queue: queue.and_then(|q| ObjectId::parse_str(q).ok()),
                        status,
                        node,
                        mtime: mtime.map(DateTime::from_millis),
                        kill,
                        priority,
                        attempts: read_attempts(&id, attempts.as_deref()),
                    })
                })
                .collect())
        })
        .await
    }
}

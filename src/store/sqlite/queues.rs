//! Queues in the embedded store: the whole queue document as BSON in `queues.doc`.

use std::collections::BTreeMap;

use bson::oid::ObjectId;
use bson::{Bson, Document};
use rusqlite::{params, OptionalExtension};

use super::rows::{bson_bytes, db_err, queue_from, sort_str};
use super::{queue_doc, SqliteStore};
use crate::model::Queue;
use crate::store::{NewQueue, QueueUpdate, StatusCounts, StoreError, StoreResult};

impl SqliteStore {
    pub(super) async fn queues(&self) -> StoreResult<Vec<Queue>> {
        let rows = self
            .with(|conn| {
                let err = db_err("list queues");
                let mut stmt = conn.prepare("SELECT id, doc FROM queues ORDER BY id").map_err(&err)?;
                let rows = stmt
                    .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
                    .map_err(&err)?
                    .collect::<Result<Vec<(String, Vec<u8>)>, _>>()
                    .map_err(&err)?;
                Ok(rows)
            })
            .await?;
        let mut queues = Vec::with_capacity(rows.len());
        for (id, bytes) in rows {
            let d = match queue_doc("queues", &id, &bytes) {
                Ok(d) => d,
                Err(e) => {
                    self.warn_once(format!("ignoring queue {id}: {e}"));
                    continue;
                }
            };
            match queue_from(&d) {
                Ok((q, problems)) => {
                    for p in problems {
                        self.warn_once(format!("queue {:?} ({}): {p}", q.name, q.id));
                    }
                    queues.push(q);
                }
                Err(e) => self.warn_once(format!("ignoring queue {:?}: {e}", d.get_str("name").unwrap_or("?"))),
            }
        }
        Ok(queues)
    }

    pub(super) async fn create_queue(&self, queue: NewQueue) -> StoreResult<Queue> {
        check_extra(&queue.extra)?;
        check_threads(queue.threads)?;
        let id = ObjectId::new();
        let mut d = bson::doc! {
            "_id": id,
            "name": queue.name.clone(),
            "plugin": queue.plugin.clone(),
            "threads": opt_int_bson(queue.threads),
            "sort": sort_str(queue.sort),
        };
        d.extend(queue.extra);
        let (parsed, _) = queue_from(&d).map_err(|e| StoreError::Invalid(e.to_string()))?;
        d.remove("_id");
        let bytes = bson_bytes(&d)?;
        let name = queue.name;
        self.with(move |conn| {
            match conn.execute(
                "INSERT INTO queues (id, name, doc) VALUES (?1, ?2, ?3)",
                params![id.to_hex(), name, bytes],
            ) {
                Ok(_) => Ok(parsed),
                Err(e) if is_unique_violation(&e) => Err(StoreError::Duplicate { what: "queue", name }),
                Err(e) => Err(db_err("create queue")(e)),
            }
        })
        .await
    }

    pub(super) async fn update_queue(&self, id: ObjectId, update: QueueUpdate) -> StoreResult<Option<Queue>> {
        check_extra(&update.extra)?;
        if let Some(threads) = update.threads {
            check_threads(threads)?;
        }
        self.write_quiet("update queue", move |tx| {
            let hex = id.to_hex();
            let found: Option<Vec<u8>> = tx
                .query_row("SELECT doc FROM queues WHERE id = ?1", [&hex], |r| r.get(0))
                .optional()
                .map_err(db_err("update queue"))?;
            let Some(bytes) = found else {
                return Ok(None);
            };
            let mut d = queue_doc("queues", &hex, &bytes)?;
            if let Some(name) = &update.name {
                d.insert("name", name.clone());
            }
            if let Some(plugin) = update.plugin.clone() {
                d.insert("plugin", plugin);
            }
            if let Some(threads) = update.threads {
                d.insert("threads", opt_int_bson(threads));
            }
            if let Some(sort) = update.sort {
                d.insert("sort", sort_str(sort));
            }
            d.extend(update.extra.clone());
            let (parsed, _) = queue_from(&d)?;
            d.remove("_id");
            let bytes = bson_bytes(&d)?;
            match tx.execute(
                "UPDATE queues SET name = ?1, doc = ?2 WHERE id = ?3",
                params![parsed.name, bytes, hex],
            ) {
                Ok(_) => Ok(Some(parsed)),
                Err(e) if is_unique_violation(&e) => Err(StoreError::Duplicate {
                    what: "queue",
                    name: update.name.clone().unwrap_or_default(),
                }),
                Err(e) => Err(db_err("update queue")(e)),
            }
        })
        .await
    }

    pub(super) async fn delete_queue(&self, id: ObjectId) -> StoreResult<bool> {
        self.write("delete queue", move |tx| {
            let err = db_err("delete queue");
            let n = tx
                .execute("DELETE FROM queues WHERE id = ?1", [id.to_hex()])
                .map_err(&err)?;
            tx.execute("DELETE FROM slots WHERE queue = ?1", [id.to_hex()])
                .map_err(&err)?;
            Ok(n > 0)
        })
        .await
    }

    pub(super) async fn queue_counts(&self) -> StoreResult<BTreeMap<ObjectId, StatusCounts>> {
        let rows = self
            .with(|conn| {
                let err = db_err("count tasks by queue");
                let mut stmt = conn
                    .prepare("SELECT queue, status, COUNT(*) FROM tasks GROUP BY queue, status")
                    .map_err(&err)?;
                let rows = stmt
                    .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                    .map_err(&err)?
                    .collect::<Result<Vec<(String, i64, i64)>, _>>()
                    .map_err(&err)?;
                Ok(rows)
            })
            .await?;
        let mut counts: BTreeMap<ObjectId, StatusCounts> = BTreeMap::new();
        for (queue, code, n) in rows {
            match (
                ObjectId::parse_str(&queue).ok(),
                i32::try_from(code).ok(),
                u64::try_from(n).ok(),
            ) {
                (Some(q), Some(c), Some(n)) => *counts.entry(q).or_default().entry(c).or_default() += n,
                _ => self.warn_once(format!(
                    "tasks with a malformed queue or status are not counted: {queue} {code}"
                )),
            }
        }
        Ok(counts)
    }
}

/// Keys of a queue document that `extra` fields may not set.
const QUEUE_CORE_FIELDS: [&str; 5] = ["_id", "name", "plugin", "threads", "sort"];

fn check_extra(extra: &Document) -> StoreResult<()> {
    match extra.keys().find(|k| QUEUE_CORE_FIELDS.contains(&k.as_str())) {
        Some(k) => Err(StoreError::Invalid(format!("extra queue field {k:?} is not allowed"))),
        None => Ok(()),
    }
}

fn check_threads(threads: Option<i64>) -> StoreResult<()> {
    match threads {
        Some(t) if t < 0 => Err(StoreError::Invalid(format!("threads must be non-negative, got {t}"))),
        _ => Ok(()),
    }
}

fn opt_int_bson(n: Option<i64>) -> Bson {
    n.map_or(Bson::Null, |n| i32::try_from(n).map_or(Bson::Int64(n), Bson::Int32))
}

fn is_unique_violation(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _) if f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
        || f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY)
}

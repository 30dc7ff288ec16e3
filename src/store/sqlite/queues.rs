//! Queues in the embedded store: the whole queue document as BSON in `queues.doc`.

use std::collections::BTreeMap;

use bson::oid::ObjectId;
use rusqlite::{params, OptionalExtension};

use super::records::{bson_bytes, db_err};
use super::{queue_doc, SqliteStore};
use crate::model::{Queue, UnreadableQueue};
use crate::store::queue_doc::{self as queue_doc_rules, QueueState};
use crate::store::{NewQueue, QueueUpdate, StatusCounts, StoreError, StoreResult};

impl SqliteStore {
    /// Every queue document: those read as queues, and those that cannot be, each with
    /// its problem (logged once).
    pub(super) async fn read_queues(&self) -> StoreResult<(Vec<Queue>, Vec<UnreadableQueue>)> {
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
        let mut docs = Vec::with_capacity(rows.len());
        for (id, bytes) in rows {
            match queue_doc("queues", &id, &bytes) {
                Ok(d) => docs.push(d),
                Err(e) => self.warn_once(format!("ignoring queue {id}: {e}")),
            }
        }
        Ok(queue_doc_rules::sort_out(&docs, |m| self.warn_once(m)))
    }

    pub(super) async fn create_queue(&self, queue: NewQueue) -> StoreResult<Queue> {
        let id = ObjectId::new();
        let name = queue.name.clone();
        let (mut d, parsed) = queue_doc_rules::new_doc(id, queue)?;
        d.remove("_id");
        let bytes = bson_bytes(&d)?;
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

    /// [`Store::update_queue`](crate::store::Store::update_queue): the change is applied
    /// and checked ([`queue_doc_rules::updated`]) inside the write transaction, before anything
    /// is written.
    pub(super) async fn update_queue(&self, id: ObjectId, update: QueueUpdate) -> StoreResult<Option<QueueState>> {
        let set = queue_doc_rules::set_fields(&update)?;
        self.write_quiet("update queue", move |tx| {
            let hex = id.to_hex();
            let found: Option<Vec<u8>> = tx
                .query_row("SELECT doc FROM queues WHERE id = ?1", [&hex], |r| r.get(0))
                .optional()
                .map_err(db_err("update queue"))?;
            let Some(bytes) = found else {
                return Ok(None);
            };
            let before = queue_doc("queues", &hex, &bytes)?;
            let (mut d, state) = queue_doc_rules::updated(&before, set.clone())?;
            if set.is_empty() {
                return Ok(Some(state));
            }
            d.remove("_id");
            let name = d.get_str("name").ok().map(str::to_owned);
            let bytes = bson_bytes(&d)?;
            match tx.execute(
                "UPDATE queues SET name = COALESCE(?1, name), doc = ?2 WHERE id = ?3",
                params![name, bytes, hex],
            ) {
                Ok(_) => Ok(Some(state)),
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

fn is_unique_violation(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _) if f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
        || f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY)
}

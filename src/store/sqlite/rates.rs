//! Rate grants in the embedded store: `rates(queue, n, at, node)`, read as [`RateRow`]s
//! and written by compare-and-set on `at` and `node`, as MongoDB's `rates` collection. The
//! rule is in `lifecycle::rate`.

use async_trait::async_trait;
use bson::oid::ObjectId;
use bson::DateTime;
use rusqlite::params;

use super::records::db_err;
use super::SqliteStore;
use crate::store::{RateRow, RateStore, StoreResult};

#[async_trait]
impl RateStore for SqliteStore {
    async fn rates(&self, queue: ObjectId) -> StoreResult<Vec<RateRow>> {
        self.with(move |conn| {
            let err = db_err("read the queue's rate grants");
            let mut stmt = conn
                .prepare_cached("SELECT n, at, node FROM rates WHERE queue = ?1 ORDER BY n")
                .map_err(&err)?;
            let rows = stmt
                .query_map(params![queue.to_hex()], |r| {
                    Ok(RateRow {
                        n: r.get(0)?,
                        at: DateTime::from_millis(r.get(1)?),
                        node: r.get(2)?,
                    })
                })
                .map_err(&err)?
                .collect::<Result<_, _>>()
                .map_err(&err);
            rows
        })
        .await
    }

    async fn ensure_rates(&self, queue: ObjectId, max: i64) -> StoreResult<()> {
        let known = self.with(move |conn| {
            conn.query_row(
                "SELECT COUNT(*) FROM rates WHERE queue = ?1 AND n < ?2",
                params![queue.to_hex(), max],
                |r| r.get::<_, i64>(0),
            )
            .map_err(db_err("count the queue's rate grants"))
        });
        if known.await? >= max {
            return Ok(());
        }
        self.write_quiet("create rate grants", move |tx| {
            let err = db_err("create rate grants");
            let mut insert = tx
                .prepare_cached("INSERT OR IGNORE INTO rates (queue, n, at, node) VALUES (?1, ?2, 0, NULL)")
                .map_err(&err)?;
            for n in 0..max {
                insert.execute(params![queue.to_hex(), n]).map_err(&err)?;
            }
            Ok(())
        })
        .await
    }

    async fn change_rate(&self, queue: ObjectId, n: i64, from: &RateRow, to: &RateRow) -> StoreResult<bool> {
        let (from, to) = (from.clone(), to.clone());
        self.write_quiet("change a rate grant", move |tx| {
            let changed = tx
                .prepare_cached(
                    "UPDATE rates SET at = ?1, node = ?2
                     WHERE queue = ?3 AND n = ?4 AND at = ?5 AND node IS ?6",
                )
                .and_then(|mut s| {
                    s.execute(params![
                        to.at.timestamp_millis(),
                        to.node,
                        queue.to_hex(),
                        n,
                        from.at.timestamp_millis(),
                        from.node
                    ])
                })
                .map_err(db_err("change a rate grant"))?;
            Ok(changed == 1)
        })
        .await
    }
}

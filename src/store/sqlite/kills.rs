//! Kill requests on the embedded store: the `stop` column holds the BSON of a task's
//! `stop` sub-document (see the MongoDB store's `kills`).

use bson::oid::ObjectId;
use rusqlite::params;

use super::records::{db_err, read_bson};
use super::SqliteStore;
use crate::model::{status, StopAction, StopRequest};
use crate::store::StoreResult;

impl SqliteStore {
    /// [`Store::kill_requests`](crate::store::Store::kill_requests).
    pub(super) async fn kill_requests(&self, node: &str) -> StoreResult<Vec<(ObjectId, StopRequest)>> {
        let node = node.to_string();
        let rows: Vec<(String, Vec<u8>)> = self
            .with(move |conn| {
                let err = db_err("read kill requests");
                let mut stmt = conn
                    .prepare_cached(
                        "SELECT id, stop FROM tasks WHERE node = ?1 AND status IN (?2, ?3) AND stop IS NOT NULL",
                    )
                    .map_err(&err)?;
                let rows = stmt
                    .query_map(params![node, status::CLAIMED, status::RUNNING], |r| {
                        Ok((r.get(0)?, r.get(1)?))
                    })
                    .map_err(&err)?;
                rows.collect::<Result<Vec<_>, _>>().map_err(&err)
            })
            .await?;
        let mut out = Vec::new();
        for (id, bytes) in rows {
            let Ok(oid) = ObjectId::parse_str(&id) else { continue };
            let stop = StopRequest::stored_kill(read_bson("tasks", &id, &bytes).map_err(|e| e.to_string()));
            if stop.action == StopAction::Kill {
                out.push((oid, stop));
            }
        }
        Ok(out)
    }
}

//! Watching the embedded store for queued tasks and task changes.

use bson::oid::ObjectId;
use rusqlite::Connection;

use super::records::db_err;
use super::{SqliteStore, OTHER_WRITERS_POLL};
use crate::store::StoreResult;

impl SqliteStore {
    pub(super) async fn watch_queued(&self) -> StoreResult<Option<crate::store::QueuedEvents>> {
        use tokio::sync::broadcast::error::RecvError;
        let events = futures::stream::unfold(self.queued.subscribe(), |mut rx| async move {
            match rx.recv().await {
                Ok(()) | Err(RecvError::Lagged(_)) => Some((Ok(()), rx)),
                Err(RecvError::Closed) => None,
            }
        });
        Ok(Some(Box::pin(events)))
    }

    /// Writes through this store are signalled at once, by task id (or as "any task" by a
    /// write that does not list them); writes by other processes on the same file (a DEN
    /// beside `disbatch web`) are seen by a look at `PRAGMA data_version` every
    /// [`OTHER_WRITERS_POLL`], one per watching process, as "any task" (the version also
    /// moves with this process's own writes, which are signalled by id already).
    pub(super) async fn watch_tasks(&self) -> StoreResult<Option<crate::store::TaskEvents>> {
        use futures::StreamExt;
        use tokio::sync::broadcast::error::RecvError;
        let here = futures::stream::unfold(self.changed.subscribe(), |mut rx| async move {
            let events: Vec<StoreResult<Option<ObjectId>>> = match rx.recv().await {
                Ok(Some(ids)) => ids.iter().map(|id| Ok(Some(*id))).collect(),
                Ok(None) | Err(RecvError::Lagged(_)) => vec![Ok(None)],
                Err(RecvError::Closed) => return None,
            };
            Some((futures::stream::iter(events), rx))
        })
        .flatten();
        let conn = super::connect::connect(&self.path)?;
        let version = |c: &Connection| {
            c.query_row("PRAGMA data_version", [], |r| r.get::<_, i64>(0))
                .map_err(db_err("watch tasks"))
        };
        let first = version(&conn)?;
        let elsewhere = futures::stream::unfold((conn, first), move |(conn, last)| async move {
            loop {
                tokio::time::sleep(OTHER_WRITERS_POLL).await;
                match version(&conn) {
                    Ok(v) if v == last => continue,
                    Ok(v) => return Some((Ok(None), (conn, v))),
                    Err(e) => return Some((Err(e), (conn, last))),
                }
            }
        });
        Ok(Some(Box::pin(futures::stream::select(here, elsewhere))))
    }

    /// [`Store::task_marks`](crate::store::Store::task_marks): a hash of the status, `mtime`
    /// and progress columns, read without the rest of the row.
    pub(super) async fn task_marks(&self, ids: &[ObjectId]) -> StoreResult<Vec<(ObjectId, u64)>> {
        use std::hash::{Hash, Hasher};
        let keys: Vec<String> = ids.iter().map(|i| i.to_hex()).collect();
        self.with(move |conn| {
            let err = db_err("read task states");
            let sql = format!(
                "SELECT id, status, mtime, progress FROM tasks WHERE id IN ({})",
                vec!["?"; keys.len()].join(", ")
            );
            let mut stmt = conn.prepare(&sql).map_err(&err)?;
            let rows = stmt
                .query_map(rusqlite::params_from_iter(keys.iter()), |r| {
                    let mut h = std::collections::hash_map::DefaultHasher::new();
                    (
                        r.get::<_, i64>(1)?,
                        r.get::<_, i64>(2)?,
                        r.get::<_, Option<Vec<u8>>>(3)?,
                    )
                        .hash(&mut h);
                    Ok((r.get::<_, String>(0)?, h.finish()))
                })
                .map_err(&err)?;
            let mut out = Vec::with_capacity(keys.len());
            for row in rows {
                let (id, mark) = row.map_err(&err)?;
                if let Ok(id) = ObjectId::parse_str(&id) {
                    out.push((id, mark));
                }
            }
            Ok(out)
        })
        .await
    }
}

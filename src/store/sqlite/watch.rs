//! Watching the embedded store for queued tasks and task changes.

use rusqlite::Connection;

use super::rows::db_err;
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

    /// Writes through this store are signalled at once; writes by other processes on the
    /// same file (a DEN beside `disbatch web`) are seen by a look at `PRAGMA data_version`
    /// every [`OTHER_WRITERS_POLL`], one per watching process.
    pub(super) async fn watch_tasks(&self) -> StoreResult<Option<crate::store::TaskEvents>> {
        use tokio::sync::broadcast::error::RecvError;
        let here = futures::stream::unfold(self.changed.subscribe(), |mut rx| async move {
            match rx.recv().await {
                Ok(()) | Err(RecvError::Lagged(_)) => Some((Ok(None), rx)),
                Err(RecvError::Closed) => None,
            }
        });
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
}

//! The embedded store's read connections: every read runs on
//! [`tokio::task::spawn_blocking`] with a connection of its own, at most [`READERS`] at
//! once. A read past them waits for one to end, so however many requests the DCI serves
//! at once, the store holds at most [`READERS`] connections (and their file descriptors:
//! the database file and its log) besides the writer's and one per task watcher.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rusqlite::Connection;
use tokio::sync::Semaphore;

use crate::store::{StoreError, StoreResult};

/// The most read connections open at once, all kept open for reuse.
pub(super) const READERS: usize = 8;

/// The read connections of one store and its clones.
pub(super) struct Readers {
    path: Arc<PathBuf>,
    idle: Arc<Mutex<Vec<Connection>>>,
    permits: Arc<Semaphore>,
    /// The store's count of write transactions (see `SqliteStore::write_transactions`).
    commits: Arc<AtomicU64>,
}

impl Readers {
    pub(super) fn new(path: Arc<PathBuf>, commits: Arc<AtomicU64>) -> Readers {
        Readers {
            path,
            idle: Arc::new(Mutex::new(Vec::new())),
            permits: Arc::new(Semaphore::new(READERS)),
            commits,
        }
    }

    /// Runs `f` on a connection of its own on the blocking thread pool, once fewer than
    /// [`READERS`] reads are running.
    pub(super) async fn with<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> StoreResult<T> + Send + 'static,
    {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| StoreError::Rejected(format!("database reads stopped: {e}")))?;
        let idle = self.idle.clone();
        let path = self.path.clone();
        let commits = self.commits.clone();
        tokio::task::spawn_blocking(move || {
            let pooled = idle.lock().ok().and_then(|mut p| p.pop());
            let mut conn = match pooled {
                Some(c) => c,
                None => {
                    let c = super::connect::connect(&path)?;
                    // Counted with the writer's (see `write_transactions`); SQLite calls the
                    // hook for write transactions only.
                    c.commit_hook(Some(move || {
                        commits.fetch_add(1, Ordering::Relaxed);
                        false
                    }));
                    c
                }
            };
            let result = f(&mut conn);
            // Back among the idle ones before the permit goes, so a connection is opened
            // only when every open one is in use.
            if let Ok(mut idle) = idle.lock() {
                idle.push(conn);
            }
            drop(permit);
            result
        })
        .await
        .map_err(|e| StoreError::Rejected(format!("database task failed: {e}")))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_reads_at_once_share_at_most_readers_connections() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.db");
        drop(super::super::connect::connect(&path).unwrap());
        let readers = Arc::new(Readers::new(Arc::new(path), Arc::new(AtomicU64::new(0))));
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let reads: Vec<_> = (0..READERS * 6)
            .map(|_| {
                let (readers, running, most) = (readers.clone(), running.clone(), most.clone());
                tokio::spawn(async move {
                    readers
                        .with(move |conn| {
                            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                            most.fetch_max(now, Ordering::SeqCst);
                            conn.query_row("SELECT 1", [], |r| r.get::<_, i64>(0)).unwrap();
                            std::thread::sleep(Duration::from_millis(20));
                            running.fetch_sub(1, Ordering::SeqCst);
                            Ok(())
                        })
                        .await
                })
            })
            .collect();
        for r in reads {
            r.await.unwrap().unwrap();
        }
        let most = most.load(Ordering::SeqCst);
        assert!(most <= READERS, "{most} reads ran at once");
        assert!(most > 1, "the reads never ran side by side");
        let open = readers.idle.lock().unwrap().len();
        assert!((1..=READERS).contains(&open), "{open} connections kept");
    }
}

//! Writing through the store's writer thread and telling the watchers what changed:
//! [`Store::watch_tasks`](crate::store::Store::watch_tasks) by task id where a write knows
//! its tasks, [`Store::watch_queued`](crate::store::Store::watch_queued) when tasks were
//! queued.

use bson::oid::ObjectId;

use super::SqliteStore;
use crate::store::StoreResult;

/// Which tasks a write changed, for the watchers of [`Store::watch_tasks`](crate::store::Store::watch_tasks).
#[derive(Debug, Clone)]
pub(super) enum Touched {
    /// No task (nodes, slots, stats, plugins…).
    Nothing,
    /// These tasks.
    Tasks(Vec<ObjectId>),
    /// Tasks the write does not list.
    Any,
}

impl SqliteStore {
    /// Runs `f` in a `BEGIN IMMEDIATE` transaction on the store's writer thread, answered
    /// once committed; `f` shares the transaction (not its atomicity) with other writes
    /// waiting at the same time (see `writer`). `f` runs again alone when the group's
    /// commit fails, so it must not consume what it captured. The watchers of tasks are
    /// told that any task may have changed: a write that knows which tasks it changed uses
    /// [`Self::write_touching`], one that changes none [`Self::write_quiet`].
    pub(super) async fn write<T, F>(&self, op: &'static str, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: Fn(&rusqlite::Transaction<'_>) -> StoreResult<T> + Send + 'static,
    {
        self.write_touching(op, f, |_| Touched::Any).await
    }

    /// [`Self::write`] of a write that changes no task.
    pub(super) async fn write_quiet<T, F>(&self, op: &'static str, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: Fn(&rusqlite::Transaction<'_>) -> StoreResult<T> + Send + 'static,
    {
        self.write_touching(op, f, |_| Touched::Nothing).await
    }

    /// [`Self::write_quiet`] for a write that keeps a lease alive (a heartbeat, a slot
    /// lease): the writer takes it before every ordinary write waiting (see `writer`).
    pub(super) async fn write_liveness<T, F>(&self, op: &'static str, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: Fn(&rusqlite::Transaction<'_>) -> StoreResult<T> + Send + 'static,
    {
        self.writer.write_as(super::writer::Priority::Liveness, op, f).await
    }

    /// [`Self::write`] telling the watchers of tasks which tasks changed: `touched` reads
    /// them from the write's value.
    pub(super) async fn write_touching<T, F>(
        &self,
        op: &'static str,
        f: F,
        touched: impl FnOnce(&T) -> Touched,
    ) -> StoreResult<T>
    where
        T: Send + 'static,
        F: Fn(&rusqlite::Transaction<'_>) -> StoreResult<T> + Send + 'static,
    {
        let value = self.writer.write(op, f).await?;
        if self.changed.receiver_count() > 0 {
            self.signal_changed(touched(&value));
        }
        Ok(value)
    }

    /// [`Self::write`] of a write that changes task `id` alone.
    pub(super) async fn write_task<T, F>(&self, op: &'static str, id: ObjectId, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: Fn(&rusqlite::Transaction<'_>) -> StoreResult<T> + Send + 'static,
    {
        self.write_touching(op, f, move |_| Touched::Tasks(vec![id])).await
    }

    /// Tells the watchers of [`Store::watch_tasks`] which tasks changed.
    pub(super) fn signal_changed(&self, touched: Touched) {
        let _ = match touched {
            Touched::Nothing => return,
            Touched::Tasks(ids) if ids.is_empty() => return,
            Touched::Tasks(ids) => self.changed.send(Some(ids.into())),
            Touched::Any => self.changed.send(None),
        };
    }

    /// Tells the watchers of [`Store::watch_queued`] that tasks were queued.
    pub(super) fn signal_queued(&self) {
        let _ = self.queued.send(());
    }
}

//! Output files no task uses, decided once here for both stores.
//!
//! A DEN writes a result's files before the update that points the task at them, so a
//! DEN that dies between the two leaves files no task names; so does a task deleted by
//! hand, and a record that `attempts` dropped to keep its last
//! [`ATTEMPTS_KEPT`](crate::model::ATTEMPTS_KEPT) (a hand retry keeps the run's files in
//! its record). The leader walks the files in id order, a bounded page at a time
//! ([`sweep_files`]), and deletes each file older than [`FILE_GRACE`] whose task is gone or
//! names it nowhere ([`Task::output_files`](crate::model::Task::output_files)): not as its
//! stdout or stderr, not in a record of `attempts`.
//!
//! The grace is far longer than any lease: a file is only ever pointed at by the fenced
//! write of the run that wrote it (or moved, in one write, from a task's outputs into its
//! record), and a run whose DEN stays away that long is recovered as an orphan, so its
//! late write is refused by its fence. A file that names no task (another tool's), and
//! every file of a task that cannot be read, is kept.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use bson::oid::ObjectId;
use bson::DateTime;

use crate::store::{Page, Store, StoreResult, StoredFile, TaskFilter};

/// How old a file must be before it may go as used by nothing: one hour.
pub const FILE_GRACE: Duration = Duration::from_secs(3600);

/// How many files one page lists.
pub const FILES_PER_PAGE: usize = 500;

/// What one page of the sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FilePage {
    /// The files listed.
    pub looked: usize,
    /// The files deleted.
    pub deleted: usize,
    /// Where the next page starts; `None` when this page reached the end (the next sweep
    /// starts again from the first file).
    pub next: Option<ObjectId>,
}

/// Looks at up to `limit` files after `after` (from the first when `None`) at `now`, and
/// deletes those used by nothing.
pub async fn sweep_files(
    store: &(impl Store + ?Sized),
    after: Option<ObjectId>,
    limit: usize,
    now: DateTime,
) -> StoreResult<FilePage> {
    let files = store.output_files(after, limit).await?;
    let next = if files.len() >= limit.max(1) {
        files.last().map(|f| f.id)
    } else {
        None
    };
    let old = old_enough(&files, now);
    let tasks: Vec<ObjectId> = old.keys().copied().collect();
    let found = if tasks.is_empty() {
        Vec::new()
    } else {
        let filter = TaskFilter {
            ids: Some(tasks.clone()),
            ..TaskFilter::default()
        };
        let page = Page {
            skip: 0,
            limit: u64::try_from(tasks.len()).unwrap_or(u64::MAX),
            oldest_first: true,
        };
        store.find_tasks(&filter, page).await?
    };
    let used: HashMap<ObjectId, Option<Vec<ObjectId>>> = found
        .iter()
        .map(|t| (t.id, t.problem.is_none().then(|| t.output_files())))
        .collect();
    let mut deleted = 0;
    for (task, candidates) in old {
        let unused: Vec<ObjectId> = match used.get(&task) {
            // A task that cannot be read keeps every file.
            Some(None) => continue,
            Some(Some(named)) => candidates.into_iter().filter(|f| !named.contains(f)).collect(),
            None => candidates,
        };
        if unused.is_empty() {
            continue;
        }
        store.discard_output_files(task, &unused).await?;
        deleted += unused.len();
    }
    Ok(FilePage {
        looked: files.len(),
        deleted,
        next,
    })
}

/// The files of `files` past [`FILE_GRACE`] at `now` that name a task, by task.
fn old_enough(files: &[StoredFile], now: DateTime) -> BTreeMap<ObjectId, Vec<ObjectId>> {
    let grace = i64::try_from(FILE_GRACE.as_millis()).unwrap_or(i64::MAX);
    let cutoff = now.timestamp_millis().saturating_sub(grace);
    let mut by_task: BTreeMap<ObjectId, Vec<ObjectId>> = BTreeMap::new();
    for f in files {
        let (Some(task), Some(at)) = (f.task, f.uploaded) else {
            continue;
        };
        if at.timestamp_millis() <= cutoff {
            by_task.entry(task).or_default().push(f.id);
        }
    }
    by_task
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(id: u8, task: Option<u8>, at: Option<i64>) -> StoredFile {
        StoredFile {
            id: ObjectId::from_bytes([id; 12]),
            task: task.map(|t| ObjectId::from_bytes([t; 12])),
            uploaded: at.map(DateTime::from_millis),
        }
    }

    #[test]
    fn only_files_past_the_grace_that_name_a_task_are_candidates() {
        let now = DateTime::from_millis(10_000_000);
        let grace = i64::try_from(FILE_GRACE.as_millis()).unwrap();
        let files = [
            file(1, Some(9), Some(10_000_000 - grace)),
            file(2, Some(9), Some(10_000_000 - grace + 1)),
            file(3, None, Some(0)),
            file(4, Some(8), None),
            file(5, Some(9), Some(0)),
        ];
        let by_task = old_enough(&files, now);
        assert_eq!(by_task.len(), 1);
        assert_eq!(
            by_task[&ObjectId::from_bytes([9; 12])],
            vec![ObjectId::from_bytes([1; 12]), ObjectId::from_bytes([5; 12])]
        );
    }
}

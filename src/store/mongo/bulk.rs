//! Fenced task updates in groups ([`crate::store::group`]): the updates of every
//! [`Store::change_tasks`](crate::store::Store::change_tasks) call made while one is on its
//! way go together in one ordered `bulkWrite` (MongoDB 8.0 and later), which answers for
//! each update whether its filter matched. So the starts and ends of the runs of all of a
//! DEN's workers that finish together cost one command, not one each.
//!
//! A group of one update is an `updateOne`. On a server without `bulkWrite` (before 8.0,
//! or one that refuses the command) each call's updates are `updateOne`s in order, calls
//! side by side as before; the store finds that out from the first group and remembers it.
//!
//! A reply that leaves unknown which updates were made (lost, a write concern not met, a
//! failure after part of a split command) fails every call of the group with a transient
//! error: each is retried like a lone update, and its fences make a change made twice write
//! nothing the second time.
//!
//! A write error (a result too large for its document) fails its own call alone: the
//! calls before it in the group are answered, the calls after it go again in the next
//! group.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bson::Document;
use futures::FutureExt;
use mongodb::error::{ErrorKind, PartialBulkWriteResult};
use mongodb::options::{UpdateOneModel, WriteModel};
use mongodb::results::VerboseBulkWriteResult;
use mongodb::{Client, Collection};

use super::errors::{classify, TRANSIENT_CODES};
use crate::store::group::{Group, Turn};
use crate::store::{StoreError, StoreResult};

/// Most calls in one group: enough for every worker of a busy DEN, few enough that one
/// group's command stays small.
const MOST_CALLS: usize = 256;

/// Server codes that refuse the `bulkWrite` command itself, not its writes: CommandNotFound
/// (59), CommandNotSupported (115), Unauthorized (13, a role that allows updates of the
/// collection but not `bulkWrite`). Updates then go one by one.
const NO_BULK_WRITE: [i32; 3] = [59, 115, 13];

/// One fenced update of one task: its filter and its update.
#[derive(Debug, Clone)]
pub(super) struct FencedUpdate {
    pub filter: Document,
    pub update: Document,
}

/// A call: its updates in order. Its answer: for each, whether its filter matched.
type Call = Vec<FencedUpdate>;
type Answer = StoreResult<Vec<bool>>;

/// The fenced task updates of one store (cloning shares them): grouped while the server
/// takes `bulkWrite`, each call on its own once it is known not to.
#[derive(Clone)]
pub(super) struct Updates {
    group: Group<Call, Answer>,
    bulk: Arc<AtomicBool>,
    tasks: Collection<Document>,
}

impl Updates {
    /// Updates of task documents in `tasks`.
    pub(super) fn new(client: Client, tasks: Collection<Document>, window: Duration) -> Updates {
        let bulk = Arc::new(AtomicBool::new(true));
        let group = Group::new(MOST_CALLS, window, {
            let (tasks, bulk) = (tasks.clone(), bulk.clone());
            move |calls: Vec<Call>| {
                let (client, tasks, bulk) = (client.clone(), tasks.clone(), bulk.clone());
                async move { round(&client, &tasks, &bulk, calls).await }.boxed()
            }
        });
        Updates { group, bulk, tasks }
    }

    /// Whether updates go in groups (the server takes `bulkWrite`, as far as is known).
    pub(super) fn grouped(&self) -> bool {
        self.bulk.load(Ordering::Relaxed)
    }

    /// Makes `call`'s updates, in order: for each, whether its filter matched.
    pub(super) async fn apply(&self, call: Call) -> Answer {
        if !self.grouped() {
            return one_call(&self.tasks, call).await;
        }
        self.group.call(call).await.unwrap_or_else(|| {
            Err(StoreError::Database(
                "change tasks: the write ended without an answer (its runtime shut down); it may or may not have been made".into(),
            ))
        })
    }
}

/// One group: in one `bulkWrite` while the server takes it, else each call on its own.
async fn round(
    client: &Client,
    tasks: &Collection<Document>,
    bulk: &AtomicBool,
    calls: Vec<Call>,
) -> Vec<Turn<Call, Answer>> {
    // A lone update goes as an `updateOne`: one command either way, and the lighter one.
    let lone = calls.iter().map(Vec::len).sum::<usize>() <= 1;
    let calls = if bulk.load(Ordering::Relaxed) && !lone {
        match in_one_command(client, tasks, calls).await {
            Ok(turns) => return turns,
            Err(calls) => {
                tracing::info!("the database does not take bulkWrite (MongoDB 8.0): one update per task change");
                bulk.store(false, Ordering::Relaxed);
                calls
            }
        }
    } else {
        calls
    };
    let each = calls.into_iter().map(|call| one_call(tasks, call));
    futures::future::join_all(each)
        .await
        .into_iter()
        .map(Turn::Done)
        .collect()
}

/// One call's updates as `updateOne`s, in order; the first error ends it.
async fn one_call(tasks: &Collection<Document>, call: Call) -> Answer {
    let mut done = Vec::with_capacity(call.len());
    for u in call {
        let r = tasks
            .update_one(u.filter, u.update)
            .await
            .map_err(|e| classify("change task", &e))?;
        done.push(r.matched_count == 1);
    }
    Ok(done)
}

/// Every call's updates in one ordered `bulkWrite`. `Err` with the calls when the server
/// has no `bulkWrite`.
async fn in_one_command(
    client: &Client,
    tasks: &Collection<Document>,
    calls: Vec<Call>,
) -> Result<Vec<Turn<Call, Answer>>, Vec<Call>> {
    let namespace = tasks.namespace();
    let models: Vec<WriteModel> = calls
        .iter()
        .flatten()
        .map(|u| {
            WriteModel::UpdateOne(
                UpdateOneModel::builder()
                    .namespace(namespace.clone())
                    .filter(u.filter.clone())
                    .update(u.update.clone())
                    .build(),
            )
        })
        .collect();
    let count = models.len();
    let outcome = match client.bulk_write(models).verbose_results().await {
        Ok(result) if result.update_results.len() == count => Outcome::Made(matched(&result)),
        Ok(_) => Outcome::Failed(Failure::unknown("the reply does not account for every update")),
        Err(e) => match e.kind.as_ref() {
            ErrorKind::IncompatibleServer { .. } => return Err(calls),
            ErrorKind::Command(c) if NO_BULK_WRITE.contains(&c.code) => return Err(calls),
            ErrorKind::BulkWrite(b) if b.write_concern_errors.is_empty() && b.write_errors.len() == 1 => {
                let (&at, w) = b.write_errors.iter().next().expect("one write error");
                let failure = Failure::of_write(w.code, &w.message);
                match &b.partial_result {
                    Some(PartialBulkWriteResult::Verbose(r)) => Outcome::StoppedAt(matched(r), at, failure),
                    None if at == 0 => Outcome::StoppedAt(Vec::new(), 0, failure),
                    _ => Outcome::Failed(Failure::unknown(&e.to_string())),
                }
            }
            // A write concern not met, or a failure after some of the writes (a later
            // batch of a split command): which updates were made is unknown, and the
            // fences make trying them again safe.
            ErrorKind::BulkWrite(_) => Outcome::Failed(Failure::unknown(&e.to_string())),
            _ => Outcome::Failed(Failure::of(classify("change tasks", &e))),
        },
    };
    Ok(answers(calls, outcome))
}

/// Whether each update of a `bulkWrite`, by index, matched its filter (an update missing
/// from the result was not made).
fn matched(r: &VerboseBulkWriteResult) -> Vec<bool> {
    let n = r.update_results.keys().max().map_or(0, |m| m + 1);
    (0..n)
        .map(|i| r.update_results.get(&i).is_some_and(|u| u.matched_count == 1))
        .collect()
}

/// What one `bulkWrite` did.
#[derive(Debug)]
enum Outcome {
    /// Every update was made; whether each matched, by index.
    Made(Vec<bool>),
    /// The updates before the index were made (whether each matched), the one at it failed,
    /// the ones after it were not tried.
    StoppedAt(Vec<bool>, usize, Failure),
    /// Unknown which were made (the reply was lost, the server failed): every call fails.
    Failed(Failure),
}

/// A failure to give each call it fails.
#[derive(Debug, Clone)]
pub(super) struct Failure {
    transient: bool,
    message: String,
}

impl Failure {
    pub(super) fn of(e: StoreError) -> Failure {
        Failure {
            transient: e.is_transient(),
            message: match e {
                StoreError::Database(m) | StoreError::Rejected(m) => m,
                other => other.to_string(),
            },
        }
    }

    /// A failure after which it is unknown which updates were made: retrying may help.
    fn unknown(what: &str) -> Failure {
        Failure {
            transient: true,
            message: format!("change tasks: {what} (which of the group's updates were made is unknown)"),
        }
    }

    /// A write error of one update.
    fn of_write(code: i32, message: &str) -> Failure {
        Failure {
            transient: TRANSIENT_CODES.contains(&code),
            message: format!("change task: {message} (code {code})"),
        }
    }

    /// `e`, after which it is unknown which of a group's claims were made: retrying helps
    /// (the DEN puts back the claims it made).
    pub(super) fn claims_unknown(e: StoreError) -> Failure {
        Failure {
            transient: true,
            message: format!(
                "claim tasks: {} (which of the group's claims were made is unknown)",
                Failure::of(e).message
            ),
        }
    }

    pub(super) fn error(&self) -> StoreError {
        if self.transient {
            StoreError::Database(self.message.clone())
        } else {
            StoreError::Rejected(self.message.clone())
        }
    }
}

/// Each call's turn after `outcome`.
fn answers(calls: Vec<Call>, outcome: Outcome) -> Vec<Turn<Call, Answer>> {
    let of = |m: &[bool], range: std::ops::Range<usize>| range.map(|i| m.get(i).copied().unwrap_or(false)).collect();
    let mut first = 0;
    calls
        .into_iter()
        .map(|call| {
            let range = first..first + call.len();
            first = range.end;
            match &outcome {
                Outcome::Made(m) => Turn::Done(Ok(of(m, range))),
                Outcome::StoppedAt(m, at, _) if range.end <= *at => Turn::Done(Ok(of(m, range))),
                Outcome::StoppedAt(_, at, e) if range.contains(at) => Turn::Done(Err(e.error())),
                Outcome::StoppedAt(..) => Turn::Again(call),
                Outcome::Failed(e) => Turn::Done(Err(e.error())),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests;

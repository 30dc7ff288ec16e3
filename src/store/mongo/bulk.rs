//! Fenced task updates in groups ([`crate::store::group`]): the updates of every
//! [`Store::change_tasks`](crate::store::Store::change_tasks) call made while one is on its
//! way go together in one ordered `bulkWrite` (MongoDB 8.0 and later), which answers for
//! each update whether its filter matched. So the starts and ends of the runs of all of a
//! DEN's workers that finish together cost one command, not one each.
//!
//! Calls that make the same change of different tasks (the starts of the workers' runs) go
//! as one `updateMany` entry of it ([`many`]).
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
use mongodb::options::{UpdateManyModel, UpdateOneModel, WriteModel};
use mongodb::results::VerboseBulkWriteResult;
use mongodb::{Client, Collection};

pub(super) use self::many::written_ids;
use self::many::{Many, Sent};
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

/// One group: in one `bulkWrite` while the server takes it, the calls that make the same
/// change of different tasks as one `updateMany` entry each after the others ([`many`]);
/// else each call and each such `updateMany` on its own, side by side.
async fn round(
    client: &Client,
    tasks: &Collection<Document>,
    bulk: &AtomicBool,
    calls: Vec<Call>,
) -> Vec<Turn<Call, Answer>> {
    let n = calls.len();
    let (many, left) = many::split(calls.into_iter().enumerate().collect(), bson::DateTime::now());
    let (at, left): (Vec<usize>, Vec<Call>) = left.into_iter().unzip();
    let entries = left.iter().map(Vec::len).sum::<usize>();
    // A lone update goes as an `updateOne` (or `updateMany`): one command either way, and
    // the lighter one.
    let (left, many) = if bulk.load(Ordering::Relaxed) && entries + many.len() > 1 {
        match in_one_command(client, tasks, &left, &many).await {
            Ok(outcome) => {
                let settled = many
                    .into_iter()
                    .enumerate()
                    .map(|(j, m)| m.settle(tasks, sent(&outcome, entries + j)));
                let settled = futures::future::join_all(settled).await;
                return in_place(n, at.into_iter().zip(answers(left, &outcome)), settled);
            }
            Err(()) => {
                tracing::info!("the database does not take bulkWrite (MongoDB 8.0): one update per task change");
                bulk.store(false, Ordering::Relaxed);
                (left, many)
            }
        }
    } else {
        (left, many)
    };
    let (settled, each) = futures::join!(
        futures::future::join_all(many.into_iter().map(|m| m.apply(tasks))),
        futures::future::join_all(left.into_iter().map(|call| one_call(tasks, call)))
    );
    in_place(n, at.into_iter().zip(each.into_iter().map(Turn::Done)), settled)
}

/// The turns of a group of `n` calls, from the turns of the calls that went one entry each
/// and of those that went in an `updateMany`, each beside its place.
fn in_place(
    n: usize,
    each: impl Iterator<Item = (usize, Turn<Call, Answer>)>,
    many: Vec<Vec<(usize, Turn<Call, Answer>)>>,
) -> Vec<Turn<Call, Answer>> {
    let mut turns: Vec<Option<Turn<Call, Answer>>> = (0..n).map(|_| None).collect();
    for (i, turn) in each.chain(many.into_iter().flatten()) {
        turns[i] = Some(turn);
    }
    turns
        .into_iter()
        .map(|t| t.expect("every call of the group is answered"))
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

/// Every call's updates in one ordered `bulkWrite`, then each [`Many`] as an `updateMany`.
/// `Err` when the server has no `bulkWrite`.
async fn in_one_command(
    client: &Client,
    tasks: &Collection<Document>,
    calls: &[Call],
    many: &[Many],
) -> Result<Outcome, ()> {
    let namespace = tasks.namespace();
    let mut models: Vec<WriteModel> = calls
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
    models.extend(many.iter().map(|m| {
        WriteModel::UpdateMany(
            UpdateManyModel::builder()
                .namespace(namespace.clone())
                .filter(m.filter())
                .update(m.update())
                .build(),
        )
    }));
    let count = models.len();
    Ok(match client.bulk_write(models).verbose_results().await {
        Ok(result) if result.update_results.len() == count => Outcome::Made(matched(&result)),
        Ok(_) => Outcome::Failed(Failure::unknown("the reply does not account for every update")),
        Err(e) => match e.kind.as_ref() {
            ErrorKind::IncompatibleServer { .. } => return Err(()),
            ErrorKind::Command(c) if NO_BULK_WRITE.contains(&c.code) => return Err(()),
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
    })
}

/// How many tasks each update of a `bulkWrite`, by index, matched (an update missing from
/// the result was not made).
fn matched(r: &VerboseBulkWriteResult) -> Vec<u64> {
    let n = r.update_results.keys().max().map_or(0, |m| m + 1);
    (0..n)
        .map(|i| r.update_results.get(&i).map_or(0, |u| u.matched_count))
        .collect()
}

/// What `outcome` did with the update at index `i`, an `updateMany`.
fn sent(outcome: &Outcome, i: usize) -> Sent {
    match outcome {
        Outcome::Made(m) => Sent::Made(m.get(i).copied().unwrap_or(0)),
        Outcome::StoppedAt(m, at, _) if i < *at => Sent::Made(m.get(i).copied().unwrap_or(0)),
        Outcome::StoppedAt(_, at, e) if i == *at => Sent::Failed(e.clone()),
        Outcome::StoppedAt(..) => Sent::NotTried,
        Outcome::Failed(e) => Sent::Failed(e.clone()),
    }
}

/// What one `bulkWrite` did.
#[derive(Debug)]
enum Outcome {
    /// Every update was made; how many tasks each matched, by index.
    Made(Vec<u64>),
    /// The updates before the index were made (how many each matched), the one at it failed,
    /// the ones after it were not tried.
    StoppedAt(Vec<u64>, usize, Failure),
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

/// Each call's turn after `outcome`: an update held when it matched its task.
fn answers(calls: Vec<Call>, outcome: &Outcome) -> Vec<Turn<Call, Answer>> {
    let of = |m: &[u64], range: std::ops::Range<usize>| range.map(|i| m.get(i) == Some(&1)).collect();
    let mut first = 0;
    calls
        .into_iter()
        .map(|call| {
            let range = first..first + call.len();
            first = range.end;
            match outcome {
                Outcome::Made(m) => Turn::Done(Ok(of(m, range))),
                Outcome::StoppedAt(m, at, _) if range.end <= *at => Turn::Done(Ok(of(m, range))),
                Outcome::StoppedAt(_, at, e) if range.contains(at) => Turn::Done(Err(e.error())),
                Outcome::StoppedAt(..) => Turn::Again(call),
                Outcome::Failed(e) => Turn::Done(Err(e.error())),
            }
        })
        .collect()
}

mod many;
#[cfg(test)]
mod tests;

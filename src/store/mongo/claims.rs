//! The spec's claim, in groups ([`crate::store::group`]).
//!
//! A lone claim is the spec's `findOneAndUpdate`: one command. Claims of one queue by one
//! node made while another claim is on its way go together in the next round, and so does a
//! lone claim of a queue being drained (its node claimed from it within as long as tasks
//! read ahead are used, and no read of it found no more tasks than it claimed, nor lost a
//! task read to another claimer, within [`super::ahead::HOLD_OFF_FOR`]): a read of
//! the queue's next tasks (as many as there are claims, in the queue's order), then one
//! fenced update per task read, sent with the other task changes of the moment in one
//! `bulkWrite` ([`super::bulk`]). Each update claims its task only while it is still
//! queued and unclaimed and unchanged since the read (its `mtime`), and, for a claim with
//! a deadline, only while the database's clock is before the earliest deadline of the
//! round's claims; so a Disbatch 4 DEN claiming beside it with its own `findOneAndUpdate`
//! never gets a task this node got, and the reply says which it got. The tasks claimed go
//! to the claims in the queue's order, claimed (-1), to be started by their workers. A task
//! is handed out as read with the claim's fields set: a change to a queued task that
//! leaves its `mtime` as it was (every write of Disbatch's own touches it) is not seen by
//! the claim. Claims left without a task while a task read was
//! lost (to another claimer, or to a deadline) are made again one by one; claims left
//! without one because the queue ran out claim nothing.
//!
//! A round of grouped claims reads a few tasks more than it claims and keeps them for
//! the claims that follow ([`super::ahead`]): those, and a worker's next claim sent with
//! the end of its run ([`MongoStore::end_and_claim`]), are fenced updates in the shared
//! `bulkWrite` like the others, with no read of their own.
//!
//! A claimed task that cannot be read is failed at once (its `stderr` says why).

use futures::future::join_all;
use futures::{FutureExt, TryStreamExt};
use mongodb::options::FindOptions;

use super::ahead::{Ahead, Reader, READ_AHEAD};
use super::bulk::{Failure, FencedUpdate, Updates};
use super::errors::classify;
use super::*;
use crate::store::group::{Group, Turn};
use crate::store::EndAndClaim;

/// Most claims in one round.
const MOST_CLAIMS: usize = 256;

/// One claim: of `queue` (read in `sort` order) by `node`, made only before `until` by
/// the database's clock when given.
#[derive(Debug, Clone)]
struct Claim {
    queue: ObjectId,
    sort: Sort,
    node: String,
    until: Option<DateTime>,
}

type Claimed = StoreResult<Option<Task>>;

/// The claims of one store (cloning shares them).
#[derive(Clone)]
pub(super) struct Claims {
    group: Group<Claim, Claimed>,
    ahead: Ahead,
}

impl Claims {
    pub(super) fn new(tasks: Collection<Document>, updates: Updates, window: Duration) -> Claims {
        let ahead = Ahead::default();
        let group = Group::new(MOST_CLAIMS, window, {
            let ahead = ahead.clone();
            move |claims: Vec<Claim>| {
                let (tasks, updates, ahead) = (tasks.clone(), updates.clone(), ahead.clone());
                async move { round(&tasks, &updates, &ahead, claims).await }.boxed()
            }
        });
        Claims { group, ahead }
    }
}

impl MongoStore {
    /// Uses the tasks a round of claims reads ahead for `d` after their read (0.1 s by
    /// default, the config's `read_ahead`; zero reads none ahead, and every lone claim is
    /// the spec's `findOneAndUpdate`). Within `d`, a task that becomes claimable after such
    /// a read and comes first in its queue's order may be claimed after the tasks read (see
    /// `mongo/ahead.rs`).
    pub fn read_ahead_for(self, d: Duration) -> MongoStore {
        self.claims.ahead.use_for(d);
        self
    }

    /// How long tasks read ahead are used.
    #[cfg(test)]
    pub(super) fn reads_ahead_for(&self) -> Duration {
        self.claims.ahead.fresh_for()
    }
}

impl Claim {
    /// The claims that may take the tasks this one reads ahead.
    fn reader(&self) -> Reader {
        Reader {
            queue: self.queue,
            sort: self.sort,
            node: self.node.clone(),
        }
    }
}

impl MongoStore {
    /// Claims as [`Store::claim`] says, made by the server only before `until` (by its
    /// clock) when given ([`Store::claim_before`](crate::store::Store::claim_before)): a
    /// claim that reaches the server later (the process was stopped between the renewal
    /// and the claim, the request was held up on the network) claims nothing. A claimed
    /// document that cannot be read as a task is marked failed (status 2, the reason in
    /// `stderr`) and the error is returned.
    pub(super) async fn claim_task_until(
        &self,
        queue: &Queue,
        node: &str,
        until: Option<DateTime>,
    ) -> StoreResult<Option<Task>> {
        let claim = Claim {
            queue: queue.id,
            sort: queue.sort,
            node: node.to_owned(),
            until,
        };
        self.claims.group.call(claim).await.unwrap_or_else(|| {
            Err(StoreError::Database(
                "claim task: the claim ended without an answer (its runtime shut down); it may or may not have been made"
                    .into(),
            ))
        })
    }

    /// [`Store::finish_and_claim`](crate::store::Store::finish_and_claim): the end of a run
    /// and a fenced claim of a task read ahead for `queue` and `node`, in one `bulkWrite`
    /// (the claim is made whether or not the end's fence held; the task claimed is the
    /// worker's either way). `None` when no task read ahead is at hand, or the server takes
    /// no `bulkWrite`: the caller then ends and claims apart. When the task read ahead was
    /// lost meanwhile, the claim is made again on its own, before `until`.
    pub(super) async fn end_and_claim(
        &self,
        end: &(ObjectId, TaskFence, TaskChange),
        queue: &Queue,
        node: &str,
        until: DateTime,
    ) -> StoreResult<Option<EndAndClaim>> {
        if !self.updates.grouped() {
            return Ok(None);
        }
        let claim = Claim {
            queue: queue.id,
            sort: queue.sort,
            node: node.to_owned(),
            until: Some(until),
        };
        let reader = claim.reader();
        let Some(raw) = self.claims.ahead.take(&reader, 1).pop() else {
            return Ok(None);
        };
        let now = DateTime::now();
        let end = super::change::fenced(end, now)?;
        let made = self
            .updates
            .apply(vec![end, fenced_claim(&raw, node, Some(until), now)])
            .await?;
        let claimed = if made[1] {
            self.claims.ahead.claimed(&reader);
            read_claimed(&self.tasks, &as_claimed(raw, node, now), node).await
        } else {
            self.claims.ahead.forget(&reader);
            self.claims.ahead.hold_off(&reader);
            self.claim_task_until(queue, node, Some(until)).await
        };
        Ok(Some(EndAndClaim {
            ended: made[0],
            claimed,
        }))
    }
}

/// One round: the claims of each queue and node together, side by side.
async fn round(
    tasks: &Collection<Document>,
    updates: &Updates,
    ahead: &Ahead,
    claims: Vec<Claim>,
) -> Vec<Turn<Claim, Claimed>> {
    let mut parts: Vec<Vec<(usize, Claim)>> = Vec::new();
    for (i, c) in claims.into_iter().enumerate() {
        match parts
            .iter_mut()
            .find(|p| (&p[0].1.queue, &p[0].1.node, p[0].1.sort) == (&c.queue, &c.node, c.sort))
        {
            Some(p) => p.push((i, c)),
            None => parts.push(vec![(i, c)]),
        }
    }
    let done = join_all(parts.into_iter().map(|p| async move {
        let (at, claims): (Vec<usize>, Vec<Claim>) = p.into_iter().unzip();
        at.into_iter()
            .zip(together(tasks, updates, ahead, claims).await)
            .collect::<Vec<_>>()
    }))
    .await;
    let mut answers: Vec<(usize, Claimed)> = done.into_iter().flatten().collect();
    answers.sort_by_key(|(i, _)| *i);
    answers.into_iter().map(|(_, a)| Turn::Done(a)).collect()
}

/// The claims of one queue by one node: with the tasks read ahead for them when enough
/// are at hand; else a lone claim of a queue not being drained on its own, the others read
/// (with [`READ_AHEAD`] more, kept for the claims to come) and claimed together. One by
/// one when the server takes no `bulkWrite`.
async fn together(tasks: &Collection<Document>, updates: &Updates, ahead: &Ahead, claims: Vec<Claim>) -> Vec<Claimed> {
    if !updates.grouped() {
        return join_all(claims.iter().map(|c| claim_one(tasks, c))).await;
    }
    let first = &claims[0];
    let reader = first.reader();
    let n = claims.len();
    let mut read = ahead.take(&reader, n);
    if read.len() < n {
        if n == 1 && !ahead.busy(&reader) {
            let claimed = claim_one(tasks, first).await;
            if matches!(claimed, Ok(Some(_))) {
                ahead.claimed(&reader);
            }
            return vec![claimed];
        }
        let more = if ahead.fresh_for().is_zero() { 0 } else { READ_AHEAD };
        let sent = std::time::Instant::now();
        read = match read_next(tasks, first, n + more).await {
            Ok(mut docs) => {
                if docs.len() <= n {
                    ahead.hold_off(&reader);
                }
                ahead.keep_at(&reader, docs.split_off(n.min(docs.len())), sent);
                docs
            }
            Err(f) => return each_fails(n, &f),
        };
    }
    if read.is_empty() {
        return claims.iter().map(|_| Ok(None)).collect();
    }
    let until = claims.iter().filter_map(|c| c.until).min();
    let now = DateTime::now();
    let fenced: Vec<FencedUpdate> = read
        .iter()
        .map(|raw| fenced_claim(raw, &first.node, until, now))
        .collect();
    // Which of the claims were made is unknown when the command failed: the error says
    // retrying helps, so the DEN puts back the claims it made (see `den/claims.rs`).
    let made = match updates.apply(fenced).await {
        Ok(made) => made,
        Err(e) => return each_fails(n, &Failure::claims_unknown(e)),
    };
    let mut won = read
        .into_iter()
        .zip(&made)
        .filter(|(_, m)| **m)
        .map(|(raw, _)| as_claimed(raw, &first.node, now));
    if made.iter().any(|m| *m) {
        ahead.claimed(&reader);
    }
    let lost = made.iter().any(|m| !m);
    if lost {
        ahead.forget(&reader);
        ahead.hold_off(&reader);
    }
    let mut answers = Vec::with_capacity(n);
    for c in &claims {
        answers.push(match won.next() {
            Some(raw) => Some(read_claimed(tasks, &raw, &c.node).await),
            None if lost => None,
            None => Some(Ok(None)),
        });
    }
    // The claims a lost read left without a task try again, each on its own.
    let again = claims
        .iter()
        .zip(&answers)
        .filter(|(_, a)| a.is_none())
        .map(|(c, _)| claim_one(tasks, c));
    let mut again = join_all(again).await.into_iter();
    answers
        .into_iter()
        .map(|a| a.unwrap_or_else(|| again.next().unwrap_or(Ok(None))))
        .collect()
}

/// The next `k` tasks `claim` may take, in the queue's order, as stored.
async fn read_next(tasks: &Collection<Document>, claim: &Claim, k: usize) -> Result<Vec<Document>, Failure> {
    let mut options = FindOptions::default();
    options.sort = Some(order(claim.sort));
    options.limit = Some(k as i64);
    let cursor = tasks
        .find(queued(claim.queue, &claim.node))
        .with_options(options)
        .await
        .map_err(|e| Failure::of(db_err("read tasks to claim")(e)))?;
    cursor
        .try_collect()
        .await
        .map_err(|e| Failure::of(classify("read tasks to claim", &e)))
}

/// The claim of the task read as `raw` by `node`, written at `now`: made only while the
/// task is still queued in the queue read, unclaimed and unchanged since the read (its
/// `mtime`, and whether others wait for it), and before
/// `until` by the database's clock when given.
fn fenced_claim(raw: &Document, node: &str, until: Option<DateTime>, now: DateTime) -> FencedUpdate {
    let filter = doc! {
        "_id": raw.get("_id").cloned().unwrap_or(Bson::Null),
        "queue": raw.get("queue").cloned().unwrap_or(Bson::Null),
        "node": unclaimed(),
        "status": status::QUEUED,
        "mtime": raw.get("mtime").cloned().unwrap_or(Bson::Null),
        // Marked as waited for since the read (which leaves `mtime` as it was): claimed
        // anew, so its worker knows to release what waits for it.
        "dependents": raw.get("dependents").cloned().unwrap_or(Bson::Null),
    };
    let filter = before_deadline(filter, until);
    let update = doc! { "$set": { "node": node, "status": status::CLAIMED, "mtime": now } };
    FencedUpdate { filter, update }
}

/// `filter`, matching only while the database's clock is before `until` when given. The
/// deadline is a clause of its own beside the filter (`$and`), not a key of it: a
/// `$expr` at the top of a filter keeps some servers (`secantusd-rs`) from looking the
/// task up by its `_id`, so each fenced claim read the whole collection (25 ms instead of
/// 1.7 ms per claim beside 20,000 tasks).
fn before_deadline(filter: Document, until: Option<DateTime>) -> Document {
    match until {
        Some(until) => doc! { "$and": [filter, { "$expr": { "$lt": ["$$NOW", until] } }] },
        None => filter,
    }
}

/// The task read as `raw` as its claim by `node` at `now` left it.
fn as_claimed(mut raw: Document, node: &str, now: DateTime) -> Document {
    raw.insert("node", node);
    raw.insert("status", status::CLAIMED);
    raw.insert("mtime", now);
    raw
}

/// The failure `f` for each of `n` claims.
fn each_fails(n: usize, f: &Failure) -> Vec<Claimed> {
    (0..n).map(|_| Err(f.error())).collect()
}

/// The tasks of `queue` that `node` may claim.
fn queued(queue: ObjectId, node: &str) -> Document {
    doc! {
        "node": unclaimed(),
        "status": status::QUEUED,
        "queue": queue,
        "$nor": [{ "avoid_node": node, "avoid_until": { "$gt": DateTime::now() } }],
    }
}

/// A queue's claim order.
fn order(sort: Sort) -> Document {
    match sort {
        Sort::Fifo => doc! { "priority": -1, "_id": 1 },
        Sort::Lifo => doc! { "priority": -1, "_id": -1 },
        Sort::Default => doc! { "priority": -1 },
    }
}

/// The spec's claim of one task: one `findOneAndUpdate`.
async fn claim_one(tasks: &Collection<Document>, claim: &Claim) -> Claimed {
    let filter = before_deadline(queued(claim.queue, &claim.node), claim.until);
    let mut options = FindOneAndUpdateOptions::default();
    options.return_document = Some(ReturnDocument::After);
    options.sort = Some(order(claim.sort));
    let claimed = tasks
        .find_one_and_update(
            filter,
            doc! { "$set": { "node": &claim.node, "status": status::CLAIMED, "mtime": DateTime::now() } },
        )
        .with_options(options)
        .await
        .map_err(db_err("claim task"))?;
    match claimed {
        Some(raw) => read_claimed(tasks, &raw, &claim.node).await,
        None => Ok(None),
    }
}

/// The task claimed as `raw`; one that cannot be read is failed (see the module's doc).
async fn read_claimed(tasks: &Collection<Document>, raw: &Document, node: &str) -> Claimed {
    match task_from(raw) {
        Ok(task) => Ok(Some(task)),
        Err(e) => {
            fail_malformed_claim(tasks, raw, node, &e).await;
            Err(e)
        }
    }
}

/// Marks a claimed task that cannot be parsed as failed, so it neither blocks its queue
/// nor stays claimed, and says why in its stderr.
async fn fail_malformed_claim(tasks: &Collection<Document>, raw: &Document, node: &str, reason: &StoreError) {
    let Some(Bson::ObjectId(id)) = raw.get("_id") else {
        return;
    };
    let update = doc! { "$set": {
        "status": status::FAILED,
        "stderr": format!("disbatch: cannot run this task: {reason}"),
        "mtime": DateTime::now(),
    }};
    if let Err(e) = tasks
        .update_one(doc! { "_id": id, "node": node, "status": status::CLAIMED }, update)
        .await
    {
        tracing::warn!(task = %id, error = %e, "could not mark a malformed task failed");
    }
}

//! Updates of a group that make the same kind of change of different tasks go as one
//! `updateMany` of the tasks named by `_id: {$in: …}`, an entry of the group's `bulkWrite`
//! after the others (a command of its own when it is the group's only update), not as one
//! entry per task: the server spends two to four times less per task on one update of many
//! documents. So the claims of a round (`{_id, queue, node: unclaimed, status: -2, mtime,
//! dependents}` as read, before a deadline → `node`, `status: -1`), the starts of a DEN's
//! workers' runs (`{_id, node, status: -1}` → `status: 0`) and the ends of their runs (each
//! with its own status and outputs) go as one update each.
//!
//! An update joins others when it is by its task's `_id` ([`shape`]); its other conditions
//! are equalities with plain values on top-level fields, or conditions on fields it writes
//! (and it may carry a condition on the whole document, `{$and: [filter, {$expr: …}]}`); and
//! it sets top-level fields and `mtime` (and may unset top-level fields). Two join when they
//! have the same conditions but for their plain values, and write the same fields. Each task
//! gets exactly its own update: a condition or a value alike for every task is written once;
//! one that differs is each task's own, chosen by `_id` (in the filter's `$expr`, in a
//! pipeline update; each value a `$literal`). Updates of one call join only when they are of
//! different tasks; an update whose values are large goes on its own, and one `updateMany`
//! carries at most [`MOST_BYTES`] of values and [`MOST_TASKS`] tasks.
//!
//! When the update matched as many tasks as it names, each update's fence held; when fewer,
//! the tasks changed are read back by the values just written (each task's own, `mtime`
//! among them) and the conditions on the fields left alone, and the fence held for those
//! only, as [`MongoStore::change_where`](super::super::MongoStore) does. When the update
//! fails (the server refused one task, or its reply was lost), the tasks it wrote are read
//! back likewise: their updates held, and each other one is made on its own, so a refusal
//! fails its own task alone. A read-back that fails leaves unknown which tasks were
//! written: every update fails as worth retrying, whatever the update's own failure said;
//! each fence makes trying it again safe. (A `bulkWrite` holding an `updateMany` is not
//! retried by the driver after a failover; the DEN retries a start or an end that failed so,
//! and puts back the claims of a round that failed so.)

use bson::{doc, Bson, Document};
use futures::TryStreamExt;
use mongodb::options::{ReadPreference, SelectionCriteria, UpdateModifications};
use mongodb::Collection;

use self::shape::{by_task, holds, literal, shape, task_of, Shape};
use super::{one_call, Call, Failure, FencedUpdate, TOKEN};
use crate::store::mongo::errors::classify;
use crate::store::StoreResult;

/// Most bytes of values one `updateMany` carries (the fields each task's update sets).
const MOST_BYTES: usize = 1 << 20;

/// Most bytes of values of an update that joins others: a larger one (a long output kept
/// inline) goes as an entry of its own.
const MOST_ONE: usize = 64 << 10;

/// Most tasks one `updateMany` changes: its pipeline chooses each task's values among
/// this many.
const MOST_TASKS: usize = 64;

/// An update's place in its group: its call's index and its own index in that call.
pub(super) type Place = (usize, usize);

/// What a group learnt of one update: whether its fence held, a failure, or `None` when it
/// was not tried (an earlier update of the command failed).
pub(super) type Got = Option<Result<bool, Failure>>;

/// The ids of the tasks that match `written` (their ids and the values just written), read
/// from the primary: which tasks an `updateMany` that matched fewer than it named wrote.
pub(in crate::store::mongo) async fn written_ids(
    tasks: &Collection<Document>,
    written: Document,
) -> StoreResult<Vec<Bson>> {
    let primary = SelectionCriteria::ReadPreference(ReadPreference::Primary);
    let back: Vec<Document> = tasks
        .find(written)
        .selection_criteria(primary)
        .projection(doc! { "_id": 1 })
        .await
        .map_err(|e| classify("change tasks: read back", &e))?
        .try_collect()
        .await
        .map_err(|e| classify("change tasks: read back", &e))?;
    Ok(back.into_iter().filter_map(|mut d| d.remove("_id")).collect())
}

/// How a group's updates go: the ones sent as entries of their own (by place, in the
/// calls' order) and the ones joined as updates of many tasks.
pub(super) struct Plan {
    pub each: Vec<Place>,
    pub many: Vec<Many>,
}

/// Updates that join as one `updateMany`: each task's update in parts, and the updates with
/// their places in the group.
pub(super) struct Many {
    members: Vec<Shape>,
    ids: Vec<Bson>,
    at: Vec<Place>,
    updates: Vec<FencedUpdate>,
    bytes: usize,
}

/// What the command that carried a [`Many`] did with it.
pub(super) enum Sent {
    /// Made; it matched this many tasks.
    Made(u64),
    /// Failed: each of its updates fails so.
    Failed(Failure),
    /// Not tried (an earlier update of the command failed).
    NotTried,
}

/// Which of `calls`' updates join (each update of many tasks at least two) and which go as
/// entries of their own.
pub(super) fn plan(calls: &[Call]) -> Plan {
    let mut many: Vec<Many> = Vec::new();
    let mut each = Vec::new();
    // The updates of a task named more than once in the group go as entries of their own,
    // in the calls' order.
    let named: Vec<Bson> = calls.iter().flatten().filter_map(task_of).collect();
    let twice = |id: &Bson| named.iter().filter(|n| *n == id).count() > 1;
    for (i, call) in calls.iter().enumerate() {
        for (j, u) in call.iter().enumerate() {
            let Some(s) = shape(u).filter(|s| !twice(&s.id)) else {
                each.push((i, j));
                continue;
            };
            let joins =
                |m: &&mut Many| m.members[0].joins(&s) && m.bytes + s.bytes <= MOST_BYTES && m.ids.len() < MOST_TASKS;
            match many.iter_mut().find(joins) {
                Some(m) => {
                    m.ids.push(s.id.clone());
                    m.bytes += s.bytes;
                    m.members.push(s);
                    m.at.push((i, j));
                    m.updates.push(u.clone());
                }
                None => many.push(Many {
                    ids: vec![s.id.clone()],
                    bytes: s.bytes,
                    members: vec![s],
                    at: vec![(i, j)],
                    updates: vec![u.clone()],
                }),
            }
        }
    }
    let mut joined = Vec::new();
    for m in many {
        if m.ids.len() < 2 {
            each.extend(m.at);
        } else {
            joined.push(m);
        }
    }
    each.sort_unstable();
    Plan { each, many: joined }
}

impl Many {
    /// The fields of `part` that every task has alike (with their value), and the others.
    fn alike(&self, part: impl Fn(&Shape) -> &Document) -> (Document, Vec<String>) {
        let mut alike = Document::new();
        let mut apart = Vec::new();
        for (k, v) in part(&self.members[0]) {
            if self.members[1..].iter().all(|m| part(m).get(k) == Some(v)) {
                alike.insert(k, v.clone());
            } else {
                apart.push(k.clone());
            }
        }
        (alike, apart)
    }

    /// `base`, and when some task has conditions of its own (`own`: for each task, its
    /// conditions as expressions), those too, each task its own.
    fn with_own(&self, base: Document, own: Vec<Vec<Bson>>) -> Document {
        if own.iter().all(Vec::is_empty) {
            return base;
        }
        let own = by_task(
            &self.ids,
            |i| Bson::Document(doc! { "$and": own[i].clone() }),
            false.into(),
        );
        doc! { "$and": [base, { "$expr": own }] }
    }

    /// The update's filter: each task's own fence.
    pub(super) fn filter(&self) -> Document {
        let (alike, apart) = self.alike(|m| &m.conds);
        let mut base = doc! { "_id": { "$in": self.ids.clone() } };
        base.extend(alike);
        base.extend(self.members[0].fixed.clone());
        let own = self
            .members
            .iter()
            .map(|m| {
                let conds = apart.iter().map(|k| holds(k, m.conds.get(k).unwrap_or(&Bson::Null)));
                conds.chain(m.expr.clone()).collect()
            })
            .collect();
        self.with_own(base, own)
    }

    /// The update: `$set` (and `$unset`) when every task gets the same values; else a
    /// pipeline whose `$set` gives each task its own values.
    pub(super) fn update(&self) -> UpdateModifications {
        let (alike, apart) = self.alike(|m| &m.set);
        let unset = &self.members[0].unset;
        if apart.is_empty() {
            let mut update = doc! { "$set": alike };
            if !unset.is_empty() {
                let unset: Document = unset.iter().map(|k| (k.clone(), Bson::String(String::new()))).collect();
                update.insert("$unset", unset);
            }
            return UpdateModifications::Document(update);
        }
        let mut set: Document = alike.iter().map(|(k, v)| (k.clone(), literal(v))).collect();
        for k in apart {
            let value = |i: usize| literal(self.members[i].set.get(&k).unwrap_or(&Bson::Null));
            set.insert(k.clone(), by_task(&self.ids, value, format!("${k}").into()));
        }
        let mut pipeline = vec![doc! { "$set": set }];
        if !unset.is_empty() {
            pipeline.push(doc! { "$unset": unset.clone() });
        }
        UpdateModifications::Pipeline(pipeline)
    }

    /// Makes the update as a command of its own: what the group learnt of each update.
    pub(super) async fn apply(self, tasks: &Collection<Document>) -> Vec<(Place, Got)> {
        let sent = match tasks.update_many(self.filter(), self.update()).await {
            Ok(r) => Sent::Made(r.matched_count),
            Err(e) => Sent::Failed(Failure::of(classify("change tasks", &e))),
        };
        self.settle(tasks, sent).await
    }

    /// What the group learnt of each update, after `sent`. After the server refused a task
    /// the tasks written are read back: their updates held; each other one is made on its
    /// own, so a task the server refuses fails its own update alone. After a failure that
    /// leaves unknown what was written, each update fails as worth retrying.
    pub(super) async fn settle(self, tasks: &Collection<Document>, sent: Sent) -> Vec<(Place, Got)> {
        let n = self.ids.len();
        let got: Vec<Got> = match sent {
            Sent::NotTried => vec![None; n],
            Sent::Made(count) if count as usize == n => vec![Some(Ok(true)); n],
            Sent::Made(_) => match self.written(tasks).await {
                Ok(w) => w.into_iter().map(|w| Some(Ok(w))).collect(),
                Err(e) => vec![Some(Err(unknown(&e, None))); n],
            },
            // The reply lost, a write concern not met, a failover: which tasks were written
            // is unknown, and a read-back now could not tell (the write may still land, or
            // be rolled back). Each update fails as worth retrying.
            Sent::Failed(f) if f.transient => vec![Some(Err(f)); n],
            // The server refused a task: the others it wrote are read back.
            Sent::Failed(f) => match self.written(tasks).await {
                Ok(written) => return self.each_unwritten(tasks, written).await,
                Err(e) => vec![Some(Err(unknown(&e, Some(&f)))); n],
            },
        };
        self.at.into_iter().zip(got).collect()
    }

    /// The updates whose task is `written` held; each other one made on its own.
    async fn each_unwritten(self, tasks: &Collection<Document>, written: Vec<bool>) -> Vec<(Place, Got)> {
        let each = self
            .at
            .into_iter()
            .zip(self.updates)
            .zip(written)
            .map(|((at, u), w)| async move {
                let got = if w {
                    Ok(true)
                } else {
                    one_call(tasks, vec![u]).await.map(|h| h[0]).map_err(Failure::of)
                };
                (at, Some(got))
            });
        futures::future::join_all(each).await
    }

    /// Which tasks hold the values the update wrote and meet its conditions on the fields it
    /// leaves alone: the ones it wrote.
    async fn written(&self, tasks: &Collection<Document>) -> StoreResult<Vec<bool>> {
        let changed = written_ids(tasks, self.written_filter()).await?;
        Ok(self.ids.iter().map(|id| changed.contains(id)).collect())
    }

    /// The filter of [`Many::written`]: each task's own values written, and its conditions
    /// on the fields the update leaves alone.
    fn written_filter(&self) -> Document {
        let first = &self.members[0];
        if first.set.contains_key(TOKEN) {
            // A token no other write makes tells the tasks written by itself, whatever
            // changed since on the fields the update left alone.
            let (set, apart) = self.alike(|m| &m.set);
            let own = self
                .members
                .iter()
                .map(|m| {
                    apart
                        .iter()
                        .map(|k| holds(k, m.set.get(k).unwrap_or(&Bson::Null)))
                        .collect()
                })
                .collect();
            let mut base = doc! { "_id": { "$in": self.ids.clone() } };
            base.extend(set);
            return self.with_own(base, own);
        }
        let (conds, conds_apart) = self.alike(|m| &m.conds);
        let (set, set_apart) = self.alike(|m| &m.set);
        let mut base = doc! { "_id": { "$in": self.ids.clone() } };
        base.extend(conds.into_iter().filter(|(k, _)| !first.writes(k)));
        base.extend(set);
        let own = self
            .members
            .iter()
            .map(|m| {
                let conds = conds_apart.iter().filter(|k| !first.writes(k)).map(|k| (k, &m.conds));
                let set = set_apart.iter().map(|k| (k, &m.set));
                conds
                    .chain(set)
                    .map(|(k, d)| holds(k, d.get(k).unwrap_or(&Bson::Null)))
                    .collect()
            })
            .collect();
        self.with_own(base, own)
    }
}

/// A read-back that failed (`e`, after the update's failure `f` when it failed): which
/// tasks were written is unknown, so each update may be tried again (its fence makes that
/// safe), whatever the update's own failure said.
fn unknown(e: &crate::store::StoreError, f: Option<&Failure>) -> Failure {
    let what = match f {
        Some(f) => format!("{}; read back: {e}", f.error()),
        None => format!("read back: {e}"),
    };
    Failure::unknown(&what)
}

mod shape;
#[cfg(test)]
mod tests;

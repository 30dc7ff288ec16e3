//! Calls of a group that make the same change of different tasks (a DEN's workers starting
//! their tasks: `{_id, node, status: -1}` → `status: 0`) go as one `updateMany` of the
//! tasks named by `_id: {$in: …}`, an entry of the group's `bulkWrite` after the others (a
//! command of its own when it is the group's only update), not as one entry per task:
//! the server spends two to three times less per task on one update of many documents.
//!
//! A call joins another when it is one update by its task's `_id` whose other conditions
//! are equalities with plain values on top-level fields (not `mtime`), and whose update sets
//! top-level fields only; two join when they differ only in their `_id` and in the `mtime`
//! they write (the group writes its own time). When the update matched as many tasks as it
//! names, each call's fence held; when fewer, the tasks changed are read back by the values
//! just written (`mtime` among them) and the fence held for those only, as
//! [`MongoStore::change_where`](super::super::MongoStore) does.
//!
//! When the update fails (the server refused one task, or its reply was lost), the tasks it
//! wrote are read back likewise: their calls held, and each other call is made on its own,
//! so a refusal fails its own task alone. A read-back that fails leaves unknown which
//! tasks were written: every call fails as worth retrying, whatever the update's own
//! failure said; each call's fence makes trying it again safe. (A `bulkWrite` holding an `updateMany` is not retried by the driver after a
//! failover; the DEN retries a start that failed so.)

use bson::{doc, Bson, DateTime, Document};
use futures::TryStreamExt;
use mongodb::options::{ReadPreference, SelectionCriteria};
use mongodb::Collection;

use super::{one_call, Answer, Call, Failure, FencedUpdate};
use crate::store::group::Turn;
use crate::store::mongo::errors::classify;
use crate::store::StoreResult;

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

/// Calls that join as one `updateMany`: the shared filter (without `_id`) and fields set
/// (`mtime` the group's), the tasks' ids, and the calls with their places in the group.
pub(super) struct Many {
    rest: Document,
    set: Document,
    ids: Vec<Bson>,
    at: Vec<usize>,
    calls: Vec<Call>,
}

/// What the command that carried a [`Many`] did with it.
pub(super) enum Sent {
    /// Made; it matched this many tasks.
    Made(u64),
    /// Failed: each of its calls fails so.
    Failed(Failure),
    /// Not tried (an earlier update of the command failed): its calls go again.
    NotTried,
}

/// The filter without its `_id` and the fields set without `mtime`, when `call` may join
/// others: one update, by `_id`, whose other conditions are equalities with plain values on
/// top-level fields other than `mtime`, setting top-level fields and `mtime` only. (So the
/// tasks an update wrote can be told by the values it wrote, and the caller knows the
/// `mtime` of no task it changed.)
fn shape(call: &Call) -> Option<(Bson, Document, Document)> {
    let [FencedUpdate { filter, update }] = call.as_slice() else {
        return None;
    };
    let plain = |v: &Bson| !matches!(v, Bson::Document(_) | Bson::Array(_));
    let field = |k: &String| !k.starts_with('$') && !k.contains('.');
    let id = filter.get("_id")?;
    let conditions_plain = filter.iter().all(|(k, v)| field(k) && plain(v) && k != "mtime");
    if !plain(id) || !conditions_plain || update.len() != 1 {
        return None;
    }
    let mut set = update.get_document("$set").ok()?.clone();
    set.remove("mtime")?;
    if !set.keys().all(field) {
        return None;
    }
    let mut rest = filter.clone();
    rest.remove("_id");
    Some((id.clone(), rest, set))
}

/// Splits `calls` (their places in the group beside them) into the updates of many tasks
/// (each at least two calls, writing `now` as `mtime`) and the calls left to go one entry
/// each, in their order.
pub(super) fn split(calls: Vec<(usize, Call)>, now: DateTime) -> (Vec<Many>, Vec<(usize, Call)>) {
    let mut many: Vec<Many> = Vec::new();
    let mut left = Vec::new();
    for (at, call) in calls {
        let Some((id, rest, set)) = shape(&call) else {
            left.push((at, call));
            continue;
        };
        match many.iter_mut().find(|m| m.rest == rest && m.set == set) {
            // The same task twice: the second goes on its own.
            Some(m) if m.ids.contains(&id) => left.push((at, call)),
            Some(m) => {
                m.ids.push(id);
                m.at.push(at);
                m.calls.push(call);
            }
            None => many.push(Many {
                rest,
                set,
                ids: vec![id],
                at: vec![at],
                calls: vec![call],
            }),
        }
    }
    let mut joined = Vec::new();
    for mut m in many {
        if m.ids.len() < 2 {
            left.extend(m.at.into_iter().zip(m.calls));
        } else {
            m.set.insert("mtime", now);
            joined.push(m);
        }
    }
    left.sort_by_key(|(at, _)| *at);
    (joined, left)
}

impl Many {
    /// The update's filter.
    pub(super) fn filter(&self) -> Document {
        let mut filter = doc! { "_id": { "$in": self.ids.clone() } };
        filter.extend(self.rest.clone());
        filter
    }

    /// The update.
    pub(super) fn update(&self) -> Document {
        doc! { "$set": self.set.clone() }
    }

    /// Makes the update as a command of its own: each call's place in the group and turn.
    pub(super) async fn apply(self, tasks: &Collection<Document>) -> Vec<(usize, Turn<Call, Answer>)> {
        let sent = match tasks.update_many(self.filter(), self.update()).await {
            Ok(r) => Sent::Made(r.matched_count),
            Err(e) => Sent::Failed(Failure::of(classify("change tasks", &e))),
        };
        self.settle(tasks, sent).await
    }

    /// Each call's place in the group and turn, after `sent`. After a failure the tasks
    /// written are read back: their calls held; each other call is made on its own, so a
    /// task the server refuses fails its own call alone.
    pub(super) async fn settle(self, tasks: &Collection<Document>, sent: Sent) -> Vec<(usize, Turn<Call, Answer>)> {
        let made = match sent {
            Sent::NotTried => {
                return self
                    .at
                    .into_iter()
                    .zip(self.calls.into_iter().map(Turn::Again))
                    .collect()
            }
            Sent::Made(count) if count as usize == self.ids.len() => Ok(vec![true; self.ids.len()]),
            Sent::Made(_) => self.written(tasks).await.map_err(|e| unknown(&e, None)),
            Sent::Failed(f) => match self.written(tasks).await {
                Ok(written) => return self.each_unwritten(tasks, written).await,
                Err(e) => Err(unknown(&e, Some(&f))),
            },
        };
        self.at
            .iter()
            .enumerate()
            .map(|(i, at)| {
                (
                    *at,
                    Turn::Done(made.as_ref().map(|m| vec![m[i]]).map_err(Failure::error)),
                )
            })
            .collect()
    }

    /// The calls whose task is `written` held; each other one made on its own.
    async fn each_unwritten(
        self,
        tasks: &Collection<Document>,
        written: Vec<bool>,
    ) -> Vec<(usize, Turn<Call, Answer>)> {
        let each = self
            .at
            .into_iter()
            .zip(self.calls)
            .zip(written)
            .map(|((at, call), w)| async move {
                let answer = if w { Ok(vec![true]) } else { one_call(tasks, call).await };
                (at, Turn::Done(answer))
            });
        futures::future::join_all(each).await
    }

    /// Which tasks hold the values the update writes: the ones it wrote.
    async fn written(&self, tasks: &Collection<Document>) -> StoreResult<Vec<bool>> {
        let mut written = doc! { "_id": { "$in": self.ids.clone() } };
        for (k, v) in &self.rest {
            if !self.set.contains_key(k) {
                written.insert(k, v.clone());
            }
        }
        written.extend(self.set.clone());
        let changed = written_ids(tasks, written).await?;
        Ok(self.ids.iter().map(|id| changed.contains(id)).collect())
    }
}

/// A read-back that failed (`e`, after the update's failure `f` when it failed): which
/// tasks were written is unknown, so each call may try again (its fence makes that safe),
/// whatever the update's own failure said.
fn unknown(e: &crate::store::StoreError, f: Option<&Failure>) -> Failure {
    let what = match f {
        Some(f) => format!("{}; read back: {e}", f.error()),
        None => format!("read back: {e}"),
    };
    Failure::unknown(&what)
}

#[cfg(test)]
mod tests {
    use bson::doc;

    use super::*;

    fn start(id: i32, node: &str, t: i64) -> Call {
        vec![FencedUpdate {
            filter: doc! { "_id": id, "status": -1, "node": node },
            update: doc! { "$set": { "status": 0, "mtime": DateTime::from_millis(t) } },
        }]
    }

    #[test]
    fn the_same_change_of_different_tasks_joins_whatever_its_time() {
        let finish = vec![FencedUpdate {
            filter: doc! { "_id": 9, "status": 0 },
            update: doc! { "$set": { "status": 1, "stdout": "x", "mtime": DateTime::from_millis(1) } },
        }];
        let calls = vec![
            (0, start(1, "a", 1)),
            (1, finish),
            (2, start(2, "a", 2)),
            (3, start(3, "b", 3)),
            (4, start(1, "a", 4)),
            (5, start(4, "a", 5)),
        ];
        let (many, left) = split(calls, DateTime::from_millis(7));
        assert_eq!(many.len(), 1);
        assert_eq!(many[0].ids, vec![Bson::Int32(1), Bson::Int32(2), Bson::Int32(4)]);
        assert_eq!(many[0].at, vec![0, 2, 5]);
        assert_eq!(many[0].rest, doc! { "status": -1, "node": "a" });
        assert_eq!(
            many[0].set,
            doc! { "status": 0, "mtime": DateTime::from_millis(7) },
            "the group's time"
        );
        let left: Vec<usize> = left.iter().map(|(at, _)| *at).collect();
        assert_eq!(
            left,
            vec![1, 3, 4],
            "another change, a lone one, and a task named twice"
        );
    }

    #[test]
    fn only_plain_changes_by_id_join() {
        let with = |filter: Document, update: Document| vec![FencedUpdate { filter, update }];
        let t = DateTime::from_millis(1);
        let calls = vec![
            (
                0,
                with(doc! { "_id": 1, "$and": [{ "a": 1 }] }, doc! { "$set": { "mtime": t } }),
            ),
            (
                1,
                with(doc! { "_id": 2, "$and": [{ "a": 1 }] }, doc! { "$set": { "mtime": t } }),
            ),
            (
                2,
                with(
                    doc! { "_id": 3 },
                    doc! { "$set": { "mtime": t }, "$unset": { "x": "" } },
                ),
            ),
            (
                3,
                with(
                    doc! { "_id": 4 },
                    doc! { "$set": { "mtime": t }, "$unset": { "x": "" } },
                ),
            ),
            (4, with(doc! { "_id": 5 }, doc! { "$set": { "s": 1 } })),
            (5, with(doc! { "_id": 6 }, doc! { "$set": { "s": 1 } })),
            (6, with(doc! { "_id": { "$in": [7] } }, doc! { "$set": { "mtime": t } })),
            (7, with(doc! { "_id": { "$in": [8] } }, doc! { "$set": { "mtime": t } })),
            // An operator, a dotted path, a fence on `mtime`: not told apart by what is written.
            (
                8,
                with(doc! { "_id": 9, "s": { "$ne": 1 } }, doc! { "$set": { "mtime": t } }),
            ),
            (
                9,
                with(doc! { "_id": 10, "s": { "$ne": 1 } }, doc! { "$set": { "mtime": t } }),
            ),
            (
                10,
                with(
                    doc! { "_id": 11, "stop.action": "x" },
                    doc! { "$set": { "stop": 1, "mtime": t } },
                ),
            ),
            (
                11,
                with(
                    doc! { "_id": 12, "stop.action": "x" },
                    doc! { "$set": { "stop": 1, "mtime": t } },
                ),
            ),
            (
                12,
                with(doc! { "_id": 13 }, doc! { "$set": { "stop.action": 1, "mtime": t } }),
            ),
            (
                13,
                with(doc! { "_id": 14 }, doc! { "$set": { "stop.action": 1, "mtime": t } }),
            ),
            (
                14,
                with(doc! { "_id": 15, "mtime": t }, doc! { "$set": { "mtime": t } }),
            ),
            (
                15,
                with(doc! { "_id": 16, "mtime": t }, doc! { "$set": { "mtime": t } }),
            ),
        ];
        let (many, left) = split(calls, t);
        assert!(many.is_empty());
        assert_eq!(left.len(), 16);
    }
}

use bson::{doc, Bson, DateTime, Document};
use mongodb::options::UpdateModifications;

use super::shape::{by_task, holds, literal};
use super::*;
use crate::store::mongo::bulk::TOKEN;

fn one(filter: Document, update: Document) -> Call {
    vec![FencedUpdate { filter, update }]
}

fn t(ms: i64) -> DateTime {
    DateTime::from_millis(ms)
}

fn start(id: i32, node: &str, at: i64) -> Call {
    one(
        doc! { "_id": id, "status": -1, "node": node },
        doc! { "$set": { "status": 0, "mtime": t(at) } },
    )
}

fn end(id: i32, node: &str, code: i32, out: &str) -> FencedUpdate {
    FencedUpdate {
        filter: doc! { "_id": id, "status": 0, "node": node, "rerun": { "$ne": true } },
        update: doc! {
            "$set": { "status": code, "stdout": out, "stderr": "", "mtime": t(1) },
            "$unset": { "rerun": "" },
        },
    }
}

fn claim(id: i32, read: i64, until: i64) -> FencedUpdate {
    let fence = doc! { "_id": id, "queue": 7, "node": { "$in": [null, -1] }, "status": -2, "mtime": t(read), "dependents": null };
    FencedUpdate {
        filter: doc! { "$and": [fence, { "$expr": { "$lt": ["$$NOW", t(until)] } }] },
        update: doc! { "$set": { "node": "a", "status": -1, "mtime": t(5), TOKEN: 42 } },
    }
}

fn pipeline(m: &Many) -> Vec<Document> {
    match m.update() {
        UpdateModifications::Pipeline(p) => p,
        UpdateModifications::Document(d) => panic!("a plain update: {d}"),
        _ => panic!("another update"),
    }
}

fn ids(v: &[i32]) -> Vec<Bson> {
    v.iter().map(|&i| Bson::Int32(i)).collect()
}

#[test]
fn the_same_change_of_different_tasks_joins_and_each_keeps_its_own_fence_and_time() {
    let other = one(
        doc! { "_id": 9, "status": 0 },
        doc! { "$set": { "status": 1, "x": { "a": 1 }, "mtime": t(1) } },
    );
    let calls = vec![
        start(1, "a", 1),
        other,
        start(2, "a", 2),
        start(3, "b", 3),
        start(1, "a", 4),
        start(4, "a", 5),
    ];
    let p = plan(&calls);
    let [m] = p.many.as_slice() else {
        panic!("one update of many: {:?}", p.each)
    };
    assert_eq!(m.ids, ids(&[2, 3, 4]));
    assert_eq!(m.at, vec![(2, 0), (3, 0), (5, 0)]);
    assert_eq!(
        p.each,
        vec![(0, 0), (1, 0), (4, 0)],
        "a task named twice, in its order, and another change"
    );
    let nodes = by_task(
        &m.ids,
        |i| Bson::Document(doc! { "$and": [holds("node", &["a", "b", "a"][i].into())] }),
        false.into(),
    );
    assert_eq!(
        m.filter(),
        doc! { "$and": [{ "_id": { "$in": ids(&[2, 3, 4]) }, "status": -1 }, { "$expr": nodes }] },
        "the node each task's own"
    );
    let times = by_task(&m.ids, |i| literal(&t([2, 3, 5][i]).into()), "$mtime".into());
    assert_eq!(
        pipeline(m),
        vec![doc! { "$set": { "status": { "$literal": 0 }, "mtime": times } }],
        "each task's own time"
    );
}

#[test]
fn updates_alike_but_for_their_task_are_a_plain_update() {
    let calls = vec![start(1, "a", 1), start(2, "a", 1)];
    let p = plan(&calls);
    let m = &p.many[0];
    assert_eq!(
        m.filter(),
        doc! { "_id": { "$in": ids(&[1, 2]) }, "status": -1, "node": "a" }
    );
    let UpdateModifications::Document(update) = m.update() else {
        panic!("the same values: a plain update")
    };
    assert_eq!(update, doc! { "$set": { "status": 0, "mtime": t(1) } });
}

#[test]
fn ends_with_outputs_of_their_own_join_as_a_pipeline_choosing_by_id() {
    let calls = vec![
        vec![end(1, "a", 1, "one")],
        vec![end(2, "a", 1, "$two")],
        vec![end(3, "a", 2, "one")],
    ];
    let p = plan(&calls);
    assert!(p.each.is_empty());
    let [m] = p.many.as_slice() else { panic!("one update") };
    assert_eq!(
        m.filter(),
        doc! { "_id": { "$in": ids(&[1, 2, 3]) }, "status": 0, "node": "a", "rerun": { "$ne": true } }
    );
    let by = |v: [Bson; 3], k: &str| by_task(&m.ids, |i| literal(&v[i]), format!("${k}").into());
    assert_eq!(
        pipeline(m),
        vec![
            doc! { "$set": {
                "stderr": { "$literal": "" },
                "mtime": { "$literal": t(1) },
                "status": by([1.into(), 1.into(), 2.into()], "status"),
                // A value that looks like a field path stays a value.
                "stdout": by(["one".into(), "$two".into(), "one".into()], "stdout"),
            } },
            doc! { "$unset": ["rerun"] },
        ]
    );
}

#[test]
fn the_tasks_written_are_read_back_by_their_own_values_and_the_fences_on_fields_left_alone() {
    let calls = vec![vec![end(1, "a", 1, "x")], vec![end(2, "a", 1, "y")]];
    let p = plan(&calls);
    let m = &p.many[0];
    let outs = by_task(
        &m.ids,
        |i| Bson::Document(doc! { "$and": [holds("stdout", &["x", "y"][i].into())] }),
        false.into(),
    );
    assert_eq!(
        m.written_filter(),
        doc! { "$and": [
            { "_id": { "$in": ids(&[1, 2]) }, "node": "a", "status": 1, "stderr": "", "mtime": t(1) },
            { "$expr": outs },
        ] },
        "the fences on the status and the rerun mark it writes are left out"
    );
}

#[test]
fn claims_join_each_fenced_on_the_task_as_read_and_its_deadline() {
    let calls = vec![vec![claim(1, 10, 100), claim(2, 11, 100)], vec![claim(3, 12, 90)]];
    let p = plan(&calls);
    assert!(p.each.is_empty());
    let m = &p.many[0];
    let deadline = |u: i64| Bson::Document(doc! { "$lt": ["$$NOW", t(u)] });
    let own = by_task(
        &m.ids,
        |i| {
            let (read, until) = [(10, 100), (11, 100), (12, 90)][i];
            Bson::Document(doc! { "$and": [holds("mtime", &t(read).into()), deadline(until)] })
        },
        false.into(),
    );
    assert_eq!(
        m.filter(),
        doc! { "$and": [
            { "_id": { "$in": ids(&[1, 2, 3]) }, "queue": 7, "status": -2, "dependents": null, "node": { "$in": [null, -1] } },
            { "$expr": own },
        ] }
    );
    let UpdateModifications::Document(update) = m.update() else {
        panic!("the same values: a plain update")
    };
    assert_eq!(
        update,
        doc! { "$set": { "node": "a", "status": -1, "mtime": t(5), TOKEN: 42 } }
    );
    let back = m.written_filter();
    assert_eq!(
        back,
        doc! { "_id": { "$in": ids(&[1, 2, 3]) }, "node": "a", "status": -1, "mtime": t(5), TOKEN: 42 },
        "read back by what the claims wrote, their token among it, and nothing else"
    );
}

#[test]
fn the_end_of_a_run_and_the_claim_beside_it_join_the_others_of_their_kind() {
    let calls = vec![
        vec![end(1, "a", 1, "x"), claim(11, 1, 100)],
        vec![end(2, "a", 1, "y"), claim(12, 2, 100)],
        // One call changing one task twice keeps its order: nothing of it joins; nor does
        // an update of a task another call changes too, joinable or not.
        vec![end(3, "a", 1, "z"), end(3, "a", 1, "z")],
        vec![
            end(4, "a", 1, "z"),
            one(doc! { "_id": 4, "x": { "$exists": true } }, doc! { "$set": { "y": 1 } }).remove(0),
        ],
    ];
    let p = plan(&calls);
    assert_eq!(p.each, vec![(2, 0), (2, 1), (3, 0), (3, 1)]);
    let at: Vec<_> = p.many.iter().map(|m| m.at.clone()).collect();
    assert_eq!(at, vec![vec![(0, 0), (1, 0)], vec![(0, 1), (1, 1)]]);
}

#[test]
fn large_values_go_on_their_own_and_one_update_carries_a_bounded_size() {
    let calls: Vec<Call> = (0..MOST_TASKS + 1).map(|i| vec![end(i as i32, "a", 1, "x")]).collect();
    let p = plan(&calls);
    assert_eq!(p.many.len(), 1, "at most {MOST_TASKS} tasks an update");
    assert_eq!(p.many[0].ids.len(), MOST_TASKS);
    assert_eq!(p.each, vec![(MOST_TASKS, 0)], "the one left over alone");

    let big = "o".repeat(MOST_ONE + 1);
    let part = "p".repeat(MOST_ONE - 400);
    let mut calls = vec![vec![end(1, "a", 1, &big)], vec![end(2, "a", 1, &big)]];
    let n = 2 * MOST_BYTES / MOST_ONE;
    calls.extend((0..n).map(|i| vec![end(10 + i as i32, "a", 1, &part)]));
    let p = plan(&calls);
    assert_eq!(p.each[..2], [(0, 0), (1, 0)], "too large to join");
    assert!(p.many.len() >= 2, "split by size");
    for m in &p.many {
        assert!(m.bytes <= MOST_BYTES);
    }
    let joined: usize = p.many.iter().map(|m| m.ids.len()).sum();
    assert_eq!(joined + p.each.len(), calls.len());
}

#[test]
fn only_changes_told_apart_by_what_they_write_join() {
    let at = t(1);
    let pairs = [
        // A condition that is an operator on a field the update leaves alone.
        (doc! { "_id": 1, "s": { "$ne": 1 } }, doc! { "$set": { "mtime": at } }),
        // A clause of conditions other than a condition on the whole document.
        (
            doc! { "_id": 1, "$and": [{ "a": 1 }] },
            doc! { "$set": { "mtime": at } },
        ),
        (
            doc! { "$and": [{ "_id": 1 }, { "a": 1 }] },
            doc! { "$set": { "mtime": at } },
        ),
        // Another operator than `$set` and `$unset`.
        (doc! { "_id": 1 }, doc! { "$set": { "mtime": at }, "$inc": { "x": 1 } }),
        // No time written.
        (doc! { "_id": 1 }, doc! { "$set": { "s": 1 } }),
        // Not by `_id`.
        (doc! { "_id": { "$in": [1] } }, doc! { "$set": { "mtime": at } }),
        // A dotted path, written or fenced on.
        (
            doc! { "_id": 1, "stop.action": "x" },
            doc! { "$set": { "s": 1, "mtime": at } },
        ),
        (doc! { "_id": 1 }, doc! { "$set": { "stop.action": 1, "mtime": at } }),
        (
            doc! { "_id": 1 },
            doc! { "$set": { "mtime": at }, "$unset": { "stop.action": "" } },
        ),
    ];
    for (filter, update) in pairs {
        let second = Document::from_iter(filter.iter().map(|(k, v)| match k.as_str() {
            "_id" => (k.clone(), Bson::Int32(2)),
            _ => (k.clone(), v.clone()),
        }));
        let calls = vec![one(filter.clone(), update.clone()), one(second, update.clone())];
        let p = plan(&calls);
        assert!(p.many.is_empty(), "{filter} {update}");
        assert_eq!(p.each.len(), 2);
    }
    // An operator or a dotted path on a field the update writes is not needed to tell the
    // tasks written, nor a fence on the time as read: those join.
    let written = (
        doc! { "_id": 1, "stop.action": { "$ne": "kill" }, "rerun": { "$ne": true }, "mtime": at },
        doc! { "$set": { "stop": 1, "mtime": at }, "$unset": { "rerun": "" } },
    );
    let mut second = written.0.clone();
    second.insert("_id", 2);
    second.insert("mtime", t(2));
    let calls = vec![one(written.0.clone(), written.1.clone()), one(second, written.1)];
    assert_eq!(plan(&calls).many.len(), 1);
}

#[test]
fn a_task_is_chosen_by_its_id_as_a_value_even_one_that_looks_like_a_field_path() {
    let chosen = by_task(&[Bson::String("$_id".into())], |_| true.into(), false.into());
    assert_eq!(
        chosen,
        Bson::Document(doc! { "$switch": {
            "branches": [{ "case": { "$eq": ["$_id", { "$literal": "$_id" }] }, "then": true }],
            "default": false,
        } })
    );
}

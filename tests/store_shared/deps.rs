//! Dependencies on both stores: a blocked task is never claimed; the end of what it waits
//! for releases it (only once every parent succeeded) or cancels it naming the parent,
//! down the chain; two parents ending at once never leave it blocked; an end no DEN
//! settled is found by the leader's sweep; a batch releases its fan-in.

use disbatch::lifecycle::deps::{self, Outcome};
use disbatch::store::{Dependency, NewTask, OutputValue, PendingChange, Resolved};

use super::*;

on_both_stores!(
    a_child_runs_only_after_every_parent_succeeded,
    a_failed_parent_cancels_down_the_chain_unless_told_to_run,
    parents_ending_at_once_release_their_child_once,
    the_sweep_settles_ends_no_den_settled,
    a_batch_releases_its_fan_in_when_complete,
    a_parent_submitted_again_while_it_runs_holds_its_children,
    pending_changes_only_from_the_list_read,
    a_batch_keeps_the_first_size_given,
);

fn after(id: ObjectId, deps: &[Dependency], dependents: bool) -> NewTask {
    NewTask {
        after: deps.to_vec(),
        dependents,
        ..NewTask::queued(id, doc! {})
    }
}

/// Runs `id` (claimed by the next claim of `q`) to `code` on `s` and settles its end as
/// the DEN does.
async fn run_to(s: &dyn Store, q: &Queue, id: ObjectId, code: i32) {
    let t = s.claim(q, "n").await.unwrap().expect("a task to claim");
    assert_eq!(t.id, id, "the task claimed");
    assert!(disbatch::lifecycle::run::start(s, t.id, "n").await.unwrap());
    let out = OutputValue::Inline(String::new());
    assert!(disbatch::lifecycle::run::finish(s, t.id, "n", code, out.clone(), out)
        .await
        .unwrap());
    deps::task_ended(s, t.id, t.dependents, t.batch.as_deref())
        .await
        .unwrap();
}

async fn a_child_runs_only_after_every_parent_succeeded(s: Stores) {
    let q = queue(&*s.a, "dag", 4, Sort::Fifo).await;
    let (p1, p2, c) = (ObjectId::new(), ObjectId::new(), ObjectId::new());
    let deps = [Dependency::Task(p1), Dependency::Task(p2)];
    // The child is inserted first: it would be claimed first were it not blocked.
    s.a.insert_tasks(
        q.id,
        vec![after(c, &deps, false), after(p1, &[], true), after(p2, &[], true)],
    )
    .await
    .unwrap();
    let child = task(&*s.b, c).await;
    assert_eq!(child.status, status::BLOCKED);
    assert_eq!(child.after, vec![p1.to_hex(), p2.to_hex()]);
    assert_eq!(child.pending, child.after);
    assert!(task(&*s.b, p1).await.dependents);
    // Found as their child.
    let children = TaskFilter {
        after: Some(Dependency::Task(p2)),
        ..Default::default()
    };
    let page = Page {
        limit: 10,
        ..Default::default()
    };
    let found = s.b.find_tasks(&children, page).await.unwrap();
    assert_eq!(found.iter().map(|t| t.id).collect::<Vec<_>>(), [c]);
    run_to(&*s.a, &q, p1, status::SUCCEEDED).await;
    let child = task(&*s.b, c).await;
    assert_eq!(child.status, status::BLOCKED, "one parent of two succeeded");
    assert_eq!(child.pending, vec![p2.to_hex()]);
    assert_eq!(child.after.len(), 2, "what it was submitted after is kept");
    assert!(!task(&*s.b, p1).await.dependents, "p1's end is settled");
    run_to(&*s.b, &q, p2, status::SUCCEEDED).await;
    assert!(s.a.claim(&q, "n").await.unwrap().is_some_and(|t| t.id == c));
    let child = task(&*s.a, c).await;
    assert_eq!(child.status, status::CLAIMED, "both parents succeeded: claimable");
    assert!(child.pending.is_empty());
}

async fn a_failed_parent_cancels_down_the_chain_unless_told_to_run(s: Stores) {
    let q = queue(&*s.a, "chain", 4, Sort::Fifo).await;
    let (p, c, g, anyway) = (ObjectId::new(), ObjectId::new(), ObjectId::new(), ObjectId::new());
    let mut runs = after(anyway, &[Dependency::Task(p)], false);
    runs.after_failure_runs = true;
    s.a.insert_tasks(
        q.id,
        vec![
            after(p, &[], true),
            after(c, &[Dependency::Task(p)], true),
            after(g, &[Dependency::Task(c)], false),
            runs,
        ],
    )
    .await
    .unwrap();
    run_to(&*s.a, &q, p, status::FAILED).await;
    let child = task(&*s.b, c).await;
    assert_eq!(child.status, status::CANCELLED);
    let stop = child.stop.expect("the reason is recorded");
    assert!(
        stop.reason.contains(&p.to_hex()) && stop.reason.contains("failed"),
        "{}",
        stop.reason
    );
    let grandchild = task(&*s.b, g).await;
    assert_eq!(grandchild.status, status::CANCELLED, "the cancel goes down the chain");
    assert!(grandchild.stop.unwrap().reason.contains(&c.to_hex()));
    assert_eq!(task(&*s.b, anyway).await.status, status::QUEUED, "after_failure: run");
    // A cancelled child is settled once: resolving again finds nothing to do.
    let stop = disbatch::model::StopRequest::now(disbatch::model::StopAction::Cancel, "t", "x");
    assert_eq!(
        deps::resolve(&*s.a, c, &Dependency::Task(p), Some(&stop))
            .await
            .unwrap(),
        Resolved::Gone
    );
}

async fn parents_ending_at_once_release_their_child_once(s: Stores) {
    let q = queue(&*s.a, "fan-in", 64, Sort::Fifo).await;
    let parents: Vec<ObjectId> = (0..24).map(|_| ObjectId::new()).collect();
    let c = ObjectId::new();
    let deps: Vec<Dependency> = parents.iter().copied().map(Dependency::Task).collect();
    let mut tasks: Vec<NewTask> = parents.iter().map(|p| after(*p, &[], true)).collect();
    tasks.push(after(c, &deps, false));
    s.a.insert_tasks(q.id, tasks).await.unwrap();
    for p in &parents {
        let t = s.a.claim(&q, "n").await.unwrap().unwrap();
        assert_eq!(t.id, *p);
        disbatch::lifecycle::run::start(&*s.a, t.id, "n").await.unwrap();
        let out = OutputValue::Inline(String::new());
        assert!(disbatch::lifecycle::run::finish(&*s.a, t.id, "n", 1, out.clone(), out)
            .await
            .unwrap());
    }
    // Every parent's end settled at once, half through each store handle.
    let settles: Vec<_> = parents
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let store = if i % 2 == 0 { s.a.clone() } else { s.b.clone() };
            let p = *p;
            tokio::spawn(async move { deps::settle(&*store, Dependency::Task(p), Outcome::Met).await.unwrap() })
        })
        .collect();
    let mut released = 0;
    for h in settles {
        released += h.await.unwrap().released;
    }
    assert_eq!(released, 1, "the child is released once");
    assert_eq!(task(&*s.b, c).await.status, status::QUEUED);
}

async fn the_sweep_settles_ends_no_den_settled(s: Stores) {
    let q = queue(&*s.a, "sweep", 4, Sort::Fifo).await;
    let (p, c) = (ObjectId::new(), ObjectId::new());
    s.a.insert_tasks(
        q.id,
        vec![after(p, &[], false), after(c, &[Dependency::Task(p)], false)],
    )
    .await
    .unwrap();
    // The parent gained its child after it was claimed: the DEN's copy is not marked.
    let claimed = s.a.claim(&q, "n").await.unwrap().unwrap();
    assert!(!claimed.dependents);
    s.a.mark_dependents(&[Dependency::Task(p)]).await.unwrap();
    assert!(
        s.a.unsettled(10).await.unwrap().is_empty(),
        "a running parent is not an end"
    );
    disbatch::lifecycle::run::start(&*s.a, p, "n").await.unwrap();
    let out = OutputValue::Inline(String::new());
    assert!(disbatch::lifecycle::run::finish(&*s.a, p, "n", 1, out.clone(), out)
        .await
        .unwrap());
    deps::task_ended(&*s.a, p, claimed.dependents, None).await.unwrap();
    assert_eq!(task(&*s.b, c).await.status, status::BLOCKED, "the DEN did not know");
    assert_eq!(s.b.unsettled(10).await.unwrap(), vec![Dependency::Task(p)]);
    let swept = deps::sweep(&*s.b).await.unwrap();
    assert_eq!(swept.released, 1);
    assert_eq!(task(&*s.a, c).await.status, status::QUEUED);
    assert!(s.b.unsettled(10).await.unwrap().is_empty(), "settled once");
    // A blocked task cancelled by hand is settled by the sweep too: its child is cancelled.
    let (h, hc) = (ObjectId::new(), ObjectId::new());
    s.a.insert_tasks(
        q.id,
        vec![
            after(h, &[Dependency::Task(c)], true),
            after(hc, &[Dependency::Task(h)], false),
        ],
    )
    .await
    .unwrap();
    let stop = disbatch::model::StopRequest::now(disbatch::model::StopAction::Cancel, "op", "no longer needed");
    let cancelled = disbatch::lifecycle::run::cancel_tasks(&*s.a, disbatch::store::TaskTarget::Task(h), &stop)
        .await
        .unwrap();
    assert_eq!(cancelled, vec![h], "a blocked task can be cancelled");
    deps::sweep(&*s.b).await.unwrap();
    let t = task(&*s.a, hc).await;
    assert_eq!(t.status, status::CANCELLED);
    assert!(t.stop.unwrap().reason.contains(&h.to_hex()));
}

async fn a_batch_releases_its_fan_in_when_complete(s: Stores) {
    let q = queue(&*s.a, "batch-fan-in", 8, Sort::Fifo).await;
    disbatch::lifecycle::batches::open_batch(&*s.a, "nightly", Some(3))
        .await
        .unwrap();
    let members: Vec<NewTask> = (0..2)
        .map(|_| NewTask {
            batch: Some("nightly".into()),
            ..NewTask::queued(ObjectId::new(), doc! {})
        })
        .collect();
    let ids: Vec<ObjectId> = members.iter().map(|t| t.id).collect();
    s.a.insert_tasks(q.id, members).await.unwrap();
    let fan_in = ObjectId::new();
    let dep = Dependency::Batch("nightly".into());
    s.a.insert_tasks(q.id, vec![after(fan_in, std::slice::from_ref(&dep), false)])
        .await
        .unwrap();
    deps::submitted(&*s.a, std::slice::from_ref(&dep)).await.unwrap();
    assert!(s.b.batch("nightly").await.unwrap().unwrap().dependents);
    for id in &ids {
        run_to(&*s.a, &q, *id, 1).await;
    }
    assert_eq!(
        task(&*s.b, fan_in).await.status,
        status::BLOCKED,
        "2 of the batch's 3 tasks: not complete"
    );
    let last = NewTask {
        batch: Some("nightly".into()),
        ..NewTask::queued(ObjectId::new(), doc! {})
    };
    let last_id = last.id;
    s.a.insert_tasks(q.id, vec![last]).await.unwrap();
    run_to(&*s.b, &q, last_id, 1).await;
    assert_eq!(task(&*s.a, fan_in).await.status, status::QUEUED, "the batch completed");
    assert!(!s.a.batch("nightly").await.unwrap().unwrap().dependents);
}

async fn a_parent_submitted_again_while_it_runs_holds_its_children(s: Stores) {
    let q = queue(&*s.a, "rerun", 4, Sort::Fifo).await;
    let (p, c) = (ObjectId::new(), ObjectId::new());
    s.a.insert_tasks(q.id, vec![after(p, &[], true), after(c, &[Dependency::Task(p)], false)])
        .await
        .unwrap();
    let t = s.a.claim(&q, "n").await.unwrap().unwrap();
    assert!(disbatch::lifecycle::run::start(&*s.a, t.id, "n").await.unwrap());
    assert!(
        disbatch::lifecycle::retry::request_rerun(&*s.b, p).await.unwrap(),
        "submitted again while it runs"
    );
    // This run fails, but the task runs once more: its child neither runs nor is cancelled.
    let out = OutputValue::Inline(String::new());
    assert!(
        disbatch::lifecycle::run::finish(&*s.a, p, "n", status::FAILED, out.clone(), out)
            .await
            .unwrap()
    );
    deps::task_ended(&*s.a, p, t.dependents, None).await.unwrap();
    assert_eq!(task(&*s.b, p).await.status, status::QUEUED, "queued for its next run");
    assert_eq!(task(&*s.b, c).await.status, status::BLOCKED);
    run_to(&*s.a, &q, p, status::SUCCEEDED).await;
    assert_eq!(task(&*s.b, c).await.status, status::QUEUED, "its last run succeeded");
}

/// The store's compare-and-set on a blocked task's `pending` list: applied only while the
/// task is blocked and waits for exactly the list given (as read), each change as
/// named; nothing written otherwise.
async fn pending_changes_only_from_the_list_read(s: Stores) {
    let q = queue(&*s.a, "pending-cas", 2, Sort::Fifo).await;
    let (p1, p2, c, d) = (ObjectId::new(), ObjectId::new(), ObjectId::new(), ObjectId::new());
    let deps = [Dependency::Task(p1), Dependency::Task(p2)];
    s.a.insert_tasks(q.id, vec![after(c, &deps, false), after(d, &deps, false)])
        .await
        .unwrap();
    let (k1, k2) = (p1.to_hex(), p2.to_hex());
    let met = PendingChange::Met(&deps[0]);
    assert!(
        !s.a.resolve_pending(c, std::slice::from_ref(&k2), met).await.unwrap(),
        "not the list it waits for"
    );
    assert_eq!(
        task(&*s.b, c).await.pending,
        vec![k1.clone(), k2.clone()],
        "nothing written"
    );
    assert!(
        s.a.resolve_pending(c, &[k1.clone(), k2.clone()], met).await.unwrap(),
        "the list as read"
    );
    assert_eq!(task(&*s.b, c).await.pending, vec![k2.clone()]);
    assert!(
        !s.b.resolve_pending(c, &[k1.clone(), k2.clone()], met).await.unwrap(),
        "a second change from the same read is refused"
    );
    assert!(s
        .b
        .resolve_pending(c, std::slice::from_ref(&k2), PendingChange::Release(status::SCHEDULED))
        .await
        .unwrap());
    let released = task(&*s.a, c).await;
    assert_eq!((released.status, released.pending.len()), (status::SCHEDULED, 0));
    assert!(
        !s.a.resolve_pending(c, &[], PendingChange::Release(status::QUEUED))
            .await
            .unwrap(),
        "no longer blocked"
    );
    let stop = disbatch::model::StopRequest::now(disbatch::model::StopAction::Cancel, "t", "why");
    assert!(s
        .a
        .resolve_pending(
            d,
            &[k1.clone(), k2.clone()],
            PendingChange::Stop(status::CANCELLED, &stop)
        )
        .await
        .unwrap());
    let stopped = task(&*s.b, d).await;
    assert_eq!(stopped.status, status::CANCELLED);
    assert_eq!(stopped.stop.unwrap().reason, "why");
    assert_eq!(stopped.pending, vec![k1, k2], "the list is kept");
}

/// A batch is recorded once; its size is set only while it has none.
async fn a_batch_keeps_the_first_size_given(s: Stores) {
    assert!(s.a.insert_batch("b1", None).await.unwrap());
    assert!(!s.b.insert_batch("b1", Some(5)).await.unwrap(), "recorded once");
    assert_eq!(s.b.batch("b1").await.unwrap().unwrap().size, None);
    assert!(s.b.set_batch_size_if_unset("b1", 3).await.unwrap());
    assert!(!s.a.set_batch_size_if_unset("b1", 4).await.unwrap());
    assert_eq!(s.a.batch("b1").await.unwrap().unwrap().size, Some(3));
    assert!(!s.a.set_batch_size_if_unset("none", 4).await.unwrap(), "no such batch");
    let opened = disbatch::lifecycle::batches::open_batch(&*s.b, "b1", Some(7))
        .await
        .unwrap();
    assert_eq!(opened.size, Some(3), "the first size given wins");
    let fresh = disbatch::lifecycle::batches::open_batch(&*s.b, "b2", Some(2))
        .await
        .unwrap();
    assert_eq!((fresh.id.as_str(), fresh.size), ("b2", Some(2)));
}

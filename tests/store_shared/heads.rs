//! The reads orphan recovery decides on: task heads selected by status, node and `mtime`,
//! and the slots a set of nodes holds, on both stores.

use super::*;
use disbatch::lifecycle::machine;
use disbatch::model::{StopAction, StopRequest};
use disbatch::store::{HeadFilter, HeadNode, TaskHead, TaskTarget};

on_both_stores!(
    task_heads_select_by_status_node_and_mtime,
    slots_held_by_reads_a_nodes_slots_in_every_queue,
);

fn ids(heads: &[TaskHead]) -> HashSet<ObjectId> {
    heads.iter().map(|h| h.id).collect()
}

async fn task_heads_select_by_status_node_and_mtime(s: Stores) {
    let q = queue(&*s.a, "heads", 4, Sort::Fifo).await;
    s.a.create_tasks(q.id, vec![doc! {}; 4]).await.unwrap();
    let running = claim_run(&*s.a, &q, "a").await;
    let claimed = s.a.claim(&q, "b").await.unwrap().expect("a task").id;
    let stop = StopRequest::now(StopAction::Kill, "ops", "stop it");
    let asked = disbatch::lifecycle::run::request_kill(&*s.a, TaskTarget::Task(running), &stop)
        .await
        .unwrap();
    assert_eq!(asked, vec![running]);

    let busy = |node: HeadNode, mtime_before: Option<DateTime>| HeadFilter {
        statuses: status::BUSY.to_vec(),
        node,
        mtime_before,
    };
    let all = s.b.task_heads(&busy(HeadNode::Any, None), 100).await.unwrap();
    assert_eq!(ids(&all), HashSet::from([running, claimed]));
    let head = all.iter().find(|h| h.id == running).unwrap();
    assert_eq!(head.queue, Some(q.id));
    assert_eq!((head.status, head.node.as_deref()), (status::RUNNING, Some("a")));
    assert!(head.kill, "asked to kill: {head:?}");
    assert_eq!(head.priority, 0);
    assert!(head.attempts.is_empty());
    let other = all.iter().find(|h| h.id == claimed).unwrap();
    assert_eq!(
        (other.status, other.node.as_deref(), other.kill),
        (status::CLAIMED, Some("b"), false)
    );

    let of = |node: HeadNode| busy(node, None);
    let heads = |f: HeadFilter| {
        let b = s.b.clone();
        async move { ids(&b.task_heads(&f, 100).await.unwrap()) }
    };
    assert_eq!(heads(of(HeadNode::Is("a".into()))).await, HashSet::from([running]));
    assert_eq!(
        heads(of(HeadNode::NoneOf(vec!["a".into()]))).await,
        HashSet::from([claimed])
    );
    assert_eq!(
        heads(of(HeadNode::NoneOf(vec![]))).await,
        HashSet::from([running, claimed])
    );
    assert_eq!(
        heads(of(HeadNode::NoneOf(vec!["a".into(), "b".into()]))).await,
        HashSet::new()
    );
    assert_eq!(heads(busy(HeadNode::Any, Some(ago(3_600_000)))).await, HashSet::new());
    let later = DateTime::from_millis(DateTime::now().timestamp_millis() + 60_000);
    assert_eq!(heads(busy(HeadNode::Any, Some(later))).await.len(), 2);
    // Unclaimed tasks have no node: none of any names.
    let queued = HeadFilter {
        statuses: vec![status::QUEUED],
        node: HeadNode::NoneOf(vec!["a".into()]),
        mtime_before: None,
    };
    assert_eq!(heads(queued.clone()).await.len(), 2);
    let one = s.b.task_heads(&queued, 1).await.unwrap();
    assert_eq!(one.len(), 1, "at most `limit` heads");
    assert!(one[0].node.is_none());

    // A head's status, node and mtime fence a change as read; once the task moved on they
    // no longer hold.
    let fence = machine::orphan_as_read(other.status, other.node.as_deref(), other.mtime);
    let entry = [(claimed, fence, machine::orphan(None))];
    assert_eq!(s.a.change_tasks(&entry).await.unwrap(), vec![true]);
    assert_eq!(task(&*s.a, claimed).await.status, status::ORPHANED);
    assert_eq!(s.a.change_tasks(&entry).await.unwrap(), vec![false], "it moved on");
    let stale = machine::orphan_as_read(head.status, head.node.as_deref(), Some(ago(3_600_000)));
    let entry = [(running, stale, machine::orphan(None))];
    assert_eq!(s.a.change_tasks(&entry).await.unwrap(), vec![false], "another mtime");
    assert_eq!(task(&*s.a, running).await.status, status::RUNNING);
}

async fn slots_held_by_reads_a_nodes_slots_in_every_queue(s: Stores) {
    let q1 = queue(&*s.a, "held-1", 2, Sort::Fifo).await;
    let q2 = queue(&*s.a, "held-2", 1, Sort::Fifo).await;
    for (q, node) in [(&q1, "a"), (&q2, "a"), (&q1, "b")] {
        disbatch::lifecycle::slots::acquire_slot(&*s.a, q, node, LEASE)
            .await
            .unwrap()
            .expect("a free slot");
    }
    let held = s.b.slots_held_by(&["a".to_string()]).await.unwrap();
    let queues: HashSet<ObjectId> = held.iter().map(|(q, _)| *q).collect();
    assert_eq!(queues, HashSet::from([q1.id, q2.id]));
    assert_eq!(held.len(), 2);
    assert!(held
        .iter()
        .all(|(_, r)| r.holder.as_deref() == Some("a") && r.expires > DateTime::now()));
    let both = s.b.slots_held_by(&["a".to_string(), "b".to_string()]).await.unwrap();
    assert_eq!(both.len(), 3);
    assert!(s.b.slots_held_by(&[]).await.unwrap().is_empty());
    assert!(s.b.slots_held_by(&["nobody".to_string()]).await.unwrap().is_empty());
}

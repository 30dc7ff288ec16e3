use bson::doc;

use super::*;
use crate::store::{NodeIs, Write};

fn head(node: Option<&str>, kill: bool, runs: usize) -> TaskHead {
    let run = Attempt {
        node: node.map(str::to_owned),
        started: None,
        ended: DateTime::from_millis(0),
        status: status::FAILED,
        reason: "failed".into(),
        stdout: None,
        stderr: None,
    };
    TaskHead {
        id: ObjectId::new(),
        queue: Some(ObjectId::new()),
        status: status::RUNNING,
        node: node.map(str::to_owned),
        mtime: Some(DateTime::from_millis(5_000)),
        kill,
        priority: 3,
        attempts: vec![run; runs],
    }
}

fn retrying(attempts: u32) -> RetryPolicy {
    RetryPolicy::from_bson(&doc! { "attempts": attempts, "on": ["orphaned"] }.into()).unwrap()
}

#[test]
fn an_orphan_is_changed_only_as_it_was_read() {
    let h = head(Some("dead"), false, 0);
    let (how, fence, change) = decide(&h, &(OnOrphan::Orphan, None), DateTime::now());
    assert_eq!(how, Recover::Orphan(None));
    assert_eq!(fence.statuses, Some(vec![status::RUNNING]));
    assert_eq!(fence.node, NodeIs::Node("dead".into()));
    assert_eq!(fence.mtime, h.mtime);
    assert_eq!(
        (change.status, change.rerun, change.touch),
        (Some(status::ORPHANED), Some(false), true)
    );
    assert!(change.attempt.is_none() && change.node.is_keep());
    let unclaimed = TaskHead { node: None, ..h };
    let (_, fence, _) = decide(&unclaimed, &(OnOrphan::Orphan, None), DateTime::now());
    assert_eq!(fence.node, NodeIs::Unclaimed);
}

#[test]
fn on_orphan_requeue_puts_it_back_unless_someone_asked_to_kill_it() {
    let policy = (OnOrphan::Requeue, None);
    let (how, _, change) = decide(&head(Some("dead"), false, 0), &policy, DateTime::now());
    assert_eq!(how, Recover::Requeue);
    assert_eq!((change.status, change.node), (Some(status::QUEUED), Write::Clear));
    let (how, _, change) = decide(&head(Some("dead"), true, 0), &policy, DateTime::now());
    assert_eq!(how, Recover::Orphan(None));
    assert_eq!(change.status, Some(status::ORPHANED));
}

#[test]
fn a_retry_policy_counts_the_runs_made_and_records_the_orphaned_run() {
    let policy = (OnOrphan::Requeue, Some(retrying(2)));
    let (how, _, change) = decide(&head(Some("dead"), false, 0), &policy, DateTime::now());
    assert!(matches!(how, Recover::Retry(_)), "{how:?}");
    assert_eq!(change.node, Write::Clear);
    let record = change.attempt.expect("the orphaned run's record");
    assert_eq!(
        (record.status, record.node.as_deref()),
        (status::ORPHANED, Some("dead"))
    );
    // The policy's attempts are spent: orphaned, with the record, whatever `on_orphan` says.
    let (how, _, change) = decide(&head(Some("dead"), false, 1), &policy, DateTime::now());
    assert!(matches!(how, Recover::Orphan(Some(_))), "{how:?}");
    assert_eq!(change.status, Some(status::ORPHANED));
    assert!(change.attempt.is_some());
    // Asked to kill: never retried.
    let (how, _, _) = decide(&head(Some("dead"), true, 0), &policy, DateTime::now());
    assert!(matches!(how, Recover::Orphan(Some(_))), "{how:?}");
}

#[test]
fn nodes_are_fresh_from_the_stale_cut_on() {
    let node = |name: &str, at: i64| Node {
        id: ObjectId::new(),
        node: name.into(),
        timestamp: DateTime::from_millis(at),
        maxthreads: None,
        stats: None,
        process: None,
        queue_problems: Default::default(),
        problem: None,
    };
    let nodes = [
        node("old", 999),
        node("cut", 1_000),
        node("new", 2_000),
        node("unreadable", 0),
    ];
    let (fresh, stale) = by_freshness(&nodes, DateTime::from_millis(1_000));
    assert_eq!(fresh, vec!["cut", "new"]);
    assert_eq!(stale, vec!["old", "unreadable"]);
}

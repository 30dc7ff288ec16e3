//! Node documents written through [`Store::change_node`]: a change touches an existing
//! node only, and a process fence holds while that process holds the name.

use super::*;
use disbatch::lifecycle::nodes;
use disbatch::store::{NodeChange, NodeFence};

on_both_stores!(
    a_nodes_stats_and_problems_are_written_only_to_its_document,
    a_process_fence_holds_only_for_the_process_holding_the_name,
    a_take_is_fenced_on_the_document_as_read,
);

/// The node named `name`, if it has a document.
async fn node(store: &dyn Store, name: &str) -> Option<disbatch::model::Node> {
    store.node(name).await.unwrap().map(|r| r.node)
}

async fn a_nodes_stats_and_problems_are_written_only_to_its_document(s: Stores) {
    let mut stats = NodeStats::default();
    stats.run.observe(1.5);
    let problems = std::collections::BTreeMap::from([("q".to_string(), "no plugin".to_string())]);
    assert!(
        !nodes::report_stats(&*s.a, "ghost", &stats).await.unwrap(),
        "no node document: nothing to write to"
    );
    assert!(!nodes::report_queue_problems(&*s.a, "ghost", &problems).await.unwrap());
    assert_eq!(node(&*s.a, "ghost").await, None);
    // A node that appears later starts clean: nothing was kept for it.
    let n = s.b.heartbeat("ghost", LEASE).await.unwrap();
    assert_eq!((n.stats.as_ref(), n.queue_problems.len()), (None, 0));
    let read = node(&*s.a, "ghost").await.expect("the node once it heartbeats");
    assert_eq!((read.stats, read.queue_problems.len()), (None, 0));
    assert!(nodes::report_stats(&*s.a, "ghost", &stats).await.unwrap());
    assert_eq!(node(&*s.b, "ghost").await.unwrap().stats, Some(stats));
}

async fn a_process_fence_holds_only_for_the_process_holding_the_name(s: Stores) {
    let stale_before = DateTime::from_millis(DateTime::now().timestamp_millis() - 60_000);
    let (p1, p2) = (NodeProcess::this_process(), NodeProcess::this_process());
    assert_eq!(
        disbatch::lifecycle::nodes::take(&*s.a, "n", &p1, stale_before)
            .await
            .unwrap(),
        None
    );
    let held_by = |p: &NodeProcess| NodeFence::HeldBy(p.id);

    assert!(
        !s.b.change_node("n", held_by(&p2), NodeChange::Maxthreads(Some(4)))
            .await
            .unwrap(),
        "another process's fence does not hold"
    );
    assert_eq!(node(&*s.a, "n").await.unwrap().maxthreads, None, "and nothing changed");
    assert!(!nodes::release(&*s.b, "n", p2.id).await.unwrap());
    assert_eq!(node(&*s.a, "n").await.unwrap().process.as_ref(), Some(&p1));

    assert!(s
        .b
        .change_node("n", held_by(&p1), NodeChange::Maxthreads(Some(4)))
        .await
        .unwrap());
    assert_eq!(node(&*s.a, "n").await.unwrap().maxthreads, Some(4));
    assert!(nodes::release(&*s.b, "n", p1.id).await.unwrap());
    assert_eq!(node(&*s.a, "n").await.unwrap().process, None, "released");
    assert!(
        !nodes::release(&*s.a, "n", p1.id).await.unwrap(),
        "a released name is no longer held"
    );
    assert!(!s
        .a
        .change_node("nobody", NodeFence::Any, NodeChange::Release)
        .await
        .unwrap());
}

async fn a_take_is_fenced_on_the_document_as_read(s: Stores) {
    let (p1, p2) = (NodeProcess::this_process(), NodeProcess::this_process());
    let take = |p: &NodeProcess| NodeChange::Take(p.clone());
    assert!(s.a.change_node("n", NodeFence::Absent, take(&p1)).await.unwrap());
    assert!(
        !s.b.change_node("n", NodeFence::Absent, take(&p2)).await.unwrap(),
        "created once"
    );
    let read = s.a.node("n").await.unwrap().expect("the node taken");
    assert_eq!(read.node.process.as_ref(), Some(&p1));
    assert!(!read.foreign, "written by this implementation");
    let as_read = NodeFence::AsRead {
        heartbeat: read.heartbeat,
        process: Some(p1.id),
    };
    pause().await;
    // The holder heartbeats between the read and the take: the take misses.
    s.a.heartbeat("n", LEASE).await.unwrap();
    assert!(!s.b.change_node("n", as_read, take(&p2)).await.unwrap());
    assert_eq!(node(&*s.a, "n").await.unwrap().process.as_ref(), Some(&p1));
    let read = s.b.node("n").await.unwrap().unwrap();
    let as_read = NodeFence::AsRead {
        heartbeat: read.heartbeat,
        process: read.node.process.map(|p| p.id),
    };
    assert!(s.b.change_node("n", as_read, take(&p2)).await.unwrap());
    let taken = node(&*s.a, "n").await.unwrap();
    assert_eq!(taken.process.as_ref(), Some(&p2));
    assert!(taken.timestamp >= read.node.timestamp, "with a heartbeat of its own");
    assert_eq!(s.a.nodes().await.unwrap().len(), 1, "still one node document");
}

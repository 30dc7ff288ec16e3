//! Same-name restarts, slots freed only with their tasks, and idempotent start.

use super::*;

on_both_stores!(
    taking_a_dead_process_name_recovers_its_tasks_and_slots,
    an_expired_slot_stays_held_while_its_holder_has_tasks,
    a_stale_nodes_slot_stays_held_while_a_task_claimed_after_its_heartbeat_runs,
    a_slot_lease_is_revalidated_by_its_holder_only,
    renewing_an_expired_lease_keeps_the_slot_of_a_running_task,
    start_succeeds_again_after_a_lost_reply,
);

async fn taking_a_dead_process_name_recovers_its_tasks_and_slots(s: Stores) {
    let q = queue(&*s.a, "restart", 1, Sort::Fifo).await;
    let rq =
        s.a.create_queue(NewQueue {
            extra: doc! { "on_orphan": "requeue" },
            ..new_queue("restart-requeue", Some(1), Sort::Fifo)
        })
        .await
        .unwrap();
    s.a.create_tasks(q.id, vec![doc! {}; 3]).await.unwrap();
    s.a.create_tasks(rq.id, vec![doc! {}; 1]).await.unwrap();
    let (dead, next) = (NodeProcess::this_process(), NodeProcess::this_process());
    assert_eq!(
        disbatch::lifecycle::nodes::take(&*s.a, "same", &dead, stale_before())
            .await
            .unwrap(),
        None
    );
    disbatch::lifecycle::slots::acquire_slot(&*s.a, &q, "same", LEASE)
        .await
        .unwrap()
        .expect("slot");
    disbatch::lifecycle::slots::acquire_slot(&*s.a, &rq, "same", LEASE)
        .await
        .unwrap()
        .expect("slot");
    let running = claim_run(&*s.a, &q, "same").await;
    let claimed = s.a.claim(&rq, "same").await.unwrap().expect("a task").id;
    let other = claim_run(&*s.a, &q, "other-node").await;

    // The dead process's heartbeat is stale: a new process takes the name.
    let future = DateTime::from_millis(DateTime::now().timestamp_millis() + 1000);
    assert_eq!(
        disbatch::lifecycle::nodes::take(&*s.b, "same", &next, future)
            .await
            .unwrap(),
        None
    );
    let t = task(&*s.a, running).await;
    assert_eq!(t.status, status::ORPHANED, "a running task is orphaned at once");
    let t = task(&*s.a, claimed).await;
    assert_eq!((t.status, t.node), (status::QUEUED, None), "on_orphan: requeue");
    assert_eq!(
        task(&*s.a, other).await.status,
        status::RUNNING,
        "other nodes' tasks stay"
    );
    // The slots are free at once, long before their leases would expire.
    assert!(disbatch::lifecycle::slots::acquire_slot(&*s.b, &q, "same", LEASE)
        .await
        .unwrap()
        .is_some());
    assert!(disbatch::lifecycle::slots::acquire_slot(&*s.b, &rq, "same", LEASE)
        .await
        .unwrap()
        .is_some());
}

async fn an_expired_slot_stays_held_while_its_holder_has_tasks(s: Stores) {
    let short = Duration::from_millis(200);
    let q = queue(&*s.a, "held", 1, Sort::Fifo).await;
    s.a.create_tasks(q.id, vec![doc! {}; 2]).await.unwrap();
    s.a.heartbeat("paused", LEASE).await.unwrap();
    disbatch::lifecycle::slots::acquire_slot(&*s.a, &q, "paused", short)
        .await
        .unwrap()
        .expect("slot");
    let running = claim_run(&*s.a, &q, "paused").await;
    // Past the lease (a lease ends by time alone).
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        disbatch::lifecycle::slots::acquire_slot(&*s.b, &q, "other", LEASE)
            .await
            .unwrap()
            .is_none(),
        "the expired slot's holder still has a running task"
    );
    // Recovery (the holder is stale) orphans the task and frees the slot together.
    let future = DateTime::from_millis(DateTime::now().timestamp_millis() + 1000);
    let r = disbatch::lifecycle::recovery::recover_orphans(&*s.b, ago(3_600_000), future)
        .await
        .unwrap();
    assert_eq!(r.orphaned, vec![running]);
    assert!(disbatch::lifecycle::slots::acquire_slot(&*s.b, &q, "other", LEASE)
        .await
        .unwrap()
        .is_some());
}

async fn a_stale_nodes_slot_stays_held_while_a_task_claimed_after_its_heartbeat_runs(s: Stores) {
    let short = Duration::from_millis(200);
    let q = queue(&*s.a, "late-claim", 1, Sort::Fifo).await;
    s.a.create_tasks(q.id, vec![doc! {}; 2]).await.unwrap();
    s.a.heartbeat("paused", LEASE).await.unwrap();
    pause().await;
    // The node's last heartbeat is before this moment, its task's claim after it.
    let between = DateTime::now();
    pause().await;
    disbatch::lifecycle::slots::acquire_slot(&*s.a, &q, "paused", short)
        .await
        .unwrap()
        .expect("slot");
    let running = claim_run(&*s.a, &q, "paused").await;
    // Past the slot's lease (a lease ends by time alone).
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The node is stale, but its task is younger than the stale window: not recovered
    // yet, so its slot stays held and the queue's one thread stays taken.
    let r = disbatch::lifecycle::recovery::recover_orphans(&*s.b, ago(3_600_000), between)
        .await
        .unwrap();
    assert!(r.orphaned.is_empty() && r.requeued.is_empty(), "{r:?}");
    assert_eq!(task(&*s.b, running).await.status, status::RUNNING);
    assert!(
        disbatch::lifecycle::slots::acquire_slot(&*s.b, &q, "other", LEASE)
            .await
            .unwrap()
            .is_none(),
        "the slot of a task still running was freed: the queue would run threads + 1"
    );
    // Once the task itself is recovered, its slot goes with it.
    let future = DateTime::from_millis(DateTime::now().timestamp_millis() + 1000);
    let r = disbatch::lifecycle::recovery::recover_orphans(&*s.b, ago(3_600_000), future)
        .await
        .unwrap();
    assert_eq!(r.orphaned, vec![running]);
    assert!(disbatch::lifecycle::slots::acquire_slot(&*s.b, &q, "other", LEASE)
        .await
        .unwrap()
        .is_some());
}

async fn a_slot_lease_is_revalidated_by_its_holder_only(s: Stores) {
    let q = queue(&*s.a, "renew", 1, Sort::Fifo).await;
    let slot = disbatch::lifecycle::slots::acquire_slot(&*s.a, &q, "holder", LEASE)
        .await
        .unwrap()
        .expect("slot");
    assert_eq!(
        disbatch::lifecycle::slots::renew_slot(&*s.b, &slot, "someone-else", LEASE)
            .await
            .unwrap(),
        SlotRenewal::Lost
    );
    // The holder renews for a short time, then stops (a stale node's slot is freed once
    // its lease has run out).
    let short = Duration::from_millis(50);
    s.a.heartbeat("holder", LEASE).await.unwrap();
    assert_eq!(
        disbatch::lifecycle::slots::renew_slot(&*s.a, &slot, "holder", short)
            .await
            .unwrap(),
        SlotRenewal::Held
    );
    tokio::time::sleep(short * 2).await;
    let future = DateTime::from_millis(DateTime::now().timestamp_millis() + 1000);
    disbatch::lifecycle::recovery::recover_orphans(&*s.b, ago(3_600_000), future)
        .await
        .unwrap();
    assert_eq!(
        disbatch::lifecycle::slots::renew_slot(&*s.a, &slot, "holder", LEASE)
            .await
            .unwrap(),
        SlotRenewal::Lost,
        "a slot freed by recovery is lost to its old holder"
    );
}

async fn renewing_an_expired_lease_keeps_the_slot_of_a_running_task(s: Stores) {
    let short = Duration::from_millis(200);
    let q = queue(&*s.a, "renew-late", 1, Sort::Fifo).await;
    s.a.create_tasks(q.id, vec![doc! {}; 2]).await.unwrap();
    s.a.heartbeat("late", LEASE).await.unwrap();
    let slot = disbatch::lifecycle::slots::acquire_slot(&*s.a, &q, "late", short)
        .await
        .unwrap()
        .expect("slot");
    let running = claim_run(&*s.a, &q, "late").await;
    // Past the lease (a lease ends by time alone); the holder's task still runs.
    tokio::time::sleep(Duration::from_millis(500)).await;
    // An expired lease is not renewed (the slot may have been counted free since) ...
    assert_eq!(
        disbatch::lifecycle::slots::renew_slot(&*s.a, &slot, "late", LEASE)
            .await
            .unwrap(),
        SlotRenewal::Lost
    );
    // ... and the late renewal does not free it either: its holder's task still runs.
    assert!(
        disbatch::lifecycle::slots::acquire_slot(&*s.b, &q, "other", LEASE)
            .await
            .unwrap()
            .is_none(),
        "a late renewal freed the slot of a running task: the queue would run threads + 1"
    );
    let empty = OutputValue::Inline(String::new());
    assert!(
        disbatch::lifecycle::run::finish(&*s.a, running, "late", 1, empty.clone(), empty)
            .await
            .unwrap()
    );
    assert!(disbatch::lifecycle::slots::acquire_slot(&*s.b, &q, "other", LEASE)
        .await
        .unwrap()
        .is_some());
}

async fn start_succeeds_again_after_a_lost_reply(s: Stores) {
    let q = queue(&*s.a, "start-retry", 2, Sort::Fifo).await;
    s.a.create_tasks(q.id, vec![doc! {}; 1]).await.unwrap();
    let t = s.a.claim(&q, "me").await.unwrap().expect("a task");
    assert!(disbatch::lifecycle::run::start(&*s.a, t.id, "me").await.unwrap());
    // The first reply was lost: the retry finds the task already running on this node.
    assert!(
        disbatch::lifecycle::run::start(&*s.a, t.id, "me").await.unwrap(),
        "start is idempotent"
    );
    assert_eq!(task(&*s.a, t.id).await.status, status::RUNNING);
    assert!(
        !disbatch::lifecycle::run::start(&*s.b, t.id, "another").await.unwrap(),
        "not another node's task"
    );
    let empty = OutputValue::Inline(String::new());
    assert!(
        disbatch::lifecycle::run::finish(&*s.a, t.id, "me", 1, empty.clone(), empty)
            .await
            .unwrap()
    );
    assert!(
        !disbatch::lifecycle::run::start(&*s.a, t.id, "me").await.unwrap(),
        "a finished task does not start again"
    );
}

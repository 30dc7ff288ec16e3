//! Keys on both stores: one task per key and queue, the existing task answered, and a
//! submission again in each state (waiting, running, finished), also through a DEN.

use disbatch::lifecycle::keys::Keyed;
use disbatch::store::{NewTask, OutputValue};

use super::*;

on_both_stores!(
    a_key_is_created_once_per_queue,
    resubmitting_a_waiting_or_finished_task,
    a_task_submitted_again_while_it_runs_runs_once_more,
    a_rerun_is_dropped_by_a_kill_and_by_recovery,
    only_a_key_clash_is_a_duplicate_key,
);

fn keyed(key: &str, params: Document) -> NewTask {
    NewTask {
        key: Some(key.into()),
        ..NewTask::queued(ObjectId::new(), params)
    }
}

async fn a_key_is_created_once_per_queue(s: Stores) {
    let q = queue(&*s.a, "keys", 4, Sort::Fifo).await;
    let other = queue(&*s.a, "keys-2", 4, Sort::Fifo).await;
    let first = keyed("invoice-7", doc! {"n": 1});
    assert_eq!(
        disbatch::lifecycle::keys::insert_keyed(&*s.a, q.id, first.clone(), false)
            .await
            .unwrap(),
        Keyed::Created
    );
    // The same key again, from the other store handle and with other params: the first task.
    let again = keyed("invoice-7", doc! {"n": 2});
    let Keyed::Existing(t) = disbatch::lifecycle::keys::insert_keyed(&*s.b, q.id, again.clone(), false)
        .await
        .unwrap()
    else {
        panic!("the key is taken")
    };
    assert_eq!(
        (t.id, t.params.clone(), t.key.as_deref()),
        (first.id, doc! {"n": 1}, Some("invoice-7"))
    );
    assert!(s.a.task(again.id).await.unwrap().is_none(), "no duplicate was created");
    // Another queue has its own keys; tasks without a key are never in each other's way.
    assert_eq!(
        disbatch::lifecycle::keys::insert_keyed(&*s.b, other.id, again.clone(), false)
            .await
            .unwrap(),
        Keyed::Created
    );
    s.a.create_tasks(q.id, vec![doc! {}, doc! {}]).await.unwrap();
    // Many submitters of one key at once: exactly one creates it.
    let racers: Vec<_> = (0..8)
        .map(|i| {
            let store = if i % 2 == 0 { s.a.clone() } else { s.b.clone() };
            let t = keyed("race", doc! {"i": i});
            tokio::spawn(async move {
                disbatch::lifecycle::keys::insert_keyed(&*store, q.id, t, false)
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut created = 0;
    for r in racers {
        if r.await.unwrap() == Keyed::Created {
            created += 1;
        }
    }
    assert_eq!(created, 1, "one task per key");
    let filter = TaskFilter {
        queue: Some(q.id),
        key: Some("race".into()),
        ..Default::default()
    };
    assert_eq!(s.a.count_tasks(&filter).await.unwrap(), 1);
}

async fn resubmitting_a_waiting_or_finished_task(s: Stores) {
    let q = queue(&*s.a, "resubmit", 4, Sort::Fifo).await;
    let first = keyed("k", doc! {"v": 1});
    disbatch::lifecycle::keys::insert_keyed(&*s.a, q.id, first.clone(), false)
        .await
        .unwrap();
    // Waiting: it takes the new params, priority and time (here later: scheduled).
    let hour = DateTime::from_millis(DateTime::now().timestamp_millis() + 3_600_000);
    let newer = NewTask {
        run_at: Some(hour),
        priority: 5,
        ..keyed("k", doc! {"v": 2})
    };
    let Keyed::Resubmitted(t) = disbatch::lifecycle::keys::insert_keyed(&*s.b, q.id, newer, true)
        .await
        .unwrap()
    else {
        panic!("submitted again")
    };
    assert_eq!((t.id, t.status, t.priority), (first.id, status::SCHEDULED, Some(5)));
    assert_eq!(t.params, doc! {"v": 2});
    // Now due: queued again; claimed, run and finished.
    let Keyed::Resubmitted(t) = disbatch::lifecycle::keys::insert_keyed(&*s.b, q.id, keyed("k", doc! {"v": 3}), true)
        .await
        .unwrap()
    else {
        panic!("submitted again")
    };
    assert_eq!((t.status, t.run_at), (status::QUEUED, None));
    assert_eq!(claim_run(&*s.a, &q, "n1").await, first.id);
    let out = |s: &str| OutputValue::Inline(s.into());
    assert!(
        disbatch::lifecycle::run::finish(&*s.a, first.id, "n1", 1, out("done"), out(""))
            .await
            .unwrap()
    );
    // Finished: queued again with the new params, the run it had kept in attempts.
    let Keyed::Resubmitted(t) = disbatch::lifecycle::keys::insert_keyed(&*s.b, q.id, keyed("k", doc! {"v": 4}), true)
        .await
        .unwrap()
    else {
        panic!("submitted again")
    };
    assert_eq!(
        (t.status, t.node.as_deref(), t.params.clone()),
        (status::QUEUED, None, doc! {"v": 4})
    );
    assert_eq!(t.attempts.len(), 1);
    assert_eq!(t.attempts[0].status, 1);
    assert_eq!(t.attempts[0].reason, disbatch::lifecycle::keys::RESUBMITTED);
    assert_eq!(
        t.attempts[0].stdout,
        Some(disbatch::model::Output::Inline("done".into()))
    );
    // Without resubmit, the existing task is answered unchanged.
    let Keyed::Existing(same) = disbatch::lifecycle::keys::insert_keyed(&*s.a, q.id, keyed("k", doc! {"v": 5}), false)
        .await
        .unwrap()
    else {
        panic!("existing")
    };
    assert_eq!(same.params, doc! {"v": 4});
}

async fn a_task_submitted_again_while_it_runs_runs_once_more(s: Stores) {
    let q = queue(&*s.a, "rerun", 2, Sort::Fifo).await;
    let first = keyed("long", doc! {"sleep_ms": 1500, "message": "run"});
    disbatch::lifecycle::keys::insert_keyed(&*s.a, q.id, first.clone(), false)
        .await
        .unwrap();
    let den = RunningDen::start(s.b.clone(), settings("node-a"));
    wait_for(Duration::from_secs(30), "the task to run", || async {
        task(&*s.a, first.id).await.status == status::RUNNING
    })
    .await;
    let Keyed::Resubmitted(t) = disbatch::lifecycle::keys::insert_keyed(
        &*s.a,
        q.id,
        keyed("long", doc! {"message": "ignored while running"}),
        true,
    )
    .await
    .unwrap() else {
        panic!("submitted again")
    };
    assert!(t.rerun, "marked to run once more");
    wait_for(Duration::from_secs(60), "the second run to end", || async {
        task(&*s.a, first.id).await.status > 0
    })
    .await;
    den.stop().await;
    let t = task(&*s.a, first.id).await;
    assert_eq!(t.status, status::SUCCEEDED);
    assert!(!t.rerun);
    assert_eq!(t.attempts.len(), 2, "both runs are kept: {:?}", t.attempts);
    assert_eq!(t.attempts[1].status, status::SUCCEEDED);
    let a = &t.attempts[0];
    assert_eq!((a.status, a.node.as_deref()), (status::SUCCEEDED, Some("node-a")));
    assert!(a.reason.contains("submitted again while it ran"), "{}", a.reason);
    assert_eq!(a.stdout, Some(disbatch::model::Output::Inline("run\n".into())));
    assert_eq!(
        t.stdout,
        Some(disbatch::model::Output::Inline("run\n".into())),
        "the second run's result"
    );
}

async fn a_rerun_is_dropped_by_a_kill_and_by_recovery(s: Stores) {
    let q = queue_with(&*s.a, "rerun-faults", "demo", 4, doc! {"on_orphan": "requeue"}).await;
    let (a, b) = (keyed("a", doc! {}), keyed("b", doc! {}));
    disbatch::lifecycle::keys::insert_keyed(&*s.a, q.id, a.clone(), false)
        .await
        .unwrap();
    disbatch::lifecycle::keys::insert_keyed(&*s.a, q.id, b.clone(), false)
        .await
        .unwrap();
    assert_eq!(claim_run(&*s.a, &q, "gone").await, a.id);
    assert_eq!(claim_run(&*s.a, &q, "gone").await, b.id);
    assert!(disbatch::lifecycle::retry::request_rerun(&*s.b, a.id).await.unwrap());
    assert!(disbatch::lifecycle::retry::request_rerun(&*s.b, b.id).await.unwrap());
    // Killed after it was submitted again: it ends with this run.
    let stop = disbatch::model::StopRequest::now(disbatch::model::StopAction::Kill, "ops", "");
    disbatch::lifecycle::run::request_kill(&*s.b, disbatch::store::TaskTarget::Task(a.id), &stop)
        .await
        .unwrap();
    let empty = OutputValue::Inline(String::new());
    assert!(
        disbatch::lifecycle::run::finish(&*s.a, a.id, "gone", 2, empty.clone(), empty)
            .await
            .unwrap()
    );
    let t = task(&*s.b, a.id).await;
    assert_eq!((t.status, t.rerun), (2, false), "a killed task does not run again");
    // Its node dies: recovery puts it back once (on_orphan requeue) and drops the rerun.
    pause().await;
    let later = DateTime::from_millis(DateTime::now().timestamp_millis() + 1000);
    let r = disbatch::lifecycle::recovery::recover_orphans(&*s.b, ago(3_600_000), later)
        .await
        .unwrap();
    assert_eq!(r.requeued, vec![b.id]);
    let t = task(&*s.a, b.id).await;
    assert_eq!((t.status, t.rerun), (status::QUEUED, false));
}

/// A duplicate task key is a clash on the key alone: a keyed task whose `_id` is taken
/// fails otherwise (retrying cannot help), and a key taken fails as a duplicate key
/// however many tasks are inserted with it.
async fn only_a_key_clash_is_a_duplicate_key(s: Stores) {
    let q = queue(&*s.a, "clash", 4, Sort::Fifo).await;
    let first = keyed("k1", doc! {"n": 1});
    s.a.insert_tasks(q.id, vec![first.clone()]).await.unwrap();
    // A fresh key on a taken id.
    let same_id = NewTask {
        id: first.id,
        ..keyed("k2", doc! {"n": 2})
    };
    let e = s.b.insert_tasks(q.id, vec![same_id]).await.unwrap_err();
    assert!(
        !matches!(e, StoreError::Duplicate { .. }) && !e.is_transient(),
        "an id clash is not a duplicate key: {e:?}"
    );
    // A taken key on a fresh id, alone and among others.
    let e =
        s.b.insert_tasks(q.id, vec![keyed("k1", doc! {"n": 3})])
            .await
            .unwrap_err();
    assert!(
        matches!(e, StoreError::Duplicate { what: "task key", ref name } if name == "k1"),
        "{e:?}"
    );
    let plain = NewTask::queued(ObjectId::new(), doc! {"n": 4});
    let e =
        s.b.insert_tasks(q.id, vec![plain, keyed("k1", doc! {"n": 5})])
            .await
            .unwrap_err();
    assert!(
        matches!(e, StoreError::Duplicate { what: "task key", ref name } if name == "k1"),
        "{e:?}"
    );
    // The same keyed task again (a write whose reply was lost): its key is taken.
    let e = s.b.insert_tasks(q.id, vec![first.clone()]).await.unwrap_err();
    assert!(matches!(e, StoreError::Duplicate { what: "task key", .. }), "{e:?}");
    assert_eq!(s.a.task(first.id).await.unwrap().unwrap().key.as_deref(), Some("k1"));
}

//! Fenced task changes on both stores: a fence that holds lets its change through, one
//! that does not changes nothing and answers false; every field a change writes reads
//! back the same on both.

use disbatch::model::{Attempt, Output, StopAction, StopRequest, TaskProgress};
use disbatch::store::{NodeIs, StopIs, TaskChange, TaskFence, TaskTarget, Write};

use super::*;

on_both_stores!(
    a_fence_that_does_not_hold_changes_nothing,
    asked_to_kill_means_a_kill_request_on_both_stores,
    a_change_writes_and_clears_every_field,
    change_where_answers_the_tasks_it_changed,
    changes_made_at_once_each_get_their_own_answer,
);

fn touch() -> TaskChange {
    TaskChange {
        touch: true,
        ..TaskChange::default()
    }
}

fn to_status(status: i32) -> TaskChange {
    TaskChange {
        status: Some(status),
        ..touch()
    }
}

async fn a_fence_that_does_not_hold_changes_nothing(s: Stores) {
    let q = queue(&*s.a, "fences", 4, Sort::Fifo).await;
    let ids =
        s.a.create_tasks(q.id, vec![doc! {"n": 1}, doc! {"n": 2}])
            .await
            .unwrap();
    let (queued, running) = (ids[0], ids[1]);
    let claimed = s.a.claim(&q, "n1").await.unwrap().unwrap();
    assert_eq!(claimed.id, queued, "fifo claims the first");
    assert!(disbatch::lifecycle::run::start(&*s.a, queued, "n1").await.unwrap());
    // `queued` is now running on n1; `running` is still queued. Names as they are now:
    let (busy, waiting) = (queued, running);
    let before = (task(&*s.a, busy).await, task(&*s.a, waiting).await);
    let mark = |statuses: &[i32]| TaskFence::statuses(statuses);
    let rerun = TaskChange {
        rerun: Some(true),
        ..TaskChange::default()
    };
    let fences = [
        (busy, mark(&[status::QUEUED]), false),
        (busy, mark(&[status::CLAIMED, status::QUEUED]), false),
        (busy, mark(&[status::RUNNING]).on(NodeIs::Node("n2".into())), false),
        (busy, mark(&[status::RUNNING]).on(NodeIs::Unclaimed), false),
        (waiting, mark(&[status::QUEUED]).on(NodeIs::Node("n1".into())), false),
        (
            busy,
            TaskFence {
                mtime: Some(DateTime::from_millis(before.0.mtime.timestamp_millis() - 1)),
                ..TaskFence::default()
            },
            false,
        ),
        (busy, TaskFence::default().stop(StopIs::Kill), false),
        (busy, TaskFence::default().rerun(true), false),
        (
            waiting,
            TaskFence {
                due_by: Some(DateTime::now()),
                ..TaskFence::default()
            },
            false,
        ),
        (ObjectId::new(), TaskFence::default(), false),
    ];
    let entries: Vec<_> = fences
        .iter()
        .map(|(id, f, _)| (*id, f.clone(), rerun.clone()))
        .collect();
    let done = s.b.change_tasks(&entries).await.unwrap();
    assert_eq!(done, vec![false; fences.len()], "no fence holds");
    let after = (task(&*s.a, busy).await, task(&*s.a, waiting).await);
    assert_eq!(after, before, "a fence that does not hold changes nothing");

    // The same fences, now holding, in one call: each applies, in order.
    let holding = [
        (
            busy,
            mark(&[status::CLAIMED, status::RUNNING]).on(NodeIs::Node("n1".into())),
        ),
        (
            busy,
            TaskFence {
                mtime: Some(before.0.mtime),
                stop: StopIs::None,
                rerun: Some(true),
                ..TaskFence::default()
            },
        ),
        (
            waiting,
            mark(&[status::QUEUED]).on(NodeIs::Unclaimed).stop(StopIs::NotKill),
        ),
    ];
    let entries = vec![
        (holding[0].0, holding[0].1.clone(), rerun.clone()),
        // Holds only because the entry before it marked the task.
        (holding[1].0, holding[1].1.clone(), to_status(status::FAILED)),
        (holding[2].0, holding[2].1.clone(), to_status(status::SCHEDULED)),
    ];
    assert_eq!(s.b.change_tasks(&entries).await.unwrap(), vec![true, true, true]);
    let b = task(&*s.a, busy).await;
    assert_eq!((b.status, b.rerun), (status::FAILED, true));
    assert!(b.mtime >= before.0.mtime);
    assert_eq!(task(&*s.a, waiting).await.status, status::SCHEDULED);
    let due = TaskFence {
        due_by: Some(DateTime::now()),
        ..TaskFence::default()
    };
    // `run_at` unset: not due.
    assert_eq!(
        s.b.change_tasks(&[(waiting, due.clone(), to_status(status::QUEUED))])
            .await
            .unwrap(),
        vec![false]
    );
    let set_run_at = TaskChange {
        run_at: Write::Set(ago(1000)),
        ..touch()
    };
    assert_eq!(
        s.b.change_tasks(&[
            (waiting, TaskFence::default(), set_run_at),
            (waiting, due, to_status(status::QUEUED))
        ])
        .await
        .unwrap(),
        vec![true, true]
    );
    assert_eq!(task(&*s.a, waiting).await.status, status::QUEUED);

    let err =
        s.b.change_tasks(&[(waiting, TaskFence::default(), TaskChange::default())])
            .await
            .unwrap_err();
    assert!(matches!(err, StoreError::Invalid(_)), "{err}");
}

async fn asked_to_kill_means_a_kill_request_on_both_stores(s: Stores) {
    let q = queue(&*s.a, "kills", 4, Sort::Fifo).await;
    let ids =
        s.a.create_tasks(q.id, vec![doc! {"n": 1}, doc! {"n": 2}, doc! {"n": 3}])
            .await
            .unwrap();
    for _ in &ids {
        claim_run(&*s.a, &q, "n1").await;
    }
    let (killed, other, none) = (ids[0], ids[1], ids[2]);
    let stop = |action| TaskChange {
        stop: Write::Set(StopRequest::now(action, "tester", "a test")),
        ..touch()
    };
    assert_eq!(
        s.a.change_tasks(&[
            (killed, TaskFence::default(), stop(StopAction::Kill)),
            // Not a request the DCI makes of a running task, but one a stop field may hold.
            (other, TaskFence::default(), stop(StopAction::Cancel)),
        ])
        .await
        .unwrap(),
        vec![true, true]
    );
    let asks = |id| {
        [StopIs::Any, StopIs::None, StopIs::Kill, StopIs::NotKill].map(|stop| {
            (
                id,
                TaskFence::statuses(&status::BUSY).stop(stop),
                TaskChange {
                    priority: Some(7),
                    ..TaskChange::default()
                },
            )
        })
    };
    let mut entries = Vec::new();
    for id in [killed, other, none] {
        entries.extend(asks(id));
    }
    let done = s.b.change_tasks(&entries).await.unwrap();
    //                 any   none   kill   not kill
    let want = [
        [true, false, true, false], // a kill request
        [true, false, false, true], // a request of another action
        [true, true, false, true],  // no request
    ];
    assert_eq!(
        done.chunks(4).collect::<Vec<_>>(),
        want.iter().map(|w| &w[..]).collect::<Vec<_>>()
    );
    let (k, _) =
        s.b.kill_requests("n1")
            .await
            .unwrap()
            .into_iter()
            .unzip::<_, _, Vec<_>, Vec<_>>();
    assert_eq!(
        k,
        vec![killed],
        "the kill requests are the tasks the kill fence holds for"
    );
}

async fn a_change_writes_and_clears_every_field(s: Stores) {
    let q = queue(&*s.a, "fields", 4, Sort::Fifo).await;
    let id = s.a.create_tasks(q.id, vec![doc! {"n": 1}]).await.unwrap()[0];
    let before = task(&*s.a, id).await;
    let file = s.a.write_output_file(id, "stderr", "big").await.unwrap();
    let (run_at, until) = (ago(5000), ago(-60_000));
    let attempt = |reason: &str| Attempt {
        node: Some("n1".into()),
        started: None,
        ended: DateTime::from_millis(1_700_000_000_000),
        status: status::FAILED,
        reason: reason.into(),
        stdout: Some(Output::Inline("out".into())),
        stderr: None,
    };
    let progress = TaskProgress {
        percent: Some(50.0),
        info: "half".into(),
        at: DateTime::from_millis(1_700_000_000_000),
    };
    let stop = StopRequest::now(StopAction::Kill, "tester", "why");
    pause().await;
    let set = TaskChange {
        status: Some(status::RUNNING),
        node: Write::Set("n1".into()),
        stdout: Write::Set(OutputValue::Inline("hello".into())),
        stderr: Write::Set(OutputValue::File(file)),
        progress: Write::Set(progress.clone()),
        stop: Write::Set(stop.clone()),
        rerun: Some(true),
        run_at: Write::Set(run_at),
        started: Some(run_at),
        priority: Some(9),
        avoid: Write::Set(("n2".into(), until)),
        params: Some(doc! {"n": 2, "s": "x"}),
        attempt: Some(attempt("first")),
        touch: true,
    };
    assert_eq!(
        s.a.change_tasks(&[(id, TaskFence::default(), set)]).await.unwrap(),
        vec![true]
    );
    let t = task(&*s.b, id).await;
    assert_eq!(t.status, status::RUNNING);
    assert_eq!(t.node.as_deref(), Some("n1"));
    assert_eq!(t.stdout, Some(Output::Inline("hello".into())));
    assert_eq!(t.stderr, Some(Output::File(file)));
    assert_eq!(t.progress, Some(progress));
    assert_eq!(t.stop, Some(stop));
    assert!(t.rerun);
    assert_eq!(t.run_at, Some(run_at));
    assert_eq!(t.started, Some(run_at));
    assert_eq!(t.priority, Some(9));
    assert_eq!(t.params, doc! {"n": 2, "s": "x"});
    assert_eq!(t.attempts, vec![attempt("first")]);
    assert!(t.mtime > before.mtime, "touched");
    // `avoid` is seen by a claim: n2 is left out until `until`, n3 is not.
    let waiting = TaskChange {
        status: Some(status::QUEUED),
        node: Write::Clear,
        ..TaskChange::default()
    };
    assert_eq!(
        s.a.change_tasks(&[(id, TaskFence::default(), waiting)]).await.unwrap(),
        vec![true]
    );
    assert!(s.b.claim(&q, "n2").await.unwrap().is_none(), "n2 leaves it to others");
    assert_eq!(s.b.claim(&q, "n3").await.unwrap().map(|t| t.id), Some(id));

    let mtime = task(&*s.a, id).await.mtime;
    let clear = TaskChange {
        node: Write::Clear,
        stdout: Write::Clear,
        stderr: Write::Clear,
        progress: Write::Clear,
        stop: Write::Clear,
        rerun: Some(false),
        run_at: Write::Clear,
        avoid: Write::Clear,
        attempt: Some(attempt("second")),
        ..TaskChange::default()
    };
    assert_eq!(
        s.b.change_tasks(&[(id, TaskFence::default(), clear)]).await.unwrap(),
        vec![true]
    );
    let t = task(&*s.a, id).await;
    assert_eq!(t.status, status::CLAIMED, "status kept");
    assert_eq!(t.node, None);
    assert_eq!((t.stdout, t.stderr), (None, None));
    assert_eq!((t.progress, t.stop, t.rerun, t.run_at), (None, None, false, None));
    assert_eq!(t.priority, Some(9), "priority kept");
    assert_eq!(t.attempts, vec![attempt("first"), attempt("second")], "appended");
    assert_eq!(t.mtime, mtime, "not touched");
    // Unclaimed and no longer avoided: n2 may claim it once queued.
    let queued = TaskChange {
        status: Some(status::QUEUED),
        ..TaskChange::default()
    };
    assert_eq!(
        s.b.change_tasks(&[(id, TaskFence::default(), queued)]).await.unwrap(),
        vec![true]
    );
    assert_eq!(s.a.claim(&q, "n2").await.unwrap().map(|t| t.id), Some(id));
}

async fn change_where_answers_the_tasks_it_changed(s: Stores) {
    let (q1, q2) = (
        queue(&*s.a, "where1", 4, Sort::Fifo).await,
        queue(&*s.a, "where2", 4, Sort::Fifo).await,
    );
    let one = s.a.create_tasks(q1.id, vec![doc! {}, doc! {}, doc! {}]).await.unwrap();
    let two = s.a.create_tasks(q2.id, vec![doc! {}, doc! {}]).await.unwrap();
    let started = claim_run(&*s.a, &q1, "n1").await;
    assert_eq!(started, one[0]);
    let waiting = TaskFence::statuses(&[status::QUEUED]).on(NodeIs::Unclaimed);
    let held = to_status(status::TERMINATED);

    let mut got =
        s.b.change_where(TaskTarget::Queue(q1.id), &waiting, &held)
            .await
            .unwrap();
    got.sort();
    assert_eq!(got, one[1..].to_vec(), "the queue's waiting tasks, not its running one");
    assert_eq!(task(&*s.a, one[0]).await.status, status::RUNNING);
    assert_eq!(
        task(&*s.a, two[0]).await.status,
        status::QUEUED,
        "another queue's left alone"
    );
    assert!(
        s.b.change_where(TaskTarget::Queue(q1.id), &waiting, &held)
            .await
            .unwrap()
            .is_empty(),
        "none waits any more"
    );
    assert_eq!(
        s.b.change_where(TaskTarget::Task(two[1]), &waiting, &held)
            .await
            .unwrap(),
        vec![two[1]]
    );
    let mut all =
        s.b.change_where(
            TaskTarget::All,
            &TaskFence::statuses(&[status::TERMINATED]),
            &to_status(status::QUEUED),
        )
        .await
        .unwrap();
    all.sort();
    assert_eq!(all, vec![one[1], one[2], two[1]]);
    for t in all {
        assert_eq!(task(&*s.a, t).await.status, status::QUEUED);
    }

    for bad in [
        TaskChange::default(),
        TaskChange {
            status: Some(status::QUEUED),
            ..TaskChange::default()
        },
    ] {
        let err = s.b.change_where(TaskTarget::All, &waiting, &bad).await.unwrap_err();
        assert!(matches!(err, StoreError::Invalid(_)), "{err}");
    }
}

/// Many callers on two store instances change tasks at the same moment (as a DEN's workers
/// end their runs together): each call's entries apply in order, each answer is the call's
/// own, and the database holds every change that answered true and none that answered false.
async fn changes_made_at_once_each_get_their_own_answer(s: Stores) {
    let q = queue(&*s.a, "at-once", 4, Sort::Fifo).await;
    let ids =
        s.a.create_tasks(q.id, (0..60).map(|n| doc! {"n": n}).collect())
            .await
            .unwrap();
    let fence = |st: i32| TaskFence::statuses(&[st]);
    let calls = ids.iter().enumerate().map(|(i, &id)| {
        let store = if i % 2 == 0 { s.a.clone() } else { s.b.clone() };
        // Every third: two steps, the second fenced on what the first wrote (both apply only
        // in order). The others: a fence that does not hold, then one that does.
        let entries = if i % 3 == 0 {
            vec![
                (id, fence(status::QUEUED), to_status(status::CLAIMED)),
                (id, fence(status::CLAIMED), to_status(status::RUNNING)),
            ]
        } else {
            vec![
                (id, fence(status::RUNNING), to_status(status::SUCCEEDED)),
                (id, fence(status::QUEUED), to_status(status::CANCELLED)),
            ]
        };
        tokio::spawn(async move { store.change_tasks(&entries).await.unwrap() })
    });
    let answers: Vec<Vec<bool>> = futures::future::join_all(calls)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    for (i, (&id, answer)) in ids.iter().zip(&answers).enumerate() {
        let (expect, now) = if i % 3 == 0 {
            (vec![true, true], status::RUNNING)
        } else {
            (vec![false, true], status::CANCELLED)
        };
        assert_eq!(answer, &expect, "task {i}'s own answer");
        assert_eq!(task(&*s.b, id).await.status, now, "task {i} in the database");
    }
}

//! A task's life beyond Disbatch 4's on both stores: scheduled tasks, cancel and kill,
//! at the store and through a running DEN.

use disbatch::model::{StopAction, StopRequest, TaskProgress};
use disbatch::store::{NewTask, TaskTarget};

use super::*;

on_both_stores!(
    scheduled_tasks_are_not_claimed_before_their_time,
    cancel_ends_only_tasks_that_have_not_started,
    kill_requests_reach_only_the_node_running_the_task,
    a_den_runs_a_scheduled_task_once_it_is_due,
    a_killed_task_stops_at_once_and_ends_failed_saying_who_and_why,
    a_task_asked_to_be_killed_never_runs_again,
    progress_is_stored_while_running_and_kept_at_the_end,
    a_den_stores_progress_while_a_task_runs_and_keeps_the_last,
    a_kill_during_the_shutdown_grace_is_carried_out,
    higher_priorities_are_claimed_first_then_the_queue_order,
);

fn later(millis: i64) -> DateTime {
    DateTime::from_millis(DateTime::now().timestamp_millis() + millis)
}

async fn scheduled_tasks_are_not_claimed_before_their_time(s: Stores) {
    let q = queue(&*s.a, "sched", 4, Sort::Fifo).await;
    let (due, future) = (ObjectId::new(), ObjectId::new());
    let hour = 3_600_000;
    s.a.insert_tasks(
        q.id,
        vec![
            NewTask {
                id: future,
                params: doc! {"n": 1},
                run_at: Some(later(hour)),
                priority: 0,
                key: None,
                batch: None,
                after: Vec::new(),
                after_failure_runs: false,
                dependents: false,
            },
            NewTask {
                id: due,
                params: doc! {"n": 2},
                run_at: Some(ago(1000)),
                priority: 0,
                key: None,
                batch: None,
                after: Vec::new(),
                after_failure_runs: false,
                dependents: false,
            },
        ],
    )
    .await
    .unwrap();
    let f = task(&*s.b, future).await;
    assert_eq!((f.status, status::name(f.status)), (status::SCHEDULED, "scheduled"));
    assert!(f.run_at.is_some());
    let d = task(&*s.b, due).await;
    assert_eq!(d.status, status::QUEUED, "a time already past queues the task at once");
    assert!(d.run_at.is_some(), "the time is kept");

    assert_eq!(claim_run(&*s.b, &q, "n").await, due);
    assert!(
        s.b.claim(&q, "n").await.unwrap().is_none(),
        "a scheduled task is never claimed"
    );
    assert!(!s.b.has_queued(q.id).await.unwrap());
    assert_eq!(
        disbatch::lifecycle::run::promote_due(&*s.a, DateTime::now())
            .await
            .unwrap(),
        0,
        "not due yet"
    );
    assert_eq!(task(&*s.b, future).await.status, status::SCHEDULED);

    assert_eq!(
        disbatch::lifecycle::run::promote_due(&*s.a, later(hour + 1000))
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        disbatch::lifecycle::run::promote_due(&*s.b, later(hour + 1000))
            .await
            .unwrap(),
        0,
        "queued once"
    );
    let t = task(&*s.b, future).await;
    assert_eq!((t.status, t.node.clone()), (status::QUEUED, None));
    assert_eq!(claim_run(&*s.b, &q, "n").await, future);
}

async fn cancel_ends_only_tasks_that_have_not_started(s: Stores) {
    let q = queue(&*s.a, "cancel", 4, Sort::Fifo).await;
    let ids = s.a.create_tasks(q.id, vec![doc! {}; 4]).await.unwrap();
    let scheduled = ObjectId::new();
    s.a.insert_tasks(
        q.id,
        vec![NewTask {
            id: scheduled,
            params: doc! {},
            run_at: Some(later(3_600_000)),
            priority: 0,
            key: None,
            batch: None,
            after: Vec::new(),
            after_failure_runs: false,
            dependents: false,
        }],
    )
    .await
    .unwrap();
    let running = claim_run(&*s.a, &q, "n").await;
    let claimed = s.a.claim(&q, "n").await.unwrap().unwrap().id;
    let stop = StopRequest::now(StopAction::Cancel, "tester", "not needed");

    for busy in [running, claimed] {
        assert!(
            disbatch::lifecycle::run::cancel_tasks(&*s.b, TaskTarget::Task(busy), &stop)
                .await
                .unwrap()
                .is_empty()
        );
        assert!(task(&*s.a, busy).await.stop.is_none());
    }
    let queued = ids[2];
    assert_eq!(
        disbatch::lifecycle::run::cancel_tasks(&*s.b, TaskTarget::Task(queued), &stop)
            .await
            .unwrap(),
        vec![queued]
    );
    let t = task(&*s.a, queued).await;
    assert_eq!((t.status, status::name(t.status)), (status::CANCELLED, "cancelled"));
    let recorded = t.stop.expect("stop recorded");
    assert_eq!(
        (recorded.action, recorded.by.as_str(), recorded.reason.as_str()),
        (StopAction::Cancel, "tester", "not needed")
    );
    assert!(
        disbatch::lifecycle::run::cancel_tasks(&*s.b, TaskTarget::Task(queued), &stop)
            .await
            .unwrap()
            .is_empty(),
        "once"
    );

    // The queue form: every waiting task (queued or scheduled), nothing else.
    let all = StopRequest::now(StopAction::Cancel, "tester", "queue drained");
    let mut cancelled = disbatch::lifecycle::run::cancel_tasks(&*s.b, TaskTarget::Queue(q.id), &all)
        .await
        .unwrap();
    cancelled.sort();
    let mut want = vec![ids[3], scheduled];
    want.sort();
    assert_eq!(cancelled, want);
    assert!(
        s.a.claim(&q, "n").await.unwrap().is_none(),
        "cancelled tasks are never claimed"
    );
    assert_eq!(
        disbatch::lifecycle::run::promote_due(&*s.a, later(7_200_000))
            .await
            .unwrap(),
        0,
        "a cancelled scheduled task stays cancelled"
    );
    assert_eq!(task(&*s.a, running).await.status, status::RUNNING);
    assert_eq!(task(&*s.a, claimed).await.status, status::CLAIMED);
    let wrong = StopRequest::now(StopAction::Kill, "tester", "");
    assert!(
        disbatch::lifecycle::run::cancel_tasks(&*s.a, TaskTarget::Queue(q.id), &wrong)
            .await
            .is_err()
    );
}

async fn kill_requests_reach_only_the_node_running_the_task(s: Stores) {
    let q = queue(&*s.a, "kill", 4, Sort::Fifo).await;
    let ids = s.a.create_tasks(q.id, vec![doc! {}; 3]).await.unwrap();
    let mine = claim_run(&*s.a, &q, "n").await;
    let theirs = claim_run(&*s.a, &q, "m").await;
    let queued = ids[2];
    let stop = StopRequest::now(StopAction::Kill, "tester", "runaway");
    assert!(
        disbatch::lifecycle::run::request_kill(&*s.b, TaskTarget::Task(queued), &stop)
            .await
            .unwrap()
            .is_empty(),
        "not running"
    );
    assert_eq!(
        disbatch::lifecycle::run::request_kill(&*s.b, TaskTarget::Task(mine), &stop)
            .await
            .unwrap(),
        vec![mine]
    );
    assert!(
        disbatch::lifecycle::run::request_kill(&*s.b, TaskTarget::Task(mine), &stop)
            .await
            .unwrap()
            .is_empty(),
        "asked once"
    );
    let asked = s.a.kill_requests("n").await.unwrap();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].0, mine);
    assert_eq!(
        (asked[0].1.by.as_str(), asked[0].1.reason.as_str()),
        ("tester", "runaway")
    );
    assert!(s.a.kill_requests("m").await.unwrap().is_empty());
    assert_eq!(
        task(&*s.a, mine).await.status,
        status::RUNNING,
        "the DEN ends it, not the request"
    );

    // The queue form asks every claimed or running task not asked yet.
    let all = StopRequest::now(StopAction::Kill, "tester", "stop all");
    assert_eq!(
        disbatch::lifecycle::run::request_kill(&*s.b, TaskTarget::Queue(q.id), &all)
            .await
            .unwrap(),
        vec![theirs]
    );
    // Once finished, a task has no kill request to carry out.
    let empty = OutputValue::Inline(String::new());
    assert!(
        disbatch::lifecycle::run::finish(&*s.a, mine, "n", 2, empty.clone(), empty)
            .await
            .unwrap()
    );
    assert!(s.a.kill_requests("n").await.unwrap().is_empty());
    assert!(task(&*s.a, mine).await.stop.is_some(), "the request stays on the task");
}

async fn a_den_runs_a_scheduled_task_once_it_is_due(s: Stores) {
    let q = queue(&*s.a, "due", 2, Sort::Fifo).await;
    let id = ObjectId::new();
    let run_at = later(1500);
    s.a.insert_tasks(
        q.id,
        vec![NewTask {
            id,
            params: doc! {"message": "on time"},
            run_at: Some(run_at),
            priority: 0,
            key: None,
            batch: None,
            after: Vec::new(),
            after_failure_runs: false,
            dependents: false,
        }],
    )
    .await
    .unwrap();
    let den = RunningDen::start(s.b.clone(), settings("node-a"));
    wait_for(Duration::from_secs(60), "the scheduled task to finish", || async {
        task(&*s.a, id).await.status > 0
    })
    .await;
    den.stop().await;
    let t = task(&*s.a, id).await;
    assert_eq!(t.status, status::SUCCEEDED);
    assert!(t.mtime >= run_at, "finished at {} before its time {}", t.mtime, run_at);
    let late = t.mtime.timestamp_millis() - run_at.timestamp_millis();
    println!("scheduled task finished {late} ms after its time");
}

async fn a_killed_task_stops_at_once_and_ends_failed_saying_who_and_why(s: Stores) {
    let q = queue(&*s.a, "killme", 2, Sort::Fifo).await;
    // A plugin waiting 50 s, under a 60 s timeout: only the kill can end it early.
    let id = s.a.create_tasks(q.id, vec![doc! {"sleep_ms": 50_000}]).await.unwrap()[0];
    let den = RunningDen::start(s.b.clone(), settings("node-a"));
    wait_for(Duration::from_secs(30), "the task to run", || async {
        task(&*s.a, id).await.status == status::RUNNING
    })
    .await;
    let stop = StopRequest::now(StopAction::Kill, "tester", "runaway job");
    let asked = std::time::Instant::now();
    assert_eq!(
        disbatch::lifecycle::run::request_kill(&*s.a, TaskTarget::Task(id), &stop)
            .await
            .unwrap(),
        vec![id]
    );
    wait_for(Duration::from_secs(30), "the killed task to end", || async {
        task(&*s.a, id).await.status > 0
    })
    .await;
    let latency = asked.elapsed();
    println!("kill request → task failed: {} ms", latency.as_millis());
    assert!(
        latency < Duration::from_secs(30),
        "ended by the kill, not by the plugin"
    );
    let t = task(&*s.a, id).await;
    assert_eq!(t.status, status::FAILED);
    let stderr = s.a.read_output(t.stderr.as_ref().expect("stderr")).await.unwrap();
    assert!(stderr.contains("[disbatch: killed by tester at "), "{stderr}");
    assert!(stderr.contains(": runaway job]"), "{stderr}");
    assert_eq!(t.stop.map(|s| s.action), Some(StopAction::Kill));
    // The DEN goes on with other tasks.
    let next = s.a.create_tasks(q.id, vec![doc! {}]).await.unwrap()[0];
    wait_for(Duration::from_secs(30), "the next task to finish", || async {
        task(&*s.a, next).await.status == status::SUCCEEDED
    })
    .await;
    den.stop().await;
}

async fn a_task_asked_to_be_killed_never_runs_again(s: Stores) {
    let extra = doc! { "on_orphan": "requeue" };
    let q = queue_with(&*s.a, "again", "demo", 4, extra).await;
    s.a.create_tasks(q.id, vec![doc! {}; 4]).await.unwrap();
    let (asked, plain) = (claim_run(&*s.a, &q, "n").await, claim_run(&*s.a, &q, "n").await);
    let stop = StopRequest::now(StopAction::Kill, "tester", "");
    disbatch::lifecycle::run::request_kill(&*s.b, TaskTarget::Task(asked), &stop)
        .await
        .unwrap();
    // A shutdown puts back only the task nobody asked to kill; the other ends failed.
    assert_eq!(
        disbatch::lifecycle::run::requeue_own(&*s.a, "n", &[asked, plain])
            .await
            .unwrap(),
        vec![plain]
    );
    let t = task(&*s.b, asked).await;
    assert_eq!(t.status, status::FAILED);
    let stderr = s.b.read_output(t.stderr.as_ref().unwrap()).await.unwrap();
    assert_eq!(stderr, disbatch::lifecycle::machine::KILLED_AT_SHUTDOWN);

    // A dead node's task: requeued by the queue's policy unless someone asked to kill it.
    let (asked, plain) = (claim_run(&*s.a, &q, "dead").await, claim_run(&*s.a, &q, "dead").await);
    disbatch::lifecycle::run::request_kill(&*s.b, TaskTarget::Task(asked), &stop)
        .await
        .unwrap();
    pause().await;
    let r = disbatch::lifecycle::recovery::recover_orphans(&*s.b, DateTime::now(), DateTime::now())
        .await
        .unwrap();
    assert_eq!((r.requeued, r.orphaned), (vec![plain], vec![asked]));
}

async fn progress_is_stored_while_running_and_kept_at_the_end(s: Stores) {
    let q = queue(&*s.a, "progress", 2, Sort::Fifo).await;
    s.a.create_tasks(q.id, vec![doc! {}]).await.unwrap();
    let id = claim_run(&*s.a, &q, "n").await;
    let half = TaskProgress {
        percent: Some(50.0),
        info: "half way".into(),
        at: DateTime::now(),
    };
    assert!(disbatch::lifecycle::run::report_progress(&*s.b, id, "n", &half)
        .await
        .unwrap());
    assert!(
        !disbatch::lifecycle::run::report_progress(&*s.b, id, "m", &half)
            .await
            .unwrap(),
        "only the node running it"
    );
    assert_eq!(task(&*s.a, id).await.progress.as_ref(), Some(&half));
    let done = TaskProgress {
        percent: Some(100.0),
        info: "done".into(),
        at: DateTime::now(),
    };
    let empty = OutputValue::Inline(String::new());
    assert!(disbatch::lifecycle::run::finish_with(
        &*s.a,
        id,
        "n",
        1,
        empty.clone(),
        empty.clone(),
        &disbatch::lifecycle::run::FinishExtra {
            progress: Some(done.clone()),
            attempt: None,
        },
    )
    .await
    .unwrap());
    let t = task(&*s.b, id).await;
    assert_eq!(
        (t.status, t.progress.as_ref()),
        (1, Some(&done)),
        "kept when the task ends"
    );
    assert!(
        !disbatch::lifecycle::run::report_progress(&*s.b, id, "n", &half)
            .await
            .unwrap(),
        "not once finished"
    );
    assert_eq!(task(&*s.b, id).await.progress, Some(done.clone()));

    // A finish without a report keeps the one stored while it ran.
    s.a.create_tasks(q.id, vec![doc! {}]).await.unwrap();
    let id = claim_run(&*s.a, &q, "n").await;
    assert!(disbatch::lifecycle::run::report_progress(&*s.b, id, "n", &half)
        .await
        .unwrap());
    assert!(
        disbatch::lifecycle::run::finish(&*s.a, id, "n", 2, empty.clone(), empty)
            .await
            .unwrap()
    );
    assert_eq!(task(&*s.b, id).await.progress, Some(half));
}

async fn a_den_stores_progress_while_a_task_runs_and_keeps_the_last(s: Stores) {
    let q = queue(&*s.a, "progressing", 2, Sort::Fifo).await;
    // demo reports (0, "starting"), waits, then reports (100, "done").
    let id = s.a.create_tasks(q.id, vec![doc! {"sleep_ms": 3000}]).await.unwrap()[0];
    let den = RunningDen::start(s.b.clone(), settings("node-a"));
    wait_for(Duration::from_secs(30), "the running task's progress", || async {
        let t = task(&*s.a, id).await;
        t.status == status::RUNNING
            && t.progress
                .is_some_and(|p| p.info == "starting" && p.percent == Some(0.0))
    })
    .await;
    wait_for(Duration::from_secs(30), "the task to finish", || async {
        task(&*s.a, id).await.status > 0
    })
    .await;
    den.stop().await;
    let t = task(&*s.a, id).await;
    let p = t.progress.expect("progress kept");
    assert_eq!((t.status, p.percent, p.info.as_str()), (1, Some(100.0), "done"));
}

async fn a_kill_during_the_shutdown_grace_is_carried_out(s: Stores) {
    let q = queue(&*s.a, "grace", 2, Sort::Fifo).await;
    let id = s.a.create_tasks(q.id, vec![doc! {"sleep_ms": 50_000}]).await.unwrap()[0];
    let mut patient = settings("node-a");
    patient.shutdown_grace = Duration::from_secs(120);
    let mut den = RunningDen::start(s.b.clone(), patient);
    wait_for(Duration::from_secs(30), "the task to run", || async {
        task(&*s.a, id).await.status == status::RUNNING
    })
    .await;
    // The shutdown gives running tasks 2 minutes; the kill must not wait for them.
    den.shutdown.cancel();
    let stop = StopRequest::now(StopAction::Kill, "tester", "during shutdown");
    assert_eq!(
        disbatch::lifecycle::run::request_kill(&*s.a, TaskTarget::Task(id), &stop)
            .await
            .unwrap(),
        vec![id]
    );
    let asked = std::time::Instant::now();
    wait_for(Duration::from_secs(60), "the killed task to end", || async {
        task(&*s.a, id).await.status > 0
    })
    .await;
    assert!(
        asked.elapsed() < Duration::from_secs(60),
        "killed, not left to the grace"
    );
    let t = task(&*s.a, id).await;
    let stderr = s.a.read_output(t.stderr.as_ref().unwrap()).await.unwrap();
    assert_eq!(t.status, status::FAILED);
    assert!(stderr.contains("killed by tester"), "{stderr}");
    if let Some(h) = den.handle.take() {
        h.await.unwrap();
    }
}

async fn higher_priorities_are_claimed_first_then_the_queue_order(s: Stores) {
    for sort in [Sort::Fifo, Sort::Lifo, Sort::Default] {
        let q = queue(&*s.a, &format!("prio-{sort:?}"), 8, sort).await;
        let priorities = [0, 5, -1, 5, 0];
        let tasks: Vec<NewTask> = priorities
            .iter()
            .enumerate()
            .map(|(i, p)| NewTask {
                priority: *p,
                ..NewTask::queued(ObjectId::new(), doc! {"i": i as i32})
            })
            .collect();
        let ids: Vec<ObjectId> = tasks.iter().map(|t| t.id).collect();
        s.a.insert_tasks(q.id, tasks).await.unwrap();
        let mut claimed = Vec::new();
        while let Some(t) = s.b.claim(&q, "n").await.unwrap() {
            claimed.push((t.priority, t.id));
        }
        let order: Vec<i64> = claimed.iter().map(|(p, _)| p.unwrap()).collect();
        assert_eq!(order, [5, 5, 0, 0, -1], "{sort:?}");
        let same: Vec<ObjectId> = claimed[..2].iter().map(|(_, id)| *id).collect();
        match sort {
            Sort::Fifo => assert_eq!(same, [ids[1], ids[3]], "oldest first among equals"),
            Sort::Lifo => assert_eq!(same, [ids[3], ids[1]], "newest first among equals"),
            Sort::Default => {}
        }
    }
}

/// A database file made before `run_at`, `stop` and the slot asks existed opens, gains the
/// columns, and its tasks read as before.
#[tokio::test]
async fn an_embedded_database_from_before_gains_the_new_columns() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE tasks (id TEXT PRIMARY KEY NOT NULL, queue TEXT NOT NULL, ctime INTEGER NOT NULL,
                 mtime INTEGER NOT NULL, node TEXT, status INTEGER NOT NULL, params BLOB NOT NULL,
                 stdout TEXT, stdout_file TEXT, stderr TEXT, stderr_file TEXT);
             CREATE TABLE slots (queue TEXT NOT NULL, n INTEGER NOT NULL, holder TEXT,
                 expires INTEGER NOT NULL, PRIMARY KEY (queue, n));",
        )
        .unwrap();
        let mut params = Vec::new();
        doc! {"old": true}.to_writer(&mut params).unwrap();
        conn.execute(
            "INSERT INTO tasks (id, queue, ctime, mtime, node, status, params) VALUES (?1, ?2, 1, 1, NULL, -2, ?3)",
            rusqlite::params![ObjectId::new().to_hex(), ObjectId::new().to_hex(), params],
        )
        .unwrap();
    }
    let store = SqliteStore::open(&path).await.unwrap();
    store.ensure_indexes().await.unwrap();
    let all = store
        .find_tasks(
            &TaskFilter::default(),
            Page {
                skip: 0,
                limit: 10,
                oldest_first: false,
            },
        )
        .await
        .unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(
        (all[0].status, all[0].run_at, all[0].problem.clone()),
        (status::QUEUED, None, None)
    );
    assert_eq!(
        disbatch::lifecycle::run::promote_due(&store, DateTime::now())
            .await
            .unwrap(),
        0
    );
    let q = queue(&store, "old-slots", 2, Sort::Fifo).await;
    for _ in 0..2 {
        disbatch::lifecycle::slots::acquire_slot(&store, &q, "a", LEASE)
            .await
            .unwrap()
            .expect("slot");
    }
    assert_eq!(
        disbatch::lifecycle::slots::want_slot(&store, &q, "b", LEASE)
            .await
            .unwrap()
            .as_deref(),
        Some("a")
    );
}

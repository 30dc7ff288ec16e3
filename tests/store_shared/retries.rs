//! Retries on both stores: a failed run waiting its backoff and preferring another node,
//! orphans retried by their queue's policy, retries by hand, and DENs carrying out a
//! policy (failures, a plugin that fails and then succeeds, an activity timeout).

use disbatch::lifecycle::retry::HandRetry;
use disbatch::lifecycle::run::FinishExtra;
use disbatch::model::{Attempt, Output, RetryAt};
use disbatch::store::OutputValue;

use super::*;

on_both_stores!(
    a_retry_waits_its_time_and_prefers_another_node,
    recovery_retries_orphans_while_attempts_are_left,
    a_finished_task_is_retried_by_hand_once,
    a_den_retries_until_the_attempts_run_out,
    a_den_retries_a_failing_plugin_until_it_succeeds,
    a_task_without_progress_is_killed_as_stuck_and_retried,
    a_task_asked_to_be_killed_is_never_retried,
);

fn later(millis: i64) -> DateTime {
    DateTime::from_millis(DateTime::now().timestamp_millis() + millis)
}

pub(super) fn failed_attempt(node: &str) -> Attempt {
    Attempt {
        node: Some(node.into()),
        started: Some(ago(2000)),
        ended: ago(1000),
        status: status::FAILED,
        reason: "trap: unreachable".into(),
        stdout: None,
        stderr: Some(Output::Inline("boom".into())),
    }
}

async fn a_retry_waits_its_time_and_prefers_another_node(s: Stores) {
    let q = queue(&*s.a, "retry-later", 4, Sort::Fifo).await;
    let ids =
        s.a.create_tasks(q.id, vec![doc! {"n": 1}, doc! {"n": 2}])
            .await
            .unwrap();
    let (first, second) = (ids[0], ids[1]);
    assert_eq!(claim_run(&*s.a, &q, "n1").await, first);
    let record = failed_attempt("n1");
    let retry = RetryAt {
        attempt: record.clone(),
        run_at: later(3_600_000),
        priority: -1,
        avoid_node: "n1".into(),
        avoid_until: later(3_600_000),
        after_kill: false,
    };
    assert!(
        !disbatch::lifecycle::retry::retry_later(&*s.b, first, "n2", &retry)
            .await
            .unwrap(),
        "fenced on the node running it"
    );
    assert!(disbatch::lifecycle::retry::retry_later(&*s.b, first, "n1", &retry)
        .await
        .unwrap());
    let t = task(&*s.b, first).await;
    assert_eq!((t.status, t.node.as_deref()), (status::SCHEDULED, None));
    assert_eq!(t.priority, Some(-1));
    assert_eq!(t.attempts, vec![record], "the failed run is kept whole");
    assert_eq!((t.stdout, t.stderr), (None, None));
    assert!(
        !disbatch::lifecycle::retry::retry_later(&*s.b, first, "n1", &retry)
            .await
            .unwrap(),
        "no longer running: a second write does nothing"
    );
    assert_eq!(task(&*s.a, first).await.attempts.len(), 1);

    // Due now; the node that ran it leaves it to the others for a while.
    assert_eq!(claim_run(&*s.a, &q, "n1").await, second);
    let retry = RetryAt {
        run_at: ago(10),
        ..retry.clone()
    };
    assert!(disbatch::lifecycle::retry::retry_later(&*s.a, second, "n1", &retry)
        .await
        .unwrap());
    assert_eq!(task(&*s.a, second).await.status, status::QUEUED, "due at once: queued");
    assert_eq!(
        disbatch::lifecycle::run::promote_due(&*s.a, later(3_700_000))
            .await
            .unwrap(),
        1,
        "the first becomes due"
    );
    assert!(
        s.b.claim(&q, "n1").await.unwrap().is_none(),
        "n1 leaves both retries to another node"
    );
    let other = s.b.claim(&q, "n2").await.unwrap().expect("another node takes a retry");
    assert_eq!(other.attempts.len(), 1);
    assert!(disbatch::lifecycle::run::start(&*s.b, other.id, "n2").await.unwrap());
    let empty = OutputValue::Inline(String::new());
    let done = FinishExtra {
        progress: None,
        attempt: Some(Attempt {
            status: status::SUCCEEDED,
            reason: "finished with status 1".into(),
            stderr: None,
            ..failed_attempt("n2")
        }),
    };
    assert!(
        disbatch::lifecycle::run::finish_with(&*s.b, other.id, "n2", 1, empty.clone(), empty, &done)
            .await
            .unwrap()
    );
    let t = task(&*s.a, other.id).await;
    assert_eq!(t.attempts.len(), 2, "the final run is appended to the list");
    assert_eq!(t.attempts[1].node.as_deref(), Some("n2"));

    // Once the preference ends, the same node takes it: a single node still retries.
    let left = if other.id == first { second } else { first };
    let q2 = queue(&*s.a, "single-node", 4, Sort::Fifo).await;
    let lone = s.a.create_tasks(q2.id, vec![doc! {}]).await.unwrap()[0];
    assert_eq!(claim_run(&*s.a, &q2, "n1").await, lone);
    let short = RetryAt {
        run_at: ago(10),
        avoid_until: ago(1),
        ..retry
    };
    assert!(disbatch::lifecycle::retry::retry_later(&*s.a, lone, "n1", &short)
        .await
        .unwrap());
    assert_eq!(claim_run(&*s.b, &q2, "n1").await, lone);
    assert_eq!(task(&*s.a, left).await.status, status::QUEUED);
}

async fn recovery_retries_orphans_while_attempts_are_left(s: Stores) {
    let policy = doc! {"retry": {"attempts": 2, "backoff": "0s"}};
    let q = queue_with(&*s.a, "orphan-retry", "demo", 4, policy).await;
    let id = s.a.create_tasks(q.id, vec![doc! {}]).await.unwrap()[0];
    s.a.heartbeat("gone", Duration::from_secs(30)).await.unwrap();
    assert_eq!(claim_run(&*s.a, &q, "gone").await, id);
    pause().await;
    let recovery = disbatch::lifecycle::recovery::recover_orphans(&*s.b, ago(3_600_000), later(1000))
        .await
        .unwrap();
    assert_eq!(recovery.retried, vec![id]);
    assert!(recovery.orphaned.is_empty() && recovery.requeued.is_empty());
    let t = task(&*s.a, id).await;
    assert_eq!(
        (t.status, t.node.as_deref()),
        (status::QUEUED, None),
        "backoff 0: queued at once"
    );
    assert_eq!(t.attempts.len(), 1);
    assert_eq!(
        (t.attempts[0].status, t.attempts[0].node.as_deref()),
        (status::ORPHANED, Some("gone"))
    );
    assert!(t.attempts[0].reason.contains("gone"), "{}", t.attempts[0].reason);

    // The second run is the last: its orphaning is final, and recorded.
    s.a.heartbeat("gone2", Duration::from_secs(30)).await.unwrap();
    assert_eq!(claim_run(&*s.a, &q, "gone2").await, id);
    pause().await;
    let recovery = disbatch::lifecycle::recovery::recover_orphans(&*s.b, ago(3_600_000), later(1000))
        .await
        .unwrap();
    assert_eq!(recovery.orphaned, vec![id]);
    let t = task(&*s.a, id).await;
    assert_eq!(t.status, status::ORPHANED);
    assert_eq!(t.attempts.len(), 2, "every attempt is kept: {:?}", t.attempts);
}

async fn a_finished_task_is_retried_by_hand_once(s: Stores) {
    let q = queue(&*s.a, "by-hand", 4, Sort::Fifo).await;
    let id = s.a.create_tasks(q.id, vec![doc! {}]).await.unwrap()[0];
    assert_eq!(
        disbatch::lifecycle::retry::retry_by_hand(&*s.b, id, "x", None)
            .await
            .unwrap(),
        HandRetry::NotFinished(status::QUEUED)
    );
    assert_eq!(
        disbatch::lifecycle::retry::retry_by_hand(&*s.b, ObjectId::new(), "x", None)
            .await
            .unwrap(),
        HandRetry::NotFound
    );
    assert_eq!(claim_run(&*s.a, &q, "n1").await, id);
    let long = "e".repeat(5000);
    assert!(disbatch::lifecycle::run::finish(
        &*s.a,
        id,
        "n1",
        2,
        OutputValue::Inline("out".into()),
        OutputValue::Inline(long)
    )
    .await
    .unwrap());
    // Two callers at once: one queues it, the other finds it no longer finished.
    let (x, y) = tokio::join!(
        disbatch::lifecycle::retry::retry_by_hand(&*s.a, id, "retried by hand by ops: flaky disk", None),
        disbatch::lifecycle::retry::retry_by_hand(&*s.b, id, "retried by hand by other", None)
    );
    let answers = [x.unwrap(), y.unwrap()];
    assert_eq!(
        answers.iter().filter(|a| **a == HandRetry::Queued).count(),
        1,
        "exactly one retry wins: {answers:?}"
    );
    let t = task(&*s.b, id).await;
    assert_eq!(
        (t.status, t.node.as_deref(), t.stdout.clone()),
        (status::QUEUED, None, None)
    );
    assert_eq!(t.attempts.len(), 1);
    let a = &t.attempts[0];
    assert_eq!((a.status, a.node.as_deref()), (2, Some("n1")));
    assert!(a.reason.starts_with("retried by hand by "), "{}", a.reason);
    assert_eq!(a.stdout, Some(Output::Inline("out".into())));
    let Some(Output::Inline(kept)) = &a.stderr else {
        panic!("stderr kept: {a:?}")
    };
    assert!(
        kept.starts_with("[disbatch: the first 904 bytes are not kept]\n"),
        "the cut is said: {}",
        &kept[..60]
    );
    assert_eq!(claim_run(&*s.a, &q, "n2").await, id, "it runs again");
}

fn settings_with_mark(node: &str) -> DenSettings {
    let mut s = settings(node);
    s.plugins = ["demo", "fail", "mark"].map(String::from).to_vec();
    s
}

async fn a_den_retries_until_the_attempts_run_out(s: Stores) {
    let policy = doc! {"retry": {"attempts": 3, "backoff": "100ms", "exponential": true}};
    let q = queue_with(&*s.a, "always-fails", "fail", 2, policy).await;
    let id = s.a.create_tasks(q.id, vec![doc! {"message": "nope"}]).await.unwrap()[0];
    let den = RunningDen::start(s.b.clone(), settings_with_mark("node-a"));
    wait_for(Duration::from_secs(60), "the task to end", || async {
        task(&*s.a, id).await.status > 0
    })
    .await;
    den.stop().await;
    let t = task(&*s.a, id).await;
    assert_eq!(t.status, status::FAILED);
    assert_eq!(t.attempts.len(), 3, "three runs, each kept: {:?}", t.attempts);
    for a in &t.attempts {
        assert_eq!((a.status, a.node.as_deref()), (status::FAILED, Some("node-a")));
        assert!(a.reason.contains("nope"), "{}", a.reason);
        assert!(a.started.is_some_and(|s| s <= a.ended));
    }
    assert!(
        t.attempts[1].started.unwrap().timestamp_millis() - t.attempts[0].ended.timestamp_millis() >= 95,
        "the retry waited its backoff"
    );
    let Some(Output::Inline(stderr)) = &t.stderr else {
        panic!("stderr")
    };
    assert!(stderr.contains("failed after 3 attempts"), "{stderr}");
}

async fn a_den_retries_a_failing_plugin_until_it_succeeds(s: Stores) {
    let marks = tempfile::tempdir().unwrap();
    let grant = format!("{}:/out:rw", marks.path().display());
    // The mark file exists: every run fails ("already ran") until the test removes it.
    std::fs::write(marks.path().join("m"), "x").unwrap();
    let policy = doc! {"retry": {"attempts": 20, "backoff": "300ms"}, "sandbox": {"dirs": [&grant]}};
    let q = queue_with(&*s.a, "flaky", "mark", 2, policy).await;
    let id = s.a.create_tasks(q.id, vec![doc! {"path": "/out/m"}]).await.unwrap()[0];
    let den = RunningDen::start(s.b.clone(), settings_with_mark("node-a"));
    wait_for(Duration::from_secs(60), "a first failed attempt", || async {
        !task(&*s.a, id).await.attempts.is_empty()
    })
    .await;
    std::fs::remove_file(marks.path().join("m")).unwrap();
    wait_for(Duration::from_secs(60), "the task to end", || async {
        task(&*s.a, id).await.status > 0
    })
    .await;
    den.stop().await;
    let t = task(&*s.a, id).await;
    assert_eq!(t.status, status::SUCCEEDED, "{:?}", t.attempts);
    let (last, earlier) = t.attempts.split_last().unwrap();
    assert_eq!(last.status, status::SUCCEEDED);
    assert!(!earlier.is_empty());
    for a in earlier {
        assert_eq!(a.status, status::FAILED);
        assert!(a.reason.contains("already ran"), "{}", a.reason);
    }
    assert!(std::fs::read_to_string(marks.path().join("m")).unwrap() == "ran");
}

async fn a_task_without_progress_is_killed_as_stuck_and_retried(s: Stores) {
    // The demo plugin reports once, then sleeps 50 s in silence, under a 60 s timeout.
    let policy = doc! {"activity_timeout": "1s", "retry": {"attempts": 2, "backoff": "0s"}};
    let q = queue_with(&*s.a, "stuck", "demo", 2, policy).await;
    let id = s.a.create_tasks(q.id, vec![doc! {"sleep_ms": 50_000}]).await.unwrap()[0];
    let started = std::time::Instant::now();
    let den = RunningDen::start(s.b.clone(), settings("node-a"));
    wait_for(Duration::from_secs(40), "the stuck task to end", || async {
        task(&*s.a, id).await.status > 0
    })
    .await;
    let took = started.elapsed();
    den.stop().await;
    println!(
        "two stuck runs with activity_timeout 1s ended after {} ms",
        took.as_millis()
    );
    assert!(
        took < Duration::from_secs(40),
        "ended by the activity timeout, not the plugin"
    );
    let t = task(&*s.a, id).await;
    assert_eq!(t.status, status::FAILED);
    assert_eq!(t.attempts.len(), 2, "{:?}", t.attempts);
    for a in &t.attempts {
        assert!(a.reason.starts_with("stuck: "), "{}", a.reason);
    }
    let Some(Output::Inline(stderr)) = &t.stderr else {
        panic!("stderr")
    };
    assert!(
        stderr.contains("stuck") && stderr.contains("failed after 2 attempts"),
        "{stderr}"
    );
}

async fn a_task_asked_to_be_killed_is_never_retried(s: Stores) {
    let q = queue(&*s.a, "kill-no-retry", 4, Sort::Fifo).await;
    let id = s.a.create_tasks(q.id, vec![doc! {}]).await.unwrap()[0];
    assert_eq!(claim_run(&*s.a, &q, "n1").await, id);
    let stop = disbatch::model::StopRequest::now(disbatch::model::StopAction::Kill, "ops", "runaway");
    assert_eq!(
        disbatch::lifecycle::run::request_kill(&*s.b, disbatch::store::TaskTarget::Task(id), &stop)
            .await
            .unwrap(),
        vec![id]
    );
    // The run ended in a way its policy retries just as the kill was asked: no retry.
    let retry = RetryAt {
        attempt: failed_attempt("n1"),
        run_at: ago(10),
        priority: 0,
        avoid_node: "n1".into(),
        avoid_until: ago(1),
        after_kill: false,
    };
    assert!(
        !disbatch::lifecycle::retry::retry_later(&*s.a, id, "n1", &retry)
            .await
            .unwrap(),
        "a kill request fences the retry"
    );
    let t = task(&*s.b, id).await;
    assert_eq!(
        (t.status, t.stop.map(|s| s.by)),
        (status::RUNNING, Some("ops".to_string()))
    );
    let empty = OutputValue::Inline(String::new());
    assert!(
        disbatch::lifecycle::run::finish(&*s.a, id, "n1", 2, empty.clone(), empty)
            .await
            .unwrap(),
        "the failure is stored instead"
    );
    assert!(s.b.claim(&q, "n2").await.unwrap().is_none(), "it never runs again");

    // A policy that names `killed` retries a killed run: the request is then cleared.
    let other = s.a.create_tasks(q.id, vec![doc! {}]).await.unwrap()[0];
    assert_eq!(claim_run(&*s.a, &q, "n1").await, other);
    disbatch::lifecycle::run::request_kill(&*s.b, disbatch::store::TaskTarget::Task(other), &stop)
        .await
        .unwrap();
    let killed = RetryAt {
        after_kill: true,
        ..retry
    };
    assert!(disbatch::lifecycle::retry::retry_later(&*s.a, other, "n1", &killed)
        .await
        .unwrap());
    let t = task(&*s.b, other).await;
    assert_eq!((t.status, t.stop), (status::QUEUED, None));
}

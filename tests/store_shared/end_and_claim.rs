//! The end of a worker's run and its next claim in one write
//! (`lifecycle::run::finish_and_claim`, `Store::finish_and_claim`): the end lands whatever
//! the claim finds, and the claim is made before its deadline; on the embedded store only
//! with an end that landed plainly. A store that does not offer the one write (MongoDB with
//! no task read ahead, as in these tests) ends the run and claims nothing. MongoDB's claim
//! of a task read ahead, made beside an end whatever its fence found, is tested in
//! `store_mongo_groups` (`a_task_claimed_beside_an_end_that_did_not_hold_is_the_workers`).

use super::*;
use disbatch::lifecycle::run::{self, FinishExtra};
use disbatch::model::Task;

on_both_stores!(
    the_end_and_the_next_claim_go_together,
    the_end_lands_when_no_task_is_queued,
    a_claim_past_its_deadline_claims_nothing_but_the_end_lands,
    an_end_whose_fence_fails_claims_nothing,
    a_run_submitted_again_runs_once_more_and_claims_nothing,
);

/// A deadline a minute from now, and one a second ago.
fn soon() -> DateTime {
    DateTime::from_millis(DateTime::now().timestamp_millis() + 60_000)
}

fn past() -> DateTime {
    DateTime::from_millis(DateTime::now().timestamp_millis() - 1_000)
}

/// Ends `task`'s run on `node` (status 1, stdout "out") with the claim of `q`'s next task
/// before `until`.
async fn end(
    s: &dyn Store,
    task: ObjectId,
    node: &str,
    q: &Queue,
    until: DateTime,
) -> (bool, Option<Result<Option<Task>, StoreError>>) {
    let outputs = (OutputValue::Inline("out".into()), OutputValue::Inline(String::new()));
    run::finish_and_claim(s, task, node, 1, outputs, &FinishExtra::default(), (q, until))
        .await
        .unwrap()
}

/// A queue of `n` tasks whose first is claimed and running on node "a".
async fn one_running(s: &Stores, name: &str, n: usize) -> (Queue, Vec<ObjectId>) {
    let q = queue(&*s.a, name, 2, Sort::Fifo).await;
    let ids = s.a.create_tasks(q.id, vec![doc! {}; n]).await.unwrap();
    let first = s.a.claim_to_run(&q, "a").await.unwrap().expect("the first task");
    assert_eq!(first.id, ids[0]);
    if first.status == status::CLAIMED {
        assert!(run::start(&*s.a, first.id, "a").await.unwrap());
    }
    (q, ids)
}

/// Whether the store makes the claim with the end (the embedded store does; MongoDB leaves
/// the claim to the caller).
fn offers(claimed: &Option<Result<Option<Task>, StoreError>>) -> bool {
    claimed.is_some()
}

async fn assert_ended(s: &dyn Store, id: ObjectId) {
    let t = task(s, id).await;
    assert_eq!((t.status, t.node.as_deref()), (1, Some("a")), "{id} ended");
    assert_eq!(s.read_output(&t.stdout.unwrap()).await.unwrap(), "out");
}

async fn assert_queued(s: &dyn Store, id: ObjectId) {
    let t = task(s, id).await;
    assert_eq!((t.status, t.node), (status::QUEUED, None), "{id} still queued");
}

async fn the_end_and_the_next_claim_go_together(s: Stores) {
    let (q, ids) = one_running(&s, "end-claim", 2).await;
    let (ended, claimed) = end(&*s.a, ids[0], "a", &q, soon()).await;
    assert!(ended);
    assert_ended(&*s.b, ids[0]).await;
    if offers(&claimed) {
        let next = claimed.unwrap().unwrap().expect("the next task claimed with the end");
        assert_eq!(
            (next.id, next.status, next.node.as_deref()),
            (ids[1], status::RUNNING, Some("a"))
        );
        let stored = task(&*s.b, ids[1]).await;
        assert_eq!((stored.status, stored.node.as_deref()), (status::RUNNING, Some("a")));
    } else {
        assert_queued(&*s.b, ids[1]).await;
    }
}

async fn the_end_lands_when_no_task_is_queued(s: Stores) {
    let (q, ids) = one_running(&s, "end-empty", 1).await;
    let (ended, claimed) = end(&*s.a, ids[0], "a", &q, soon()).await;
    assert!(ended);
    assert!(
        matches!(claimed, None | Some(Ok(None))),
        "nothing to claim: {claimed:?}"
    );
    assert_ended(&*s.b, ids[0]).await;
}

async fn a_claim_past_its_deadline_claims_nothing_but_the_end_lands(s: Stores) {
    let (q, ids) = one_running(&s, "end-late", 2).await;
    let (ended, claimed) = end(&*s.a, ids[0], "a", &q, past()).await;
    assert!(ended);
    assert!(
        matches!(claimed, None | Some(Ok(None))),
        "no claim past the deadline: {claimed:?}"
    );
    assert_ended(&*s.b, ids[0]).await;
    assert_queued(&*s.b, ids[1]).await;
}

async fn an_end_whose_fence_fails_claims_nothing(s: Stores) {
    let (q, ids) = one_running(&s, "end-fenced", 2).await;
    // Node "b" does not run the task: its end is not written, and it claims nothing.
    let (ended, claimed) = end(&*s.b, ids[0], "b", &q, soon()).await;
    assert!(!ended);
    assert!(claimed.is_none(), "no claim without the end: {claimed:?}");
    let t = task(&*s.a, ids[0]).await;
    assert_eq!((t.status, t.node.as_deref()), (status::RUNNING, Some("a")));
    assert_queued(&*s.a, ids[1]).await;
}

async fn a_run_submitted_again_runs_once_more_and_claims_nothing(s: Stores) {
    let (q, ids) = one_running(&s, "end-rerun", 2).await;
    assert!(disbatch::lifecycle::retry::request_rerun(&*s.b, ids[0]).await.unwrap());
    let (ended, claimed) = end(&*s.a, ids[0], "a", &q, soon()).await;
    assert!(ended, "the run's end is written: the task is queued to run once more");
    assert!(claimed.is_none(), "claimed only with a plain end: {claimed:?}");
    assert_queued(&*s.b, ids[0]).await;
    assert_queued(&*s.b, ids[1]).await;
}

use bson::doc;

use super::{answers, sent, Call, Failure, FencedUpdate, Outcome, Sent};
use crate::store::group::Turn;

fn call(n: usize) -> Call {
    (0..n)
        .map(|i| FencedUpdate {
            filter: doc! { "_id": i as i64 },
            update: doc! { "$set": { "status": 1 } },
        })
        .collect()
}

fn answered(turn: &Turn<Call, super::Answer>) -> Option<Result<Vec<bool>, bool>> {
    match turn {
        Turn::Done(Ok(m)) => Some(Ok(m.clone())),
        Turn::Done(Err(e)) => Some(Err(e.is_transient())),
        Turn::Again(_) => None,
    }
}

#[test]
fn each_call_gets_the_matches_of_its_own_updates() {
    let turns = answers(vec![call(1), call(2), call(1)], &Outcome::Made(vec![1, 0, 1, 1]));
    let got: Vec<_> = turns.iter().map(answered).collect();
    assert_eq!(
        got,
        vec![Some(Ok(vec![true])), Some(Ok(vec![false, true])), Some(Ok(vec![true]))]
    );
}

#[test]
fn a_refused_update_fails_its_call_alone_and_the_calls_after_it_go_again() {
    let refused = Failure::of_write(17419, "document too large");
    let turns = answers(
        vec![call(1), call(2), call(1), call(1)],
        &Outcome::StoppedAt(vec![1], 2, refused),
    );
    let got: Vec<_> = turns.iter().map(answered).collect();
    assert_eq!(got, vec![Some(Ok(vec![true])), Some(Err(false)), None, None]);
    let Turn::Again(again) = &turns[2] else {
        panic!("goes again")
    };
    assert_eq!(again.len(), 1);
}

#[test]
fn a_write_error_that_may_pass_says_so() {
    let stepping_down = Failure::of_write(189, "primary stepped down");
    let turns = answers(vec![call(1)], &Outcome::StoppedAt(Vec::new(), 0, stepping_down));
    assert_eq!(answered(&turns[0]), Some(Err(true)));
}

#[test]
fn an_unknown_outcome_fails_every_call_of_the_group_as_worth_retrying() {
    let lost = Failure::unknown("write concern not met");
    let turns = answers(vec![call(1), call(3)], &Outcome::Failed(lost));
    let got: Vec<_> = turns.iter().map(answered).collect();
    assert_eq!(got, vec![Some(Err(true)), Some(Err(true))]);
}

#[test]
fn an_update_of_many_tasks_after_the_entries_is_made_failed_or_sent_again_by_its_place() {
    let made = Outcome::Made(vec![1, 0, 5]);
    assert!(matches!(sent(&made, 2), Sent::Made(5)));
    let refused = || Failure::of_write(17419, "document too large");
    // Entries 0 and 1, then two updates of many tasks at 2 and 3.
    let before = Outcome::StoppedAt(vec![1], 1, refused());
    assert!(
        matches!(sent(&before, 2), Sent::NotTried),
        "an earlier refusal: it goes again"
    );
    let at = Outcome::StoppedAt(vec![1, 1, 3], 3, refused());
    assert!(matches!(sent(&at, 2), Sent::Made(3)), "made before the refusal");
    assert!(
        matches!(sent(&at, 3), Sent::Failed(_)),
        "the refused one fails its calls"
    );
    let lost = Outcome::Failed(Failure::unknown("reply lost"));
    assert!(matches!(sent(&lost, 2), Sent::Failed(f) if f.error().is_transient()));
}

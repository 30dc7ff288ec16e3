use bson::doc;

use super::{answers, Call, Failure, FencedUpdate, Outcome};
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
    let turns = answers(
        vec![call(1), call(2), call(1)],
        Outcome::Made(vec![true, false, true, true]),
    );
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
        Outcome::StoppedAt(vec![true], 2, refused),
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
    let turns = answers(vec![call(1)], Outcome::StoppedAt(Vec::new(), 0, stepping_down));
    assert_eq!(answered(&turns[0]), Some(Err(true)));
}

#[test]
fn an_unknown_outcome_fails_every_call_of_the_group_as_worth_retrying() {
    let lost = Failure::unknown("write concern not met");
    let turns = answers(vec![call(1), call(3)], Outcome::Failed(lost));
    let got: Vec<_> = turns.iter().map(answered).collect();
    assert_eq!(got, vec![Some(Err(true)), Some(Err(true))]);
}

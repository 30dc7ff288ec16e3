use super::{each_got, sent, verdict, Failure, Outcome, Sent, Verdict};

fn held(v: &[Option<Result<bool, Failure>>]) -> Vec<Option<Result<bool, bool>>> {
    v.iter()
        .map(|g| {
            g.as_ref()
                .map(|r| r.as_ref().copied().map_err(|f| f.error().is_transient()))
        })
        .collect()
}

#[test]
fn each_entry_gets_whether_its_own_update_matched() {
    let got = each_got(&Outcome::Made(vec![1, 0, 1, 1]), 4);
    assert_eq!(
        held(&got),
        vec![Some(Ok(true)), Some(Ok(false)), Some(Ok(true)), Some(Ok(true))]
    );
}

#[test]
fn a_refused_update_fails_alone_and_the_ones_after_it_are_not_tried() {
    let refused = Failure::of_write(17419, "document too large");
    let got = each_got(&Outcome::StoppedAt(vec![1, 0], 2, refused), 4);
    assert_eq!(
        held(&got),
        vec![Some(Ok(true)), Some(Ok(false)), Some(Err(false)), None]
    );
}

#[test]
fn a_write_error_that_may_pass_says_so() {
    let stepping_down = Failure::of_write(189, "primary stepped down");
    let got = each_got(&Outcome::StoppedAt(Vec::new(), 0, stepping_down), 1);
    assert_eq!(held(&got), vec![Some(Err(true))]);
}

#[test]
fn an_unknown_outcome_fails_every_update_as_worth_retrying() {
    let lost = Failure::unknown("write concern not met");
    let got = each_got(&Outcome::Failed(lost), 3);
    assert_eq!(held(&got), vec![Some(Err(true)); 3]);
}

#[test]
fn a_call_is_answered_by_what_was_learnt_of_each_of_its_updates() {
    let refused = || Some(Err(Failure::of_write(17419, "document too large")));
    assert!(matches!(verdict(&[None, None]), Verdict::Again), "none tried: again");
    assert!(matches!(verdict(&[Some(Ok(true)), Some(Ok(false))]), Verdict::Held(h) if h == [true, false]));
    assert!(
        matches!(verdict(&[Some(Ok(true)), refused()]), Verdict::Failed(f) if !f.error().is_transient()),
        "one refused: the call fails so"
    );
    assert!(
        matches!(verdict(&[None, refused()]), Verdict::Failed(_)),
        "a failure wins over an update not tried"
    );
    assert!(
        matches!(verdict(&[Some(Ok(true)), None]), Verdict::Partly),
        "one made, one not tried: the other is made apart"
    );
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

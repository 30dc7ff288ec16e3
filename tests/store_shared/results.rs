//! Output files written again after a lost reply, and discarded when the result that
//! would use them is not stored; tasks inserted with their ids.

use super::*;

on_both_stores!(
    output_files_are_rewritten_in_place_and_discarded_unless_used,
    tasks_are_inserted_with_the_ids_given,
);

async fn output_files_are_rewritten_in_place_and_discarded_unless_used(s: Stores) {
    let q = queue(&*s.a, "files", 2, Sort::Fifo).await;
    let ids = s.a.create_tasks(q.id, vec![doc! {}; 2]).await.unwrap();
    let (mine, theirs) = (ids[0], ids[1]);
    let file = ObjectId::new();
    // A first attempt of several MongoDB chunks, then a retry with less text: nothing of
    // the first attempt is left.
    let long = "é€😀".repeat(100_000);
    s.a.put_output_file(file, mine, "stdout", &long).await.unwrap();
    s.a.put_output_file(file, mine, "stdout", "second attempt")
        .await
        .unwrap();
    assert_eq!(s.b.read_output(&Output::File(file)).await.unwrap(), "second attempt");

    // Unused files go; an id never written is ignored.
    s.a.discard_output_files(mine, &[file, ObjectId::new()]).await.unwrap();
    assert!(s.b.read_output(&Output::File(file)).await.is_err(), "discarded");

    // A file the task points at stays (a finish whose reply was lost did apply), and so
    // does another task's file.
    let used = s.a.write_output_file(mine, "stdout", "used").await.unwrap();
    let other = s.a.write_output_file(theirs, "stdout", "theirs").await.unwrap();
    let run = claim_run(&*s.a, &q, "n").await;
    assert_eq!(run, mine);
    let empty = OutputValue::Inline(String::new());
    assert!(
        disbatch::lifecycle::run::finish(&*s.a, mine, "n", 1, OutputValue::File(used), empty)
            .await
            .unwrap()
    );
    s.a.discard_output_files(mine, &[used, other]).await.unwrap();
    assert_eq!(s.b.read_output(&Output::File(used)).await.unwrap(), "used");
    assert_eq!(s.b.read_output(&Output::File(other)).await.unwrap(), "theirs");
}

async fn tasks_are_inserted_with_the_ids_given(s: Stores) {
    let q = queue(&*s.a, "ids", 2, Sort::Fifo).await;
    let ids = [ObjectId::new(), ObjectId::new()];
    let new = |id, n: i32| disbatch::store::NewTask::queued(id, doc! {"n": n});
    s.a.insert_tasks(q.id, vec![new(ids[0], 0), new(ids[1], 1)])
        .await
        .unwrap();
    for (n, id) in ids.iter().enumerate() {
        let t = task(&*s.b, *id).await;
        assert_eq!((t.queue, t.status), (q.id, status::QUEUED));
        assert_eq!(t.params.get_i32("n").unwrap(), n as i32);
    }
    // An id taken already is refused, and on either store never overwrites the task.
    let again = s.a.insert_tasks(q.id, vec![new(ids[0], 9)]).await;
    assert!(again.is_err(), "{again:?}");
    assert!(!again.unwrap_err().is_transient());
    assert_eq!(task(&*s.b, ids[0]).await.params.get_i32("n").unwrap(), 0);
}

//! The `attempts` cap and the sweep of output files no task uses, on both stores: a task
//! retried by hand more times than `ATTEMPTS_KEPT` keeps the last records and counts the
//! others; the files the dropped records kept, and files left by a task that is gone, are
//! deleted by the sweep once past its grace, and nothing a task still names is.

use disbatch::lifecycle::files::{sweep_files, FILE_GRACE};
use disbatch::lifecycle::retry::{retry_by_hand, HandRetry};
use disbatch::model::{Output, ATTEMPTS_KEPT};

use super::*;

on_both_stores!(
    attempts_keep_the_last_records_and_count_the_dropped,
    the_file_sweep_deletes_only_files_no_task_uses,
);

/// Runs `id` on `node` to a failed end, its stdout in a file of its own when `file`.
async fn run_to_failure(s: &dyn Store, q: &Queue, id: ObjectId, node: &str, file: bool) -> Option<ObjectId> {
    assert_eq!(claim_run(s, q, node).await, id);
    let (stdout, written) = if file {
        let f = ObjectId::new();
        s.put_output_file(f, id, "stdout", "kept in a file").await.unwrap();
        (OutputValue::File(f), Some(f))
    } else {
        (OutputValue::Inline("inline".into()), None)
    };
    let ended = disbatch::lifecycle::run::finish(s, id, node, 2, stdout, OutputValue::Inline(String::new()))
        .await
        .unwrap();
    assert!(ended);
    written
}

/// The files of `id` as the store lists them.
async fn files_of(s: &dyn Store, id: ObjectId) -> Vec<ObjectId> {
    let listed = s.output_files(None, 100_000).await.unwrap();
    listed
        .into_iter()
        .filter(|f| f.task == Some(id))
        .map(|f| f.id)
        .collect()
}

fn after_the_grace() -> DateTime {
    let grace = i64::try_from(FILE_GRACE.as_millis()).unwrap();
    DateTime::from_millis(DateTime::now().timestamp_millis() + grace + 60_000)
}

async fn attempts_keep_the_last_records_and_count_the_dropped(s: Stores) {
    let q = queue(&*s.a, "capped", 4, Sort::Fifo).await;
    let id = s.a.create_tasks(q.id, vec![doc! {}]).await.unwrap()[0];
    let runs = ATTEMPTS_KEPT + 5;
    // The first three and the tenth runs keep their stdout in a file.
    let mut files = Vec::new();
    for n in 0..runs {
        let file = run_to_failure(&*s.a, &q, id, "n1", n < 3 || n == 9).await;
        files.push(file);
        let reason = format!("retried by hand by test: run {n}");
        assert_eq!(
            retry_by_hand(&*s.b, id, &reason, None).await.unwrap(),
            HandRetry::Queued
        );
        let t = task(&*s.a, id).await;
        assert_eq!(t.attempts.len(), (n + 1).min(ATTEMPTS_KEPT), "after run {n}");
        assert_eq!(t.attempts_dropped, ((n + 1).saturating_sub(ATTEMPTS_KEPT)) as u64);
    }
    let t = task(&*s.b, id).await;
    assert_eq!(t.attempts_dropped, 5, "five records dropped");
    assert!(
        t.attempts[0].reason.ends_with("run 5"),
        "the oldest kept is the sixth run: {}",
        t.attempts[0].reason
    );
    assert!(t.attempts[ATTEMPTS_KEPT - 1]
        .reason
        .ends_with(&format!("run {}", runs - 1)));
    let tenth = files[9].expect("the tenth run's file");
    assert_eq!(
        t.attempts[4].stdout,
        Some(Output::File(tenth)),
        "a kept record keeps its file"
    );

    // The three files of dropped records are used by nothing now; the sweep deletes them
    // once past the grace, and keeps the tenth.
    assert_eq!(files_of(&*s.a, id).await.len(), 4);
    let early = sweep_files(&*s.a, None, 500, DateTime::now()).await.unwrap();
    assert_eq!(early.deleted, 0, "nothing goes within the grace");
    let page = sweep_files(&*s.a, None, 500, after_the_grace()).await.unwrap();
    assert_eq!(page.deleted, 3);
    assert_eq!(files_of(&*s.b, id).await, vec![tenth]);
    let t = task(&*s.b, id).await;
    assert_eq!(
        s.b.read_output(t.attempts[4].stdout.as_ref().unwrap()).await.unwrap(),
        "kept in a file"
    );
    // A failed run under its queue's policy is appended the same way.
    assert_eq!(claim_run(&*s.a, &q, "n1").await, id);
    let extra = disbatch::lifecycle::run::FinishExtra {
        attempt: Some(super::retries::failed_attempt("n1")),
        ..Default::default()
    };
    let ended = disbatch::lifecycle::run::finish_with(
        &*s.a,
        id,
        "n1",
        2,
        OutputValue::Inline(String::new()),
        OutputValue::Inline(String::new()),
        &extra,
    )
    .await
    .unwrap();
    assert!(ended);
    let t = task(&*s.b, id).await;
    assert_eq!((t.attempts.len(), t.attempts_dropped), (ATTEMPTS_KEPT, 6));
    assert_eq!(t.attempts.last().unwrap().reason, "trap: unreachable");
}

async fn the_file_sweep_deletes_only_files_no_task_uses(s: Stores) {
    let q = queue(&*s.a, "swept", 4, Sort::Fifo).await;
    let ids = s.a.create_tasks(q.id, vec![doc! {}, doc! {}]).await.unwrap();
    // A task that ended with its stdout in a file: kept.
    let used = run_to_failure(&*s.a, &q, ids[0], "n1", true).await.unwrap();
    // A result file written for a running task that never pointed at it (its DEN died
    // between the two writes): deleted.
    assert_eq!(claim_run(&*s.a, &q, "n1").await, ids[1]);
    let orphan_file = ObjectId::new();
    s.a.put_output_file(orphan_file, ids[1], "stdout", "never used")
        .await
        .unwrap();
    // Files of a task that is gone: deleted.
    let gone = ObjectId::new();
    let gone_files = [ObjectId::new(), ObjectId::new(), ObjectId::new()];
    for f in gone_files {
        s.a.put_output_file(f, gone, "stderr", "the task was deleted")
            .await
            .unwrap();
    }
    // Page by page, two files a page, from the first file to the end.
    let mut after = None;
    let (mut looked, mut deleted, mut pages) = (0, 0, 0);
    loop {
        let page = sweep_files(&*s.b, after, 2, after_the_grace()).await.unwrap();
        looked += page.looked;
        deleted += page.deleted;
        pages += 1;
        after = page.next;
        if after.is_none() {
            break;
        }
        assert!(pages < 10, "the pages end");
    }
    assert_eq!((looked, deleted), (5, 4));
    let left = s.a.output_files(None, 100).await.unwrap();
    assert_eq!(left.iter().map(|f| f.id).collect::<Vec<_>>(), vec![used]);
    let t = task(&*s.a, ids[0]).await;
    assert_eq!(
        s.a.read_output(t.stdout.as_ref().unwrap()).await.unwrap(),
        "kept in a file"
    );
    // A second sweep finds nothing more.
    let again = sweep_files(&*s.a, None, 500, after_the_grace()).await.unwrap();
    assert_eq!((again.looked, again.deleted, again.next), (1, 0, None));
}

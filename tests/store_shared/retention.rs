//! Retention on both stores: a look deletes the ended tasks past their queue's retention
//! (over the default), status by status, with their output files, and keeps those that
//! still matter (waited for, in an open batch, a skip-overlap schedule's last task); a
//! look deletes at most its bound; a deletion is fenced on the task as it was found; and
//! documents written by Disbatch 4's tools in other types are never deleted by mistake.

use disbatch::lifecycle::batches::complete;
use disbatch::lifecycle::retention::{sweep, Bounds, Swept};
use disbatch::model::schedule::date;
use disbatch::model::{CatchUp, Overlap, Retention, Schedule};
use disbatch::store::{Dependency, ExpiredFilter, NewTask, ScheduleMark};

use super::*;

on_both_stores!(
    ended_tasks_past_their_retention_go_with_their_files,
    tasks_that_still_matter_are_kept,
    a_look_deletes_at_most_its_bound,
    a_task_changed_since_it_was_found_is_kept,
    documents_of_other_tools_are_never_deleted_by_mistake,
    a_batchs_tasks_go_together_once_the_last_is_past,
    a_batch_deleted_in_part_is_closed_and_its_last_tasks_go_too,
);

const HOUR: i64 = 3600 * 1000;

fn later(millis: i64) -> DateTime {
    DateTime::from_millis(DateTime::now().timestamp_millis() + millis)
}

fn retention(d: Document) -> Retention {
    Retention::from_bson(&Bson::Document(d)).unwrap()
}

/// A fifo queue with `retention` (none when empty).
async fn kept_queue(s: &dyn Store, name: &str, retention: Document) -> Queue {
    let extra = if retention.is_empty() {
        Document::new()
    } else {
        doc! { "retention": retention }
    };
    queue_with(s, name, "demo", 100, extra).await
}

/// Runs the next task of `q` to `code`, its stdout a file (`file`) or inline.
async fn end_next(s: &dyn Store, q: &Queue, code: i32, file: bool) -> (ObjectId, Option<ObjectId>) {
    let id = claim_run(s, q, "n").await;
    let (out, f) = if file {
        let f = s.write_output_file(id, "stdout", "big output").await.unwrap();
        (OutputValue::File(f), Some(f))
    } else {
        (OutputValue::Inline("out".into()), None)
    };
    assert!(
        disbatch::lifecycle::run::finish(s, id, "n", code, out, OutputValue::Inline(String::new()))
            .await
            .unwrap()
    );
    (id, f)
}

/// `n` tasks of `q` created and run to `code`, in order.
async fn ended(s: &dyn Store, q: &Queue, n: usize, code: i32) -> Vec<ObjectId> {
    s.create_tasks(q.id, vec![doc! {}; n]).await.unwrap();
    let mut ids = Vec::new();
    for _ in 0..n {
        ids.push(end_next(s, q, code, false).await.0);
    }
    ids
}

async fn exists(s: &dyn Store, id: ObjectId) -> bool {
    s.task(id).await.unwrap().is_some()
}

/// The GridFS documents of `task` on MongoDB (files and chunks), None on the embedded store.
async fn gridfs_of(s: &Stores, task: ObjectId, file: ObjectId) -> Option<(u64, u64)> {
    let db = s._keep.downcast_ref::<mongodb::Database>()?;
    let files = db
        .collection::<Document>("tasks.files")
        .count_documents(doc! { "$or": [{ "metadata.task_id": task }, { "_id": file }] })
        .await
        .unwrap();
    let chunks = db
        .collection::<Document>("tasks.chunks")
        .count_documents(doc! { "files_id": file })
        .await
        .unwrap();
    Some((files, chunks))
}

async fn ended_tasks_past_their_retention_go_with_their_files(s: Stores) {
    let default = retention(doc! { "failed": "2h", "orphaned": "1h" });
    let q = kept_queue(&*s.a, "kept", doc! { "succeeded": "1h", "failed": "3h" }).await;
    let plain = kept_queue(&*s.a, "plain", Document::new()).await;
    s.a.create_tasks(q.id, vec![doc! {}; 4]).await.unwrap();
    let (ok, ok_file) = end_next(&*s.a, &q, status::SUCCEEDED, true).await;
    let ok_file = ok_file.unwrap();
    let (failed, failed_file) = end_next(&*s.a, &q, status::FAILED, true).await;
    let (cancelled, _) = end_next(&*s.a, &q, status::CANCELLED, false).await;
    let queued = s.a.create_tasks(q.id, vec![doc! {}]).await.unwrap()[0];
    let running = claim_run(&*s.a, &q, "n").await;
    let plain_ok = ended(&*s.a, &plain, 1, status::SUCCEEDED).await[0];
    let plain_failed = ended(&*s.a, &plain, 1, status::FAILED).await[0];
    if let Some((files, chunks)) = gridfs_of(&s, ok, ok_file).await {
        assert_eq!(files, 1);
        assert!(chunks > 0);
    }

    // Nothing is due yet.
    let none = sweep(&*s.b, &default, DateTime::now(), Bounds::default())
        .await
        .unwrap();
    assert_eq!(none, Swept::default());

    // 90 minutes on: the queue's succeeded (1h) are due; its failed (3h, over the
    // default's 2h) are not; the plain queue's failed take the default (2h).
    let swept = sweep(&*s.b, &default, later(90 * 60 * 1000), Bounds::default())
        .await
        .unwrap();
    assert_eq!(swept.deleted, 1, "{swept:?}");
    assert!(!exists(&*s.a, ok).await, "the succeeded task is gone");
    assert!(
        s.a.read_output(&Output::File(ok_file)).await.is_err(),
        "its output file is gone"
    );
    if let Some(counts) = gridfs_of(&s, ok, ok_file).await {
        assert_eq!(counts, (0, 0), "no tasks.files or tasks.chunks document of it is left");
    }
    for id in [failed, cancelled, queued, running, plain_ok, plain_failed] {
        assert!(exists(&*s.a, id).await, "task {id} is kept");
    }
    assert!(s.a.read_output(&Output::File(failed_file.unwrap())).await.is_ok());

    // 150 minutes on: the plain queue's failed task (default 2h); 4 hours on: the
    // queue's failed (3h) with its file. Cancelled tasks have no retention: kept.
    let swept = sweep(&*s.b, &default, later(150 * 60 * 1000), Bounds::default())
        .await
        .unwrap();
    assert_eq!(swept.deleted, 1);
    assert!(!exists(&*s.a, plain_failed).await);
    let swept = sweep(&*s.b, &default, later(4 * HOUR), Bounds::default())
        .await
        .unwrap();
    assert_eq!(swept.deleted, 1);
    assert!(!exists(&*s.a, failed).await);
    assert!(s.a.read_output(&Output::File(failed_file.unwrap())).await.is_err());
    let swept = sweep(&*s.b, &default, later(1000 * HOUR), Bounds::default())
        .await
        .unwrap();
    assert_eq!(swept.deleted, 0);
    for id in [cancelled, queued, running, plain_ok] {
        assert!(exists(&*s.a, id).await, "task {id} has no retention or has not ended");
    }
}

async fn tasks_that_still_matter_are_kept(s: Stores) {
    let default = Retention::default();
    let q = kept_queue(&*s.a, "kept", doc! { "succeeded": "1s", "failed": "1s" }).await;
    let other = kept_queue(&*s.a, "other", Document::new()).await;
    // Waited for: marked `dependents`.
    let waited = ended(&*s.a, &q, 1, status::SUCCEEDED).await[0];
    s.a.mark_dependents(&[Dependency::Task(waited)]).await.unwrap();
    // In an open batch: another task of it still queued (in another queue).
    s.a.insert_batch("open", None).await.unwrap();
    let mut in_open = NewTask::queued(ObjectId::new(), doc! {});
    in_open.batch = Some("open".into());
    let mut still_queued = NewTask::queued(ObjectId::new(), doc! {});
    still_queued.batch = Some("open".into());
    s.a.insert_tasks(q.id, vec![in_open.clone()]).await.unwrap();
    s.a.insert_tasks(other.id, vec![still_queued]).await.unwrap();
    end_next(&*s.a, &q, status::SUCCEEDED, false).await;
    // In a batch of 3 with 1 task so far: more are to come.
    s.a.insert_batch("sized", Some(3)).await.unwrap();
    let mut in_sized = NewTask::queued(ObjectId::new(), doc! {});
    in_sized.batch = Some("sized".into());
    s.a.insert_tasks(q.id, vec![in_sized.clone()]).await.unwrap();
    end_next(&*s.a, &q, status::FAILED, false).await;
    // In a complete batch: goes.
    s.a.insert_batch("done", Some(1)).await.unwrap();
    let mut in_done = NewTask::queued(ObjectId::new(), doc! {});
    in_done.batch = Some("done".into());
    s.a.insert_tasks(q.id, vec![in_done.clone()]).await.unwrap();
    end_next(&*s.a, &q, status::SUCCEEDED, false).await;
    // The last task of a schedule with overlap skip, and of one with overlap allow.
    let skip_last = ended(&*s.a, &q, 1, status::SUCCEEDED).await[0];
    let allow_last = ended(&*s.a, &q, 1, status::SUCCEEDED).await[0];
    for (name, overlap, task) in [
        ("skip", Overlap::Skip, skip_last),
        ("allow", Overlap::Allow, allow_last),
    ] {
        let def = Schedule {
            name: name.into(),
            queue: q.id,
            params: doc! {},
            cron: None,
            every: Some("1h".into()),
            timezone: "UTC".into(),
            catch_up: CatchUp::None,
            catch_up_limit: 1,
            overlap,
            paused: false,
            anchor: DateTime::now(),
        };
        let mark = ScheduleMark {
            last: date(jiff::Timestamp::now()),
            task: Some(task),
        };
        s.a.put_schedule(&def, Some(&mark)).await.unwrap();
    }
    let plain = ended(&*s.a, &q, 2, status::FAILED).await;

    let swept = sweep(&*s.b, &default, later(HOUR), Bounds::default()).await.unwrap();
    assert_eq!(swept.deleted, 4, "{swept:?}");
    for id in [waited, in_open.id, in_sized.id, skip_last] {
        assert!(exists(&*s.a, id).await, "task {id} still matters");
    }
    for id in [in_done.id, allow_last, plain[0], plain[1]] {
        assert!(!exists(&*s.a, id).await, "task {id} no longer matters");
    }

    // Once its end is settled, the task waited for goes.
    s.a.settled(&Dependency::Task(waited)).await.unwrap();
    let swept = sweep(&*s.b, &default, later(HOUR), Bounds::default()).await.unwrap();
    assert_eq!(swept.deleted, 1);
    assert!(!exists(&*s.a, waited).await);
}

async fn a_look_deletes_at_most_its_bound(s: Stores) {
    let default = retention(doc! { "succeeded": "1s" });
    let q = kept_queue(&*s.a, "many", Document::new()).await;
    ended(&*s.a, &q, 25, status::SUCCEEDED).await;
    let bounds = Bounds { batch: 5, batches: 2 };
    let mut looks = Vec::new();
    loop {
        let swept = sweep(&*s.b, &default, later(HOUR), bounds).await.unwrap();
        let more = swept.more;
        looks.push(swept.deleted);
        if !more {
            break;
        }
    }
    assert_eq!(looks, vec![10, 10, 5], "at most 2 deletions of 5 tasks a look");
    let filter = ExpiredFilter {
        queue: q.id,
        status: status::SUCCEEDED,
        before: later(HOUR),
        except_ids: Vec::new(),
        except_batches: Vec::new(),
        batch: None,
        limit: 100,
    };
    assert!(s.a.expired_tasks(&filter).await.unwrap().is_empty());
}

async fn a_task_changed_since_it_was_found_is_kept(s: Stores) {
    let q = kept_queue(&*s.a, "fenced", Document::new()).await;
    let ids = ended(&*s.a, &q, 3, status::SUCCEEDED).await;
    let filter = ExpiredFilter {
        queue: q.id,
        status: status::SUCCEEDED,
        before: later(HOUR),
        except_ids: vec![ids[2]],
        except_batches: Vec::new(),
        batch: None,
        limit: 10,
    };
    let mut found = s.b.expired_tasks(&filter).await.unwrap();
    let mut got: Vec<ObjectId> = found.iter().map(|t| t.id).collect();
    got.sort();
    let mut want = vec![ids[0], ids[1]];
    want.sort();
    assert_eq!(got, want, "the task excepted is not found");
    // One task changed since it was read (its mtime moved), the other one's status.
    found[0].mtime = DateTime::from_millis(found[0].mtime.timestamp_millis() - 1);
    found[1].status = status::FAILED;
    assert!(s.a.delete_tasks(&found).await.unwrap().is_empty());
    for id in &ids {
        assert!(exists(&*s.a, *id).await);
    }
    // Retried by hand: queued again, never deleted by a stale read.
    let fresh = s.b.expired_tasks(&filter).await.unwrap();
    assert_eq!(fresh.len(), 2);
    let target = fresh[0].id;
    disbatch::lifecycle::retry::retry_by_hand(&*s.a, target, "someone", None)
        .await
        .unwrap();
    assert_eq!(task(&*s.a, target).await.status, status::QUEUED);
    let deleted = s.a.delete_tasks(&fresh).await.unwrap();
    assert_eq!(deleted, vec![fresh[1].id], "the retried task is kept, the other goes");
    assert!(exists(&*s.a, target).await);
}

async fn documents_of_other_tools_are_never_deleted_by_mistake(s: Stores) {
    let default = retention(doc! { "succeeded": "1s", "failed": "1s" });
    let q = kept_queue(&*s.a, "perl", Document::new()).await;
    let Some(db) = s._keep.downcast_ref::<mongodb::Database>() else {
        // The embedded store is written by Disbatch alone.
        return;
    };
    let old = DateTime::from_millis(1_000_000_000_000);
    let tasks = db.collection::<Document>("tasks");
    let docs = vec![
        doc! { "queue": q.id, "status": "1", "mtime": old, "ctime": old, "node": "perl", "params": {} },
        doc! { "queue": q.id, "status": 1, "mtime": 1_000_000_000_i64, "ctime": old, "node": "perl", "params": {} },
        doc! { "queue": q.id, "status": 1, "mtime": "2001-09-09", "ctime": old, "node": "perl", "params": {} },
        doc! { "queue": q.id, "status": 2, "ctime": old, "node": "perl", "params": {} },
        doc! { "queue": q.id.to_hex(), "status": 1, "mtime": old, "ctime": old, "node": "perl", "params": {} },
    ];
    tasks.insert_many(docs).await.unwrap();
    // A Perl-written one that reads: an Int64 status and a date: deleted.
    tasks
        .insert_one(doc! { "queue": q.id, "status": 1_i64, "mtime": old, "ctime": old, "node": "perl", "params": {}, "stdout": "x" })
        .await
        .unwrap();
    let swept = sweep(&*s.b, &default, DateTime::now(), Bounds::default())
        .await
        .unwrap();
    assert_eq!(swept.deleted, 1, "{swept:?}");
    assert_eq!(tasks.count_documents(doc! {}).await.unwrap(), 5);
}

/// A task of batch `b` in `q`, run to `code`.
async fn batch_task(s: &dyn Store, q: &Queue, b: &str, code: i32) -> ObjectId {
    let mut t = NewTask::queued(ObjectId::new(), doc! {});
    t.batch = Some(b.into());
    s.insert_tasks(q.id, vec![t.clone()]).await.unwrap();
    assert_eq!(end_next(s, q, code, false).await.0, t.id);
    t.id
}

async fn a_batchs_tasks_go_together_once_the_last_is_past(s: Stores) {
    let default = Retention::default();
    let q = kept_queue(&*s.a, "mixed", doc! { "succeeded": "1s", "failed": "2h" }).await;
    let other = kept_queue(&*s.a, "other", doc! { "succeeded": "1s", "failed": "3h" }).await;
    let unkept = kept_queue(&*s.a, "unkept", Document::new()).await;
    // A closed batch of mixed outcomes in one queue.
    s.a.insert_batch("mixed", Some(2)).await.unwrap();
    let ok = batch_task(&*s.a, &q, "mixed", status::SUCCEEDED).await;
    let bad = batch_task(&*s.a, &q, "mixed", status::FAILED).await;
    // A batch across two queues with retentions of their own.
    s.a.insert_batch("across", Some(2)).await.unwrap();
    let here = batch_task(&*s.a, &q, "across", status::SUCCEEDED).await;
    let there = batch_task(&*s.a, &other, "across", status::FAILED).await;
    // A batch with a task in a queue that keeps every task.
    s.a.insert_batch("forever", Some(2)).await.unwrap();
    let goes_alone = batch_task(&*s.a, &q, "forever", status::SUCCEEDED).await;
    let kept_for_good = batch_task(&*s.a, &unkept, "forever", status::SUCCEEDED).await;
    let all = [ok, bad, here, there, goes_alone, kept_for_good];

    // An hour on, every succeeded task is past its time, no failed one: all stay.
    let swept = sweep(&*s.b, &default, later(HOUR), Bounds::default()).await.unwrap();
    assert_eq!(swept.deleted, 0, "{swept:?}");
    for id in all {
        assert!(exists(&*s.a, id).await, "task {id} stays with its batch");
    }
    let counts = s.a.batch_counts("mixed").await.unwrap();
    assert_eq!(
        (counts.get(&status::SUCCEEDED), counts.get(&status::FAILED)),
        (Some(&1), Some(&1)),
        "the batch's outcome is unchanged"
    );
    // Past two hours the first batch goes whole; past three, the second.
    let swept = sweep(&*s.b, &default, later(2 * HOUR + 60_000), Bounds::default())
        .await
        .unwrap();
    assert_eq!(swept.deleted, 2, "{swept:?}");
    assert!(!exists(&*s.a, ok).await && !exists(&*s.a, bad).await);
    assert!(exists(&*s.a, here).await && exists(&*s.a, there).await);
    let swept = sweep(&*s.b, &default, later(3 * HOUR + 60_000), Bounds::default())
        .await
        .unwrap();
    assert_eq!(swept.deleted, 2, "{swept:?}");
    assert!(!exists(&*s.a, here).await && !exists(&*s.a, there).await);
    // A batch with a task kept for good keeps all its tasks.
    let swept = sweep(&*s.b, &default, later(1000 * HOUR), Bounds::default())
        .await
        .unwrap();
    assert_eq!(swept.deleted, 0, "{swept:?}");
    assert!(exists(&*s.a, goes_alone).await && exists(&*s.a, kept_for_good).await);
}

async fn a_batch_deleted_in_part_is_closed_and_its_last_tasks_go_too(s: Stores) {
    let default = Retention::default();
    let q = kept_queue(&*s.a, "parts", doc! { "succeeded": "1s", "failed": "1s" }).await;
    s.a.insert_batch("big", Some(12)).await.unwrap();
    let mut ids = Vec::new();
    for i in 0..12 {
        let code = if i % 3 == 0 { status::FAILED } else { status::SUCCEEDED };
        ids.push(batch_task(&*s.a, &q, "big", code).await);
    }
    // An open batch beside it (a task short of its size) is never closed.
    s.a.insert_batch("short", Some(2)).await.unwrap();
    let waiting = batch_task(&*s.a, &q, "short", status::SUCCEEDED).await;
    let batch = s.a.batch("big").await.unwrap().unwrap();
    assert!(complete(&batch, &s.a.batch_counts("big").await.unwrap()));
    assert_eq!(batch.closed, None);

    // A look of two writes of five tasks deletes its eight succeeded tasks (five, then
    // three) and closes the batch first: its four failed tasks left still read complete.
    let small = Bounds { batch: 5, batches: 2 };
    let swept = sweep(&*s.b, &default, later(HOUR), small).await.unwrap();
    assert_eq!(swept, Swept { deleted: 8, more: true });
    let batch = s.a.batch("big").await.unwrap().unwrap();
    let counts = s.a.batch_counts("big").await.unwrap();
    assert_eq!(counts.get(&status::FAILED), Some(&4), "{counts:?}");
    assert!(batch.closed.is_some(), "{batch:?}");
    assert!(complete(&batch, &counts), "{batch:?} {counts:?}");

    // The next look deletes the last four, though the batch now has fewer than its size.
    let swept = sweep(&*s.b, &default, later(HOUR), small).await.unwrap();
    assert_eq!(swept.deleted, 4, "{swept:?}");
    for id in ids {
        assert!(!exists(&*s.a, id).await, "task {id} of the closed batch stays");
    }
    assert!(exists(&*s.a, waiting).await);
    assert_eq!(s.a.batch("short").await.unwrap().unwrap().closed, None);
}

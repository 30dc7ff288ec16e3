//! The writer: group commits, failures, priorities and its bound.

use super::*;
use std::sync::mpsc;

/// A plain connection with foreign keys checked, so that a deferred constraint makes
/// COMMIT fail.
fn connect(path: &Path) -> StoreResult<Connection> {
    let c = Connection::open(path).map_err(|e| StoreError::Database(e.to_string()))?;
    c.execute_batch("PRAGMA foreign_keys = ON")
        .map_err(|e| StoreError::Database(e.to_string()))?;
    Ok(c)
}

/// A database file in `dir` holding the table `t (id INTEGER)`.
fn file_with_table(dir: &tempfile::TempDir) -> PathBuf {
    let path = dir.path().join("w.db");
    connect(&path)
        .unwrap()
        .execute_batch("CREATE TABLE t (id INTEGER)")
        .unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_group_commit_runs_each_write_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.db");
    connect(&path)
        .unwrap()
        .execute_batch(
            "CREATE TABLE parent (id INTEGER PRIMARY KEY);
             CREATE TABLE child (id INTEGER PRIMARY KEY,
                 parent INTEGER REFERENCES parent(id) DEFERRABLE INITIALLY DEFERRED);",
        )
        .unwrap();
    let writer = Writer::start(path.clone(), connect).unwrap();

    // A first write holds the writer until the next two are queued behind it, so that
    // those two go into one group (the blocker's, or the next).
    let (started_tx, started) = mpsc::channel();
    let (release, released) = mpsc::channel::<()>();
    let released = Mutex::new(released);
    let (blocker, blocked) = pending("block", move |tx| {
        let _ = started_tx.send(());
        let _ = released.lock().unwrap().recv();
        tx.execute("INSERT INTO parent (id) VALUES (1)", []).unwrap();
        Ok(())
    });
    writer.send("block", blocker, Priority::Ordinary).await.unwrap();
    started.recv().unwrap();
    // Its savepoint succeeds; the deferred foreign key fails the group's commit.
    let (bad, bad_answer) = pending("bad", |tx| {
        tx.execute("INSERT INTO child (id, parent) VALUES (10, 99)", [])
            .map_err(|e| StoreError::Rejected(e.to_string()))?;
        Ok(())
    });
    let (good, good_answer) = pending("good", |tx| {
        tx.execute("INSERT INTO child (id, parent) VALUES (11, 1)", [])
            .map_err(|e| StoreError::Rejected(e.to_string()))?;
        Ok(())
    });
    writer.send("bad", bad, Priority::Ordinary).await.unwrap();
    writer.send("good", good, Priority::Ordinary).await.unwrap();
    release.send(()).unwrap();
    // The blocker may share the group and run again alone: it does not wait then.
    drop(release);

    blocked.await.unwrap().unwrap();
    let bad = bad_answer.await.unwrap();
    assert!(
        matches!(&bad, Err(StoreError::Rejected(m)) if m.contains("FOREIGN KEY")),
        "{bad:?}"
    );
    good_answer.await.unwrap().unwrap();
    let rows: Vec<i64> = {
        let c = connect(&path).unwrap();
        let mut stmt = c.prepare("SELECT id FROM child ORDER BY id").unwrap();
        stmt.query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    };
    assert_eq!(rows, vec![11], "only the good write is committed");
    // The failed group commit counts nothing; the blocker's commit (alone or in its own
    // group first) and the good write's, alone, count one each.
    assert_eq!(writer.commits().load(Ordering::SeqCst), 2);
}

/// Writes waiting when the writer thread starts share one transaction: three writes, one
/// group commit, counted as one write transaction; a write alone counts one more.
#[tokio::test]
async fn a_group_commit_counts_as_one_write_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let path = file_with_table(&dir);
    let insert = |i: i64| {
        pending("insert", move |tx| {
            tx.execute("INSERT INTO t (id) VALUES (?1)", [i])
                .map_err(|e| StoreError::Rejected(e.to_string()))
        })
    };
    let (queues, commits) = (Queues::new(), Arc::new(AtomicU64::new(0)));
    let mut answers = Vec::new();
    for i in 0..3 {
        let (job, answer) = insert(i);
        queues.push(job, Priority::Ordinary).await;
        answers.push(answer);
    }
    let _alive = spawn(&path, connect, &queues, &commits).unwrap();
    for answer in answers {
        assert_eq!(answer.await.unwrap().unwrap(), 1);
    }
    assert_eq!(commits.load(Ordering::SeqCst), 1, "three writes, one group commit");
    let (job, answer) = insert(3);
    queues.push(job, Priority::Ordinary).await;
    answer.await.unwrap().unwrap();
    assert_eq!(commits.load(Ordering::SeqCst), 2);
    queues.close();
    let rows: i64 = connect(&path)
        .unwrap()
        .query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, 4);
}

/// The store's count adds the writes of its pooled connections (a new queue) to the
/// writer's (new tasks), and reads count nothing.
#[tokio::test]
async fn the_store_counts_pooled_writes_and_no_reads() {
    use crate::store::sqlite::SqliteStore;
    use crate::store::{NewQueue, NewTask, Store};
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("s.db")).await.unwrap();
    let opened = store.write_transactions();
    assert!(opened > 0, "creating the schema commits on a pooled connection");
    store.ensure_indexes().await.unwrap();
    assert_eq!(
        store.write_transactions(),
        opened,
        "the schema in place, nothing to write"
    );
    let queue = store
        .create_queue(NewQueue {
            name: "q".into(),
            plugin: "demo".into(),
            threads: Some(1),
            sort: crate::model::Sort::Fifo,
            extra: bson::doc! {},
        })
        .await
        .unwrap();
    assert_eq!(store.write_transactions(), opened + 1, "one pooled write");
    let task = NewTask::queued(bson::oid::ObjectId::new(), bson::doc! {});
    store.insert_tasks(queue.id, vec![task]).await.unwrap();
    assert_eq!(store.write_transactions(), opened + 2, "one write of the writer");
    store.queues().await.unwrap();
    store.task(queue.id).await.unwrap();
    assert_eq!(store.write_transactions(), opened + 2, "reads count nothing");
}

#[tokio::test]
async fn a_write_panicking_is_answered_and_the_writer_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let path = file_with_table(&dir);
    let writer = Writer::start(path.clone(), connect).unwrap();
    let panicked = writer
        .write("panics", |_tx| -> StoreResult<()> { panic!("boom") })
        .await;
    assert!(matches!(panicked, Err(StoreError::Rejected(_))), "{panicked:?}");
    writer
        .write("insert", |tx| {
            tx.execute("INSERT INTO t (id) VALUES (1)", [])
                .map_err(|e| StoreError::Rejected(e.to_string()))
        })
        .await
        .unwrap();
}

/// The writer held by a first write while many large writes queue up behind it: no
/// more than [`queue::MAX_QUEUED`] are queued at once (the rest wait for room), and a
/// liveness write made after all of them is committed before most of them, within a
/// bound far below `heartbeat_stale` (30 s by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_goes_before_a_full_queue_of_large_writes() {
    use super::queue::MAX_QUEUED;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.db");
    connect(&path)
        .unwrap()
        .execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE t (id INTEGER, data BLOB)")
        .unwrap();
    let writer = Arc::new(Writer::start(path.clone(), connect).unwrap());
    let (started_tx, started) = mpsc::channel();
    let (release, released) = mpsc::channel::<()>();
    let released = Mutex::new(released);
    let (blocker, blocked) = pending("block", move |_tx| {
        let _ = started_tx.send(());
        let _ = released.lock().unwrap().recv();
        Ok(())
    });
    writer.send("block", blocker, Priority::Ordinary).await.unwrap();
    started.recv().unwrap();
    let large: Vec<_> = (0..2 * MAX_QUEUED)
        .map(|i| {
            let w = writer.clone();
            tokio::spawn(async move {
                w.write("large", move |tx| {
                    tx.execute("INSERT INTO t (id, data) VALUES (?1, zeroblob(65536))", [i as i64])
                        .map_err(|e| StoreError::Rejected(e.to_string()))?;
                    Ok(())
                })
                .await
            })
        })
        .collect();
    let filled = Instant::now();
    while writer.queues.held().1 < MAX_QUEUED {
        assert!(filled.elapsed() < Duration::from_secs(60), "the queue never filled");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The blocker holds one place; the others wait for room.
    assert_eq!(writer.queues.held(), (0, MAX_QUEUED));
    let asked = Instant::now();
    let heartbeat = {
        let w = writer.clone();
        tokio::spawn(async move {
            w.write_as(Priority::Liveness, "heartbeat", |tx| {
                tx.execute("INSERT INTO t (id) VALUES (-1)", [])
                    .map_err(|e| StoreError::Rejected(e.to_string()))?;
                Ok(())
            })
            .await
        })
    };
    while writer.queues.held().0 < 1 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    release.send(()).unwrap();
    drop(release);
    heartbeat.await.unwrap().unwrap();
    let took = asked.elapsed();
    let answered = large.iter().filter(|h| h.is_finished()).count();
    assert!(
        answered < MAX_QUEUED,
        "{answered} of the {} large writes queued before the heartbeat were answered before it",
        2 * MAX_QUEUED
    );
    assert!(took < Duration::from_secs(10), "the heartbeat took {took:?}");
    blocked.await.unwrap().unwrap();
    for h in large {
        h.await.unwrap().unwrap();
    }
    let rows: i64 = connect(&path)
        .unwrap()
        .query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, 2 * MAX_QUEUED as i64 + 1);
    // A place is given back once the writer thread has sent its answer, so the last
    // ones may come back just after their callers woke.
    let drained = Instant::now();
    while writer.queues.held() != (0, 0) {
        assert!(
            drained.elapsed() < Duration::from_secs(60),
            "held {:?}",
            writer.queues.held()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

//! Queue and node documents on both stores: one reader and one set of checks. Documents
//! another tool wrote (Disbatch 4's Perl tools write numbers as strings; a hand edit can
//! leave a field of the wrong type) are written raw here, past the store, and must read
//! the same on MongoDB and SQLite; an `update_queue` that fails has written nothing.

use disbatch::model::UnreadableQueue;

use super::*;

on_both_stores!(
    extra_fields_may_set_neither_core_fields_nor_operators,
    numbers_written_as_strings_are_read,
    unreadable_queues_are_listed_with_their_problem,
    a_change_that_would_make_a_queue_unreadable_is_refused_and_not_written,
    an_unreadable_queue_can_be_changed_and_stays_listed_with_its_problem,
    a_node_with_an_unreadable_maxthreads_is_kept_with_its_problem,
);

/// The database under a pair of stores, for writes that bypass the store.
enum Raw {
    Mongo(mongodb::Database),
    Sqlite(rusqlite::Connection),
}

fn raw(s: &Stores) -> Raw {
    if let Some(db) = s._keep.downcast_ref::<mongodb::Database>() {
        return Raw::Mongo(db.clone());
    }
    let dir = s
        ._keep
        .downcast_ref::<tempfile::TempDir>()
        .expect("a MongoDB database or a SQLite directory");
    let conn = rusqlite::Connection::open(dir.path().join("disbatch.db")).expect("open the SQLite file");
    conn.busy_timeout(Duration::from_secs(60)).expect("busy timeout");
    Raw::Sqlite(conn)
}

/// Inserts the queue document `d` (with its `_id`) as another tool would.
async fn insert_raw_queue(s: &Stores, d: Document) {
    match raw(s) {
        Raw::Mongo(db) => {
            db.collection::<Document>("queues")
                .insert_one(d)
                .await
                .expect("insert queue");
        }
        Raw::Sqlite(conn) => {
            let mut d = d;
            let id = d.get_object_id("_id").expect("an _id").to_hex();
            d.remove("_id");
            let name = d.get_str("name").expect("a name").to_string();
            let mut bytes = Vec::new();
            d.to_writer(&mut bytes).expect("BSON");
            conn.execute(
                "INSERT INTO queues (id, name, doc) VALUES (?1, ?2, ?3)",
                rusqlite::params![id, name, bytes],
            )
            .expect("insert queue");
        }
    }
}

/// The stored queue document `id`, read past the store (without `_id`).
async fn raw_queue(s: &Stores, id: ObjectId) -> Document {
    match raw(s) {
        Raw::Mongo(db) => {
            let mut d = db
                .collection::<Document>("queues")
                .find_one(doc! { "_id": id })
                .await
                .expect("find queue")
                .expect("the queue");
            d.remove("_id");
            d
        }
        Raw::Sqlite(conn) => {
            let bytes: Vec<u8> = conn
                .query_row("SELECT doc FROM queues WHERE id = ?1", [id.to_hex()], |r| r.get(0))
                .expect("the queue");
            Document::from_reader(&mut &bytes[..]).expect("BSON")
        }
    }
}

/// Sets node `node`'s `maxthreads` to the text `value`, as a hand edit would.
async fn set_raw_maxthreads(s: &Stores, node: &str, value: &str) {
    match raw(s) {
        Raw::Mongo(db) => {
            let r = db
                .collection::<Document>("nodes")
                .update_one(doc! { "node": node }, doc! { "$set": { "maxthreads": value } })
                .await
                .expect("update node");
            assert_eq!(r.matched_count, 1);
        }
        Raw::Sqlite(conn) => {
            let n = conn
                .execute(
                    "UPDATE nodes SET maxthreads = ?1 WHERE node = ?2",
                    rusqlite::params![value, node],
                )
                .expect("update node");
            assert_eq!(n, 1);
        }
    }
}

fn invalid_message<T: std::fmt::Debug>(r: Result<T, StoreError>) -> String {
    match r {
        Err(StoreError::Invalid(m)) => m,
        other => panic!("expected an Invalid error, got {other:?}"),
    }
}

async fn unreadable(s: &dyn Store) -> Vec<UnreadableQueue> {
    s.unreadable_queues().await.unwrap()
}

async fn extra_fields_may_set_neither_core_fields_nor_operators(s: Stores) {
    for key in ["threads", "_id", "$set", "$where"] {
        let mut q = new_queue("q", Some(1), Sort::Fifo);
        q.extra = doc! { key: 1 };
        let m = invalid_message(s.a.create_queue(q).await);
        assert_eq!(m, format!("field {key:?} cannot be set as an extra queue field"));
    }
    assert!(s.a.queues().await.unwrap().is_empty(), "nothing was created");
    let q = queue(&*s.a, "q", 1, Sort::Fifo).await;
    for key in ["name", "$unset"] {
        let update = QueueUpdate {
            extra: doc! { key: "x" },
            ..Default::default()
        };
        let m = invalid_message(s.b.update_queue(q.id, update).await);
        assert_eq!(m, format!("field {key:?} cannot be set as an extra queue field"));
    }
    assert_eq!(s.a.queues().await.unwrap(), vec![q.clone()], "nothing was changed");
    assert!(!raw_queue(&s, q.id).await.keys().any(|k| k.starts_with('$')));
}

async fn numbers_written_as_strings_are_read(s: Stores) {
    let id = ObjectId::new();
    insert_raw_queue(
        &s,
        doc! { "_id": id, "name": "perl", "plugin": "demo", "threads": "2", "maxthreads": "1", "sort": "fifo" },
    )
    .await;
    let queues = s.a.queues().await.unwrap();
    let q = queues
        .iter()
        .find(|q| q.id == id)
        .expect("the queue written by Disbatch 4 is listed");
    assert_eq!((q.threads, q.maxthreads, q.sort), (Some(2), Some(1), Sort::Fifo));
    assert_eq!(q.limit(), 1);
    assert!(unreadable(&*s.b).await.is_empty());
}

async fn unreadable_queues_are_listed_with_their_problem(s: Stores) {
    let good = queue(&*s.a, "good", 1, Sort::Fifo).await;
    let id = ObjectId::new();
    insert_raw_queue(
        &s,
        doc! { "_id": id, "name": "bad", "plugin": "demo", "threads": 2, "on_orphan": 5 },
    )
    .await;
    assert_eq!(
        s.a.queues().await.unwrap(),
        vec![good],
        "an unreadable queue is never run"
    );
    let listed = unreadable(&*s.b).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    let u = &listed[0];
    assert_eq!(
        (u.id, u.name.as_deref(), u.plugin.as_deref(), u.threads),
        (id, Some("bad"), Some("demo"), Some(2))
    );
    assert!(
        u.problem.contains("`on_orphan`"),
        "the problem names the field: {}",
        u.problem
    );
}

async fn a_change_that_would_make_a_queue_unreadable_is_refused_and_not_written(s: Stores) {
    let q = queue(&*s.a, "q", 2, Sort::Fifo).await;
    let before = raw_queue(&s, q.id).await;
    for extra in [
        doc! { "on_orphan": 5 },
        doc! { "sandbox": { "bogus": 1 } },
        doc! { "retry": "often" },
    ] {
        let update = QueueUpdate {
            threads: Some(Some(7)),
            extra: extra.clone(),
            ..Default::default()
        };
        let m = invalid_message(s.b.update_queue(q.id, update).await);
        let field = extra.keys().next().unwrap();
        assert!(m.contains(&format!("`{field}`")), "the error names the field: {m}");
        assert_eq!(raw_queue(&s, q.id).await, before, "nothing was written for {extra}");
        assert_eq!(s.a.queues().await.unwrap(), vec![q.clone()]);
        assert!(unreadable(&*s.a).await.is_empty());
    }
}

async fn an_unreadable_queue_can_be_changed_and_stays_listed_with_its_problem(s: Stores) {
    let id = ObjectId::new();
    insert_raw_queue(&s, doc! { "_id": id, "name": "bad", "plugin": "demo", "on_orphan": 5 }).await;
    let update = QueueUpdate {
        threads: Some(Some(3)),
        ..Default::default()
    };
    let changed = s.a.update_queue(id, update).await.unwrap().expect("the queue");
    let QueueState::Unreadable(u) = changed else {
        panic!("the queue is still unreadable: {changed:?}");
    };
    assert_eq!((u.id, u.threads), (id, Some(3)));
    assert!(u.problem.contains("`on_orphan`"), "{}", u.problem);
    assert_eq!(unreadable(&*s.b).await, vec![u], "listed as changed, with its problem");
    assert!(s.b.queues().await.unwrap().is_empty());

    let fix = QueueUpdate {
        extra: doc! { "on_orphan": "requeue" },
        ..Default::default()
    };
    let fixed = s.b.update_queue(id, fix).await.unwrap().and_then(QueueState::readable);
    let fixed = fixed.expect("the fixed queue reads");
    assert_eq!((fixed.threads, fixed.on_orphan), (Some(3), OnOrphan::Requeue));
    assert_eq!(s.a.queues().await.unwrap(), vec![fixed]);
    assert!(unreadable(&*s.a).await.is_empty());
}

async fn a_node_with_an_unreadable_maxthreads_is_kept_with_its_problem(s: Stores) {
    let p = NodeProcess::this_process();
    assert_eq!(
        disbatch::lifecycle::nodes::take(&*s.a, "n", &p, stale_before())
            .await
            .unwrap(),
        None
    );
    set_raw_maxthreads(&s, "n", "lots").await;

    let nodes = s.b.nodes().await.unwrap();
    let n = nodes.iter().find(|n| n.node == "n").expect("the node is listed");
    assert_eq!(n.maxthreads, Some(0), "an unreadable limit claims nothing");
    let problem = n.problem.as_deref().expect("the node shows its problem");
    assert!(problem.contains("`maxthreads`"), "{problem}");

    let beat = s.a.heartbeat("n", LEASE).await.unwrap();
    assert_eq!(beat.maxthreads, Some(0));
    assert_eq!(
        disbatch::lifecycle::nodes::take(&*s.b, "n", &p, stale_before())
            .await
            .unwrap(),
        None,
        "its holder takes the name again"
    );
    assert!(
        disbatch::lifecycle::nodes::set_maxthreads(&*s.a, "n", Some(2))
            .await
            .unwrap(),
        "fixed through the store"
    );
    let n = s.b.heartbeat("n", LEASE).await.unwrap();
    assert_eq!((n.maxthreads, n.problem), (Some(2), None));
    let m = invalid_message(disbatch::lifecycle::nodes::set_maxthreads(&*s.a, "n", Some(-1)).await);
    assert!(m.contains("maxthreads"), "{m}");
}

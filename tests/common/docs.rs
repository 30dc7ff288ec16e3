//! Spec documents written with the plain driver, the way any other Disbatch 4 client writes
//! them, and a runner shared by a test binary.

use std::sync::OnceLock;

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use disbatch::runner::{EngineOptions, Runner};
use mongodb::Database;

/// Inserts a queue (`threads` 4, `sort` fifo) with `extra` fields over those.
pub async fn insert_queue(db: &Database, name: &str, plugin: &str, extra: Document) -> ObjectId {
    let mut q = doc! {"name": name, "plugin": plugin, "threads": 4, "sort": "fifo"};
    q.extend(extra);
    db.collection::<Document>("queues")
        .insert_one(q)
        .await
        .unwrap()
        .inserted_id
        .as_object_id()
        .unwrap()
}

fn task_doc(queue: ObjectId, status: i32, params: Bson, now: DateTime) -> Document {
    doc! {"queue": queue, "status": status, "node": Bson::Null, "params": params,
    "ctime": now, "mtime": now, "stdout": Bson::Null, "stderr": Bson::Null}
}

/// Inserts one task with `status` and `params`.
pub async fn insert_task(db: &Database, queue: ObjectId, status: i32, params: impl Into<Bson>) -> ObjectId {
    db.collection::<Document>("tasks")
        .insert_one(task_doc(queue, status, params.into(), DateTime::now()))
        .await
        .unwrap()
        .inserted_id
        .as_object_id()
        .unwrap()
}

/// Inserts queued tasks with these params, in batches; returns their ids in order.
pub async fn insert_tasks(db: &Database, queue: ObjectId, params: impl Iterator<Item = Document>) -> Vec<ObjectId> {
    let now = DateTime::now();
    let docs: Vec<Document> = params.map(|p| task_doc(queue, -2, Bson::Document(p), now)).collect();
    let mut ids = Vec::with_capacity(docs.len());
    for batch in docs.chunks(5000) {
        let r = db
            .collection::<Document>("tasks")
            .insert_many(batch.to_vec())
            .await
            .unwrap();
        let mut got: Vec<(usize, ObjectId)> = r
            .inserted_ids
            .into_iter()
            .map(|(i, id)| (i, id.as_object_id().unwrap()))
            .collect();
        got.sort();
        ids.extend(got.into_iter().map(|(_, id)| id));
    }
    ids
}

/// Number of tasks matching `filter`.
pub async fn count_tasks(db: &Database, filter: Document) -> u64 {
    db.collection::<Document>("tasks")
        .count_documents(filter)
        .await
        .unwrap()
}

/// Every document of `collection` matching `filter`.
pub async fn find_docs(db: &Database, collection: &str, filter: Document) -> Vec<Document> {
    use futures::TryStreamExt;
    db.collection::<Document>(collection)
        .find(filter)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap()
}

/// One task document.
pub async fn task_doc_of(db: &Database, id: ObjectId) -> Document {
    db.collection::<Document>("tasks")
        .find_one(doc! {"_id": id})
        .await
        .unwrap()
        .expect("task exists")
}

/// A runner shared by the tests of this binary (its own component cache directory).
pub fn shared_runner() -> Runner {
    static RUNNER: OnceLock<Runner> = OnceLock::new();
    RUNNER
        .get_or_init(|| {
            Runner::new(&EngineOptions {
                cache_dir: Some(tempfile::tempdir().unwrap().keep()),
                max_instances: 256,
            })
            .unwrap()
        })
        .clone()
}

//! `POST /tasks` against the real test database server: a failure midway answers with the
//! tasks already created; the collection form requires `filter` and reads only the fields
//! its params use.

use crate::common;

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use axum::http::StatusCode;
use bson::oid::ObjectId;
use bson::{doc, Document};
use disbatch::api::DocumentSource;
use serde_json::{json, Value};

use common::http::{assert_bad, get, post, setup};

fn ids(v: &Value) -> Vec<ObjectId> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list of ids: {v}"))
        .iter()
        .map(|id| ObjectId::parse_str(id.as_str().unwrap()).unwrap())
        .collect()
}

async fn exists(db: &mongodb::Database, id: ObjectId) -> bool {
    db.collection::<Document>("tasks")
        .count_documents(doc! {"_id": id})
        .await
        .unwrap()
        == 1
}

#[tokio::test]
async fn a_batch_refused_midway_answers_with_the_tasks_created() {
    let (db, app) = setup("api_create_partial", |_| {}).await;
    post(&app, "/queues", json!({"name": "q", "plugin": "demo"})).await;
    // The operators' validator refuses params marked bad: the second batch of 1000 fails
    // at its 501st task, after the first batch and 500 of the second were inserted.
    db.db
        .run_command(doc! {
            "collMod": "tasks",
            "validator": { "params.bad": { "$exists": false } },
        })
        .await
        .unwrap();
    let mut params: Vec<Value> = (0..2500).map(|i| json!({"n": i})).collect();
    params[1500] = json!({"n": 1500, "bad": true});
    let r = post(&app, "/tasks", json!({"queue": "q", "params": params})).await;
    assert!(r.status.is_server_error(), "{} {}", r.status, r.text);
    let body = r.json();
    let error = r.error();
    assert!(error.contains("created 1000 of 2500 tasks"), "{error}");
    assert_eq!(body["count"], 1000, "{error}");
    let created = ids(&body["ids"]);
    let unconfirmed = ids(&body["unconfirmed"]);
    assert_eq!((created.len(), unconfirmed.len()), (1000, 1000));
    for id in &created {
        assert!(exists(&db.db, *id).await, "created task {id} exists");
    }
    // The refused batch: what the ordered insert did before the refusal exists, the rest not.
    for (i, id) in unconfirmed.iter().enumerate() {
        assert_eq!(exists(&db.db, *id).await, i < 500, "unconfirmed task {i} ({id})");
    }
    let count = get(&app, "/tasks?queue=q&count=1").await.json();
    assert_eq!(count["count"], 1500);
}

#[tokio::test]
async fn a_first_batch_refused_answers_with_none_created() {
    let (db, app) = setup("api_create_none", |_| {}).await;
    post(&app, "/queues", json!({"name": "q", "plugin": "demo"})).await;
    db.db
        .run_command(doc! { "collMod": "tasks", "validator": { "params.bad": { "$exists": false } } })
        .await
        .unwrap();
    let r = post(&app, "/tasks", json!({"queue": "q", "params": [{"bad": 1}, {"n": 2}]})).await;
    assert!(r.status.is_server_error(), "{} {}", r.status, r.text);
    let body = r.json();
    assert_eq!(body["count"], 0);
    assert_eq!(ids(&body["ids"]), vec![]);
    assert_eq!(ids(&body["unconfirmed"]).len(), 2);
    assert!(r.error().contains("created 0 of 2 tasks"), "{}", r.error());
}

#[tokio::test]
async fn the_collection_form_requires_a_filter() {
    let (db, app) = setup("api_create_filter", |_| {}).await;
    post(&app, "/queues", json!({"name": "q", "plugin": "demo"})).await;
    db.db
        .collection::<Document>("people")
        .insert_many([doc! {"name": "a"}, doc! {"name": "b"}])
        .await
        .unwrap();
    let r = post(
        &app,
        "/tasks",
        json!({"queue": "q", "collection": "people", "params": {"who": "document.name"}}),
    )
    .await;
    assert_bad(&r, "field \"filter\" is required");
    assert_eq!(get(&app, "/tasks?queue=q&count=1").await.json()["count"], 0);
    // An explicit {} still means every document.
    let r = post(
        &app,
        "/tasks",
        json!({"queue": "q", "collection": "people", "filter": {}, "params": {"who": "document.name"}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json()["count"], 2);
}

/// A document source that records the projections it is asked for.
struct Recorded {
    db: mongodb::Database,
    projections: Mutex<Vec<Option<Document>>>,
}

#[async_trait]
impl DocumentSource for Recorded {
    async fn find(
        &self,
        collection: &str,
        filter: Document,
        projection: Option<Document>,
        limit: i64,
    ) -> Result<Vec<Document>, String> {
        self.projections.lock().unwrap().push(projection.clone());
        let projected = projection.is_some();
        let docs = self.db.find(collection, filter, projection, limit).await?;
        for d in &docs {
            assert!(
                !projected || !d.contains_key("blob"),
                "a projected read returned the unused field: {d}"
            );
        }
        Ok(docs)
    }
}

#[tokio::test]
async fn the_collection_form_reads_only_the_fields_its_params_use() {
    let db = common::test_db("api_create_projection").await;
    let source = Arc::new(Recorded {
        db: db.db.clone(),
        projections: Mutex::new(Vec::new()),
    });
    let state_source = source.clone();
    // The tasks go to the router's own database; the documents are read from `db`.
    let (_tasks_db, app) = setup("api_create_projection_app", move |s| {
        s.documents = Some(state_source as Arc<dyn DocumentSource>);
    })
    .await;
    post(&app, "/queues", json!({"name": "q", "plugin": "demo"})).await;
    let blob = "x".repeat(1 << 20);
    let people: Vec<Document> = (0..4)
        .map(|i| doc! {"name": format!("p{i}"), "tags": ["a", format!("t{i}")], "addr": {"city": format!("c{i}")}, "blob": &blob})
        .collect();
    db.db
        .collection::<Document>("people")
        .insert_many(people)
        .await
        .unwrap();
    let r = post(
        &app,
        "/tasks",
        json!({"queue": "q", "collection": "people", "filter": {"name": {"$in": ["p1", "p2"]}},
               "params": {"who": "document.name", "tag": "document.tags.1", "city": "document.addr.city", "kind": 7}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json()["count"], 2);
    assert_eq!(
        source.projections.lock().unwrap().last().unwrap(),
        &Some(doc! {"name": 1, "tags": 1, "addr": 1, "_id": 0})
    );
    let tasks = get(&app, "/tasks?queue=q").await.json();
    let mut got: Vec<Value> = tasks.as_array().unwrap().iter().map(|t| t["params"].clone()).collect();
    got.sort_by_key(|p| p["who"].as_str().unwrap().to_owned());
    assert_eq!(
        got,
        vec![
            json!({"who": "p1", "tag": "t1", "city": "c1", "kind": 7}),
            json!({"who": "p2", "tag": "t2", "city": "c2", "kind": 7}),
        ]
    );
    // "document" needs the whole document: no projection.
    let r = post(
        &app,
        "/tasks",
        json!({"queue": "q", "collection": "people", "filter": {"name": "p3"}, "params": {"doc": "document"}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(source.projections.lock().unwrap().last().unwrap(), &None);
}

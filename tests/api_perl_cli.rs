//! The DCI as Disbatch 4's Perl tools see it, on both stores: every verb of the Perl
//! `disbatch` CLI sends here exactly the request it sends (LWP forms for create-queue and
//! update-queue, JSON for create-task(s), a GET with a JSON body of dot options for tasks),
//! and the fields it reads from the answer are checked. Also: forms from other sites
//! refused, `/monitoring` and `/info` as Disbatch 4's monitoring reads them, node
//! timestamps in epoch milliseconds, repeated keys as `$or`.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use bson::doc;
use disbatch::api::{router, ApiState, SHAPE_HEADER};
use disbatch::store::sqlite::SqliteStore;
use disbatch::store::Store;
use serde_json::{json, Value};

use common::http::{send_request, Reply};

const FORM: &str = "application/x-www-form-urlencoded";
const JSON: &str = "application/json";

/// A request as LWP::UserAgent sends it: `Host`, its user agent, the body's type.
async fn perl(app: &Router, method: Method, uri: &str, content_type: Option<&str>, body: &str) -> Reply {
    perl_with(app, method, uri, content_type, body, &[]).await
}

async fn perl_with(
    app: &Router,
    method: Method,
    uri: &str,
    content_type: Option<&str>,
    body: &str,
    headers: &[(&str, &str)],
) -> Reply {
    let mut req = Request::builder()
        .method(method)
        .uri(uri)
        .header(header::HOST, "localhost:8080")
        .header(header::USER_AGENT, "libwww-perl/6.72");
    if let Some(t) = content_type {
        req = req.header(header::CONTENT_TYPE, t);
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    send_request(app, req.body(Body::from(body.to_owned())).unwrap()).await
}

/// The JSON body of `disbatch tasks [FILTER] [options]`: every dot option with the CLI's
/// defaults (`.limit` 20, the flags 0, `.fields` null), then the filter's keys.
fn tasks_body(options: Value, filter: Value) -> String {
    let mut body = json!({".count": 0, ".fields": null, ".limit": 20, ".skip": 0, ".terse": 0,
                          ".full": 0, ".epoch": 0, ".pretty": 0});
    for (k, v) in options.as_object().unwrap().iter().chain(filter.as_object().unwrap()) {
        body[k] = v.clone();
    }
    body.to_string()
}

fn ok(r: &Reply) -> Value {
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    r.json()
}

/// `$result->{'MongoDB::InsertManyResult'}{inserted}`'s ids, as `disbatch create-tasks`
/// prints them.
fn inserted(v: &Value) -> Vec<String> {
    v["MongoDB::InsertManyResult"]["inserted"]
        .as_array()
        .unwrap_or_else(|| panic!("no MongoDB::InsertManyResult: {v}"))
        .iter()
        .map(|e| e["_id"]["$oid"].as_str().unwrap().to_owned())
        .collect()
}

async fn every_verb(app: Router, store: Arc<dyn Store>, collections: bool) {
    // plugins
    let v = ok(&perl(&app, Method::GET, "/plugins", None, "").await);
    assert_eq!(v, json!(["demo", "fail"]));

    // create-queue fizz demo: a form; the CLI prints $result->{id}{'$oid'}.
    let v = ok(&perl(&app, Method::POST, "/queues", Some(FORM), "name=fizz&plugin=demo").await);
    let qid = v["id"]["$oid"]
        .as_str()
        .unwrap_or_else(|| panic!("no id.$oid: {v}"))
        .to_owned();
    assert_eq!(v["MongoDB::InsertOneResult"]["inserted_id"]["$oid"], qid.as_str());
    let r = perl(
        &app,
        Method::POST,
        "/queues",
        Some(FORM),
        "name=x&plugin=Disbatch%3A%3APlugin%3A%3AFake",
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert!(r.error().contains("\"plugin\""), "{}", r.text);

    // update-queue <id> threads 3: a form; the CLI reads MongoDB::UpdateResult's modified_count.
    let uri = format!("/queues/{qid}");
    let v = ok(&perl(&app, Method::POST, &uri, Some(FORM), "threads=0").await);
    assert_eq!(v["MongoDB::UpdateResult"]["modified_count"], 1, "{v}");
    assert_eq!(v["MongoDB::UpdateResult"]["matched_count"], 1, "{v}");
    assert_eq!(v["threads"], 0);
    let v = ok(&perl(&app, Method::POST, &uri, Some(FORM), "threads=0").await);
    assert_eq!(v["MongoDB::UpdateResult"]["modified_count"], 0, "no change: {v}");
    let v = ok(&perl(&app, Method::POST, &uri, Some(FORM), "name=buzz").await);
    assert_eq!(
        (
            v["name"].as_str(),
            v["MongoDB::UpdateResult"]["modified_count"].as_u64()
        ),
        (Some("buzz"), Some(1))
    );
    let r = perl(&app, Method::POST, &uri, Some(FORM), "threads=zero").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.error().contains("\"threads\""), "{}", r.text);
    let r = perl(&app, Method::POST, &uri, Some(FORM), "bad=field").await;
    assert!(r.error().contains("\"bad\""), "{}", r.text);

    // queues: id plugin name threads queued running completed.
    let v = ok(&perl(&app, Method::GET, "/queues", None, "").await);
    let q = &v[0];
    assert_eq!(
        (q["id"].as_str(), q["name"].as_str(), q["plugin"].as_str()),
        (Some(qid.as_str()), Some("buzz"), Some("demo"))
    );
    for k in ["threads", "queued", "running", "completed"] {
        assert!(q[k].is_u64(), "{k} in {q}");
    }

    // create-task buzz user1 ashley: JSON {queue, params: [{…}]}.
    let body = json!({"queue": "buzz", "params": [{"user1": "ashley", "user2": "ashley"}]}).to_string();
    let v = ok(&perl(&app, Method::POST, "/tasks", Some(JSON), &body).await);
    let first = inserted(&v);
    assert_eq!(first.len(), 1);
    assert_eq!(v["MongoDB::InsertManyResult"]["inserted"][0]["index"], 0);
    // create-tasks <id> '[{"fizz":1},{"buzz":2}]'
    let body = json!({"queue": qid, "params": [{"fizz": 1}, {"buzz": 2}]}).to_string();
    let v = ok(&perl(&app, Method::POST, "/tasks", Some(JSON), &body).await);
    let more = inserted(&v);
    assert_eq!((more.len(), v["count"].as_u64()), (2, Some(2)));
    assert_eq!(v["ids"], json!(more));
    // params as one object: one task, as Disbatch 4 took it.
    let body = json!({"queue": "buzz", "params": {"single": true}}).to_string();
    assert_eq!(
        inserted(&ok(&perl(&app, Method::POST, "/tasks", Some(JSON), &body).await)).len(),
        1
    );
    // create-tasks --collection users <id> '{"filter": …, "params": …}'
    if collections {
        let body = json!({"filter": {"migration": "foo"}, "params": {"user": "document.username"},
                          "collection": "users", "queue": qid})
        .to_string();
        let v = ok(&perl(&app, Method::POST, "/tasks", Some(JSON), &body).await);
        assert_eq!(inserted(&v).len(), 2, "{v}");
    }
    let total = if collections { 6 } else { 4 };

    // tasks: a GET with a JSON body of dot options.
    let r = perl(
        &app,
        Method::GET,
        "/tasks",
        Some(JSON),
        &tasks_body(json!({}), json!({})),
    )
    .await;
    let all = ok(&r);
    assert_eq!(all.as_array().map(Vec::len), Some(total), "{all}");
    let newest = all[0]["_id"]["$oid"].as_str().unwrap().to_owned();
    let f = json!({"queue": qid});
    let v = ok(&perl(
        &app,
        Method::GET,
        "/tasks",
        Some(JSON),
        &tasks_body(json!({".count": 1}), f.clone()),
    )
    .await);
    assert_eq!(v, json!({"count": total}));
    // --limit 1: the task itself, not a list.
    let v = ok(&perl(
        &app,
        Method::GET,
        "/tasks",
        Some(JSON),
        &tasks_body(json!({".limit": 1}), f.clone()),
    )
    .await);
    assert_eq!(v["_id"]["$oid"], newest.as_str(), "{v}");
    assert_eq!(v["queue"]["$oid"], qid.as_str());
    // --skip (a flag: .skip 1) skips the newest.
    let v = ok(&perl(
        &app,
        Method::GET,
        "/tasks",
        Some(JSON),
        &tasks_body(json!({".skip": 1}), f.clone()),
    )
    .await);
    assert_eq!(v.as_array().unwrap().len(), total - 1);
    assert_eq!(v[0]["_id"]["$oid"], all[1]["_id"]["$oid"]);
    // '{"status": -2}' (Disbatch 4 refused it: status alone was not an indexed prefix).
    let v = ok(&perl(
        &app,
        Method::GET,
        "/tasks",
        Some(JSON),
        &tasks_body(json!({}), json!({"status": -2})),
    )
    .await);
    assert_eq!(v.as_array().unwrap().len(), total);
    let v = ok(&perl(
        &app,
        Method::GET,
        "/tasks",
        Some(JSON),
        &tasks_body(json!({".count": 1}), json!({"status": 1})),
    )
    .await);
    assert_eq!(v, json!({"count": 0}));
    // --epoch, --fields, --pretty, --terse, --full
    let opts = json!({".epoch": 1, ".fields": "[\"status\",\"ctime\"]", ".pretty": 1, ".limit": 2});
    let r = perl(&app, Method::GET, "/tasks", Some(JSON), &tasks_body(opts, f.clone())).await;
    assert!(r.text.contains("\n  "), "pretty: {}", r.text);
    let v = ok(&r);
    assert!(v[0]["ctime"].is_f64(), "{v}");
    assert!(v[0].get("params").is_none() && v[0]["status"] == -2, "{v}");
    let v = ok(&perl(
        &app,
        Method::GET,
        "/tasks",
        Some(JSON),
        &tasks_body(json!({".terse": 1, ".full": 0}), f.clone()),
    )
    .await);
    assert_eq!(v.as_array().unwrap().len(), total);
    // The same with the dot options in the query string, and .limit 1 finding nothing.
    let r = perl(&app, Method::GET, "/tasks?.limit=1&status=2", None, "").await;
    assert_eq!(ok(&r), json!({}));

    // delete-queue buzz: the CLI needs MongoDB::DeleteResult's deleted_count == 1.
    let v = ok(&perl(&app, Method::DELETE, "/queues/buzz", None, "").await);
    assert_eq!(v["MongoDB::DeleteResult"]["deleted_count"], 1, "{v}");
    let r = perl(&app, Method::DELETE, "/queues/buzz", None, "").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
    drop(store);
}

async fn forms_from_other_sites_are_refused(app: Router) {
    let post = |headers: &'static [(&'static str, &'static str)]| {
        let app = app.clone();
        async move {
            perl_with(
                &app,
                Method::POST,
                "/queues",
                Some(FORM),
                "name=csrf&plugin=demo",
                headers,
            )
            .await
        }
    };
    for headers in [
        &[("origin", "http://evil.example")][..],
        &[("origin", "http://localhost:9999")][..],
        &[("origin", "null")][..],
        &[("sec-fetch-site", "cross-site")][..],
        &[("sec-fetch-site", "same-site"), ("origin", "http://localhost:8080")][..],
    ] {
        let r = post(headers).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{headers:?}: {}", r.text);
        assert!(r.error().contains("another site"), "{}", r.text);
    }
    let r = post(&[("origin", "http://localhost:8080"), ("sec-fetch-site", "same-origin")]).await;
    assert_eq!(r.status, StatusCode::OK, "same origin: {}", r.text);
    // Other types than JSON and forms stay refused.
    let r = perl(&app, Method::POST, "/queues", Some("text/plain"), "name=t&plugin=demo").await;
    assert_eq!(r.status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{}", r.text);
    let r = perl(
        &app,
        Method::POST,
        "/queues",
        None,
        "{\"name\":\"t\",\"plugin\":\"demo\"}",
    )
    .await;
    assert_eq!(r.status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{}", r.text);
}

async fn monitoring_nodes_and_queues(app: Router, store: Arc<dyn Store>) {
    let v = ok(&perl(&app, Method::GET, "/monitoring", None, "").await);
    assert_eq!(
        v["disbatch"],
        json!({"status": "WARNING", "message": "No Disbatch nodes found"})
    );
    assert!(v["queuebalance"]["status"].is_string(), "{v}");
    store.heartbeat("node1", Duration::from_secs(30)).await.unwrap();
    let v = ok(&perl(&app, Method::GET, "/monitoring", None, "").await);
    assert_eq!(v["disbatch"]["status"], "OK", "{v}");
    assert!(v["disbatch"]["nodes"]["fresh"]["node1"].as_u64().unwrap() <= 1, "{v}");

    let v = ok(&perl(&app, Method::GET, "/info", None, "").await);
    assert!(v["database"].is_string() || v["database"].is_null(), "{v}");
    assert_eq!(v["web_extensions"], json!([]));
    assert!(v["routes"]["GET"].as_array().unwrap().contains(&json!("/tasks")), "{v}");
    assert!(
        v["routes"]["DELETE"]
            .as_array()
            .unwrap()
            .contains(&json!("/queues/{queue}")),
        "{v}"
    );

    // Nodes: timestamp in epoch milliseconds; maxthreads by form.
    let now = bson::DateTime::now().timestamp_millis();
    let v = ok(&perl(&app, Method::GET, "/nodes", None, "").await);
    let ts = v[0]["timestamp"].as_i64().unwrap_or_else(|| panic!("epoch ms: {v}"));
    assert!((now - ts).abs() < 5_000, "{ts} vs {now}");
    let v = ok(&perl(&app, Method::GET, "/nodes/node1", None, "").await);
    assert!(v["timestamp"].is_i64(), "{v}");
    let v = ok(&perl(&app, Method::POST, "/nodes/node1", Some(FORM), "maxthreads=3").await);
    assert_eq!(
        (
            v["maxthreads"].as_i64(),
            v["MongoDB::UpdateResult"]["matched_count"].as_u64()
        ),
        (Some(3), Some(1))
    );
    // An unknown queue or node is 404 in both shapes (Disbatch 4 answered `null`): the
    // answer's schema is the queue's or the node's, never null.
    for uri in ["/nodes/nope", "/queues/nope"] {
        let r = perl(&app, Method::GET, uri, None, "").await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{uri}: {}", r.text);
    }
    // Our own clients ask for the native shape: dates as {"$date"}.
    let native = [(SHAPE_HEADER, "native")];
    let r = perl_with(&app, Method::GET, "/queues/nope", None, "", &native).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(
        perl(&app, Method::GET, "/nodes/nope?shape=native", None, "")
            .await
            .status,
        StatusCode::NOT_FOUND
    );
    let v = ok(&perl_with(&app, Method::GET, "/nodes/node1", None, "", &native).await);
    assert!(v["timestamp"]["$date"].is_string(), "{v}");
    let r = perl_with(&app, Method::GET, "/nodes", None, "", &[(SHAPE_HEADER, "v9")]).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let v = ok(&perl_with(
        &app,
        Method::POST,
        "/queues",
        Some(FORM),
        "name=mine&plugin=demo",
        &native,
    )
    .await);
    assert!(v["id"].is_string(), "{v}");

    // Queued counts every status up to -2 (a scheduled task too); counts has each code.
    let body = json!({"queue": "mine", "params": [{"a": 1}, {"a": 2}], "run_at": "1h"}).to_string();
    ok(&perl(&app, Method::POST, "/tasks", Some(JSON), &body).await);
    // A form may carry params as JSON text.
    let r = perl(
        &app,
        Method::POST,
        "/tasks",
        Some(FORM),
        "queue=mine&params=%5B%7B%22b%22%3A1%7D%5D",
    )
    .await;
    assert_eq!(inserted(&ok(&r)).len(), 1);
    let v = ok(&perl(&app, Method::GET, "/queues/mine", None, "").await);
    assert_eq!(
        (
            v["queued"].as_u64(),
            v["counts"]["-7"].as_u64(),
            v["counts"]["-2"].as_u64()
        ),
        (Some(3), Some(2), Some(1)),
        "{v}"
    );

    // Repeated keys and JSON arrays match any of their values ($or).
    let v = ok(&perl(&app, Method::GET, "/tasks?status=-7&status=-2&.count=1", None, "").await);
    assert_eq!(v, json!({"count": 3}));
    let v = ok(&perl(&app, Method::GET, "/tasks?status=-7&.count=1", None, "").await);
    assert_eq!(v, json!({"count": 2}));
    let body = json!({"status": [-2, 1], ".count": 1}).to_string();
    assert_eq!(
        ok(&perl(&app, Method::GET, "/tasks", Some(JSON), &body).await),
        json!({"count": 1})
    );
    let two = ok(&perl(&app, Method::GET, "/tasks?.limit=2&queue=mine", None, "").await);
    let (a, b) = (two[0]["id"].as_str().unwrap(), two[1]["id"].as_str().unwrap());
    let v = ok(&perl(&app, Method::GET, &format!("/tasks?id={a}&id={b}&.count=1"), None, "").await);
    assert_eq!(v, json!({"count": 2}));
    // Bad input names what is wrong; no 500s.
    for (uri, body, mentions) in [
        ("/tasks", json!({".limit": "many"}), "\"limit\""),
        ("/tasks", json!({".limit": 5, ".count": [1]}), "\"count\""),
        ("/tasks", json!({".sort": 1, ".limit": 1}), ".sort"),
        ("/tasks?.limit=1", json!({".limit": 2}), "\"limit\""),
        ("/tasks", json!({".limit": 5, "queue": ["a", "b"]}), "\"queue\""),
        ("/tasks", json!({".limit": 5, "params.x": 1}), "params.x"),
        (
            "/tasks",
            json!({".fields": {"a": 1, "b": 0}, ".limit": 1}),
            "\"fields\"",
        ),
    ] {
        let r = perl(&app, Method::GET, uri, Some(JSON), &body.to_string()).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}: {}", r.text);
        assert!(r.error().contains(mentions), "{body}: {}", r.text);
    }
    let r = perl(&app, Method::GET, "/tasks", Some("text/plain"), "limit=1").await;
    assert_eq!(r.status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{}", r.text);

    // POST /balance as a form, its structures as JSON text.
    let body = "max_tasks=%7B%22*%2007%3A00%22%3A%205%7D&queues=%5B%5B%22mine%22%5D%5D";
    let v = ok(&perl(&app, Method::POST, "/balance", Some(FORM), body).await);
    assert_eq!(v["status"], "success: queuebalance modified");
}

/// With a token configured, a form is a write like any other: it needs the token.
#[tokio::test]
async fn forms_need_the_token_when_one_is_set() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(dir.path().join("d.db")).await.unwrap());
    let mut state = ApiState::new(store, vec!["demo".into()]);
    state.api_token = Some("t0ken".into());
    let app = router(state);
    let r = perl(&app, Method::POST, "/queues", Some(FORM), "name=a&plugin=demo").await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.text);
    let auth = [("authorization", "Bearer t0ken")];
    let r = perl_with(&app, Method::POST, "/queues", Some(FORM), "name=a&plugin=demo", &auth).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    // An empty list of params creates nothing, without an error.
    let body = json!({"queue": "a", "params": []}).to_string();
    let v = ok(&perl_with(&app, Method::POST, "/tasks", Some(JSON), &body, &auth).await);
    assert_eq!((v["count"].as_u64(), inserted(&v).len()), (Some(0), 0));
}

fn app_on(store: Arc<dyn Store>, documents: Option<mongodb::Database>) -> Router {
    let mut state = ApiState::new(store, vec!["demo".into(), "fail".into()]);
    if let Some(db) = documents {
        state.database = Some(db.name().to_owned());
        state.documents = Some(Arc::new(db));
    }
    router(state)
}

async fn mongo() -> (common::TestDb, Arc<dyn Store>, Router) {
    let t = common::test_db("api_perl_cli").await;
    let store: Arc<dyn Store> = Arc::new(t.store.clone());
    let app = app_on(store.clone(), Some(t.db.clone()));
    (t, store, app)
}

async fn sqlite() -> (tempfile::TempDir, Arc<dyn Store>, Router) {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(dir.path().join("d.db")).await.unwrap());
    let app = app_on(store.clone(), None);
    (dir, store, app)
}

#[tokio::test]
async fn perl_cli_verbs_on_mongodb() {
    let (t, store, app) = mongo().await;
    t.db.collection::<bson::Document>("users")
        .insert_many([
            doc! {"username": "ashley", "migration": "foo"},
            doc! {"username": "matt", "migration": "foo"},
            doc! {"username": "other", "migration": "bar"},
        ])
        .await
        .unwrap();
    every_verb(app, store, true).await;
}

#[tokio::test]
async fn perl_cli_verbs_on_sqlite() {
    let (_dir, store, app) = sqlite().await;
    every_verb(app, store, false).await;
}

#[tokio::test]
async fn cross_site_forms_on_mongodb() {
    let (_t, _store, app) = mongo().await;
    forms_from_other_sites_are_refused(app).await;
}

#[tokio::test]
async fn cross_site_forms_on_sqlite() {
    let (_dir, _store, app) = sqlite().await;
    forms_from_other_sites_are_refused(app).await;
}

#[tokio::test]
async fn monitoring_nodes_queues_on_mongodb() {
    let (_t, store, app) = mongo().await;
    monitoring_nodes_and_queues(app, store).await;
}

#[tokio::test]
async fn monitoring_nodes_queues_on_sqlite() {
    let (_dir, store, app) = sqlite().await;
    monitoring_nodes_and_queues(app, store).await;
}

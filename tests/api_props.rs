//! Property tests (proptest) of REST request parsing: arbitrary JSON bodies, bytes, path
//! segments and query strings through the real router against the real test database.
//! Every answer is a JSON object (or a list for the list routes) of the route's success
//! shape or `{"error": "…"}` with a 4xx status, never a 5xx, and `GET /queues` still
//! answers afterwards.
//!
//! 64 cases per property by default; `PROPTEST_CASES=10000 cargo test --release --test
//! api_props` runs longer.

use crate::common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use disbatch::store::Store;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::{json, Map, Value};
use tokio::runtime::Runtime;

use common::http::{get, send, send_request, setup, urlencode, Reply};
use common::TestDb;

/// The cases per property: `PROPTEST_CASES`, else 64.
fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(64);
    ProptestConfig {
        cases,
        ..ProptestConfig::default()
    }
}

/// One runtime for every property (the database client lives on it).
fn runtime() -> &'static Runtime {
    static RT: OnceLock<Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    })
}

/// A property's database, with queue `q` and node `n1`, and its router.
struct Fixture {
    _db: TestDb,
    app: Router,
}

fn fixture(cell: &'static OnceLock<Fixture>, hint: &str) -> &'static Fixture {
    cell.get_or_init(|| {
        runtime().block_on(async {
            let (db, app) = setup(hint, |_| {}).await;
            let r = post_json(&app, "/queues", &json!({"name": "q", "plugin": "demo"})).await;
            assert_eq!(r.status, StatusCode::OK, "{}", r.text);
            let r = post_json(&app, "/tasks", &json!({"queue": "q", "params": [{"n": 1}, {"n": 2}]})).await;
            assert_eq!(r.status, StatusCode::OK, "{}", r.text);
            db.store.heartbeat("n1", Duration::from_secs(30)).await.unwrap();
            let people = [
                bson::doc! {"name": "ann"},
                bson::doc! {"name": "bob", "no": {"such": 1}},
            ];
            db.db
                .collection::<bson::Document>("people")
                .insert_many(people)
                .await
                .unwrap();
            Fixture { _db: db, app }
        })
    })
}

async fn post_json(app: &Router, uri: &str, body: &Value) -> Reply {
    post_raw(app, uri, body.to_string().into_bytes(), "application/json").await
}

/// A POST as our own clients send it, asking for the native answer shapes.
async fn post_raw(app: &Router, uri: &str, body: Vec<u8>, content_type: &str) -> Reply {
    let req = Request::builder()
        .method(Method::POST)
        .uri(uri)
        .header(header::CONTENT_TYPE, content_type)
        .header(disbatch::api::SHAPE_HEADER, "native")
        .body(Body::from(body))
        .unwrap();
    send_request(app, req).await
}

/// Strings that mean something to some route, and arbitrary ones.
fn arb_text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => ".{0,12}",
        1 => prop::sample::select(vec![
            "", "q", "demo", "fail", "n1", "0123456789abcdef01234567", "../x", "/etc/passwd", "a\u{0}b",
            "$where", "$oid", "document", "document.a", "-2", "1,2", "null", "fifo", "lifo", "default",
            "orphan", "requeue", "30s", "0s", "100000000000years", "/tmp:/in:rw", "1e3", "-1", " 7 ",
        ])
        .prop_map(str::to_owned),
    ]
}

/// Percent-encodes only what cannot stand in a query string (control, non-ASCII, space,
/// `&` and `#`), so stray `%`, `+`, quotes and brackets reach the parser as they are.
fn loose_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'!'..=b'~' if b != b'&' && b != b'#' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Keys of any route's body or filter, and arbitrary ones.
fn arb_key() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(vec![
            "name", "plugin", "threads", "sort", "sandbox", "on_orphan", "queue", "params", "collection",
            "filter", "maxthreads", "status", "node", "id", "_id", "timeout", "memory_mib", "output_cap_mib",
            "dirs", "env", "network", "$where", "$in", "$oid", "$numberLong", "$date", "$function", "a.b",
        ])
        .prop_map(str::to_owned),
        1 => ".{0,8}",
    ]
}

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        (-3i64..10).prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        arb_text().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::vec((arb_key(), inner), 0..5).prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

fn text_value() -> BoxedStrategy<Value> {
    arb_text().prop_map(Value::String).boxed()
}

/// The first of `values` most of the time, another of them, or any text.
fn pick(values: &[&'static str]) -> BoxedStrategy<Value> {
    prop_oneof![
        4 => Just(Value::String(values[0].to_owned())),
        2 => prop::sample::select(values.to_vec()).prop_map(|v| Value::String(v.to_owned())),
        1 => text_value(),
    ]
    .boxed()
}

fn count_value() -> BoxedStrategy<Value> {
    prop_oneof![
        3 => (0i64..10).prop_map(|n| json!(n)),
        1 => Just(Value::Null),
        1 => pick(&["3", " 2 ", "-1", "1.5"]),
        1 => any::<i64>().prop_map(|n| json!(n)),
    ]
    .boxed()
}

/// A filter of tasks: the indexed fields and some that are not, with plausible values.
fn filter_value() -> BoxedStrategy<Value> {
    let key = prop_oneof![
        4 => prop::sample::select(vec!["queue", "status", "node", "id", "_id"]).prop_map(str::to_owned),
        1 => arb_key(),
    ];
    prop::collection::vec((key, arb_json()), 0..3)
        .prop_flat_map(|kv| {
            let values: Vec<BoxedStrategy<(String, Value)>> = kv
                .into_iter()
                .map(|(k, any)| {
                    let likely = match k.as_str() {
                        "queue" => pick(&["q", "0123456789abcdef01234567"]),
                        "status" => prop_oneof![
                            (-6i64..4).prop_map(|n| json!(n)),
                            prop::collection::vec((-6i64..4).prop_map(|n| json!(n)), 0..3).prop_map(Value::Array),
                            Just(json!({"$in": [-2, 1]})),
                            pick(&["1,2", "-2"]),
                        ]
                        .boxed(),
                        "node" => prop_oneof![Just(Value::Null), pick(&["n1", "null"])].boxed(),
                        _ => Just(any.clone()).boxed(),
                    };
                    (Just(k), prop_oneof![3 => likely, 1 => Just(any)]).boxed()
                })
                .collect();
            values
        })
        .prop_map(|kv| Value::Object(kv.into_iter().collect()))
        .boxed()
}

/// A plausible value for a field of some route, or any JSON.
fn field_value(key: &str) -> BoxedStrategy<Value> {
    let likely = match key {
        "name" => text_value(),
        "plugin" => pick(&["demo", "fail", "../x", "demo.wasm"]),
        "threads" | "maxthreads" => count_value(),
        "sort" => pick(&["fifo", "lifo", "default"]),
        "on_orphan" => pick(&["orphan", "requeue"]),
        "sandbox" => prop::collection::vec(
            prop::sample::select(vec!["timeout", "memory_mib", "output_cap_mib", "dirs", "env", "network"]).prop_flat_map(
                |k| {
                    let v = match k {
                        "timeout" => prop_oneof![pick(&["30s", "0s", "1h", "100000000000years"]), count_value()].boxed(),
                        "memory_mib" | "output_cap_mib" => {
                            prop_oneof![(0u64..5000).prop_map(|n| json!(n)), count_value()].boxed()
                        }
                        "dirs" => prop::collection::vec(pick(&["/tmp", "/tmp:/in:rw", "", "a:b:c:d"]), 0..3)
                            .prop_map(Value::Array)
                            .boxed(),
                        "env" => prop::collection::btree_map(".{0,4}", text_value(), 0..3)
                            .prop_map(|m| Value::Object(m.into_iter().collect()))
                            .boxed(),
                        _ => any::<bool>().prop_map(Value::Bool).boxed(),
                    };
                    (Just(k.to_owned()), prop_oneof![3 => v, 1 => arb_json()])
                },
            ),
            0..4,
        )
        .prop_map(|kv| Value::Object(kv.into_iter().collect()))
        .boxed(),
        "queue" => pick(&["q", "0123456789abcdef01234567"]),
        "params" => prop_oneof![
            3 => prop::collection::vec(
                prop::collection::vec((arb_key(), arb_json()), 0..4).prop_map(|kv| Value::Object(kv.into_iter().collect())),
                0..4,
            )
            .prop_map(Value::Array),
            1 => prop::collection::vec((arb_key(), pick(&["document", "document.name", "document.no.such"])), 0..3)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
        .boxed(),
        "collection" => pick(&["people", "", "system.users", "a$b"]),
        "filter" => filter_value(),
        _ => arb_json().boxed(),
    };
    prop_oneof![6 => likely, 1 => arb_json()].boxed()
}

/// A JSON object: each `required` key most of the time, each `optional` one sometimes, all
/// with plausible or arbitrary values, and now and then a key of another route.
fn arb_object(required: &'static [&'static str], optional: &'static [&'static str]) -> impl Strategy<Value = Value> {
    let field = |k: &'static str, p: f64| {
        prop::option::weighted(p, field_value(k).prop_map(move |v| (k.to_owned(), v))).boxed()
    };
    let mut fields: Vec<BoxedStrategy<Option<(String, Value)>>> = required.iter().map(|k| field(k, 0.9)).collect();
    fields.extend(optional.iter().map(|k| field(k, 0.4)));
    fields.push(prop::option::weighted(0.1, (arb_key(), arb_json())).boxed());
    fields.prop_map(|kv| Value::Object(kv.into_iter().flatten().collect::<Map<_, _>>()))
}

/// A body: a route-shaped object, any JSON value, any JSON cut short, or any bytes.
fn arb_body(required: &'static [&'static str], optional: &'static [&'static str]) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        8 => arb_object(required, optional).prop_map(|v| v.to_string().into_bytes()),
        1 => arb_json().prop_map(|v| v.to_string().into_bytes()),
        1 => (arb_object(required, optional), any::<prop::sample::Index>()).prop_map(|(v, cut)| {
            let text = v.to_string().into_bytes();
            let at = cut.index(text.len() + 1);
            text[..at].to_vec()
        }),
        1 => prop::collection::vec(any::<u8>(), 0..64),
    ]
}

/// A query parameter of `GET /tasks` with a plausible or arbitrary value, and whether to
/// percent-encode it fully.
fn arb_query_pair() -> impl Strategy<Value = (String, String, bool)> {
    let number = || {
        prop_oneof![
            3 => (0u64..20).prop_map(|n| n.to_string()),
            2 => any::<u64>().prop_map(|n| n.to_string()),
            1 => arb_text(),
        ]
        .boxed()
    };
    let flag = || {
        prop_oneof![3 => prop::sample::select(vec!["1", "0", "", "true"]).prop_map(str::to_owned), 1 => arb_text()]
            .boxed()
    };
    let text_of = |v: BoxedStrategy<Value>| {
        v.prop_map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
            .boxed()
    };
    let pair = prop_oneof![
        2 => ("limit|skip", number()),
        2 => ("count|epoch|terse|full|pretty", flag()),
        2 => ("queue", text_of(pick(&["q", "0123456789abcdef01234567"]))),
        2 => ("status", text_of(prop_oneof![(-6i64..4).prop_map(|n| json!(n.to_string())), pick(&["1,2", "-2,0"])].boxed())),
        1 => ("node", text_of(pick(&["n1", "null"]))),
        1 => ("id", text_of(pick(&["0123456789abcdef01234567"]))),
        1 => ("fields", text_of(pick(&["status,node", "params"]))),
        3 => ("filter", filter_value().prop_map(|v| v.to_string()).boxed()),
        1 => (arb_key(), text_of(arb_json().boxed())),
    ];
    (pair, any::<bool>()).prop_map(|((k, v), encode)| (k, v, encode))
}

const QUEUE_REQUIRED: &[&str] = &["name", "plugin"];
const QUEUE_OPTIONAL: &[&str] = &["threads", "sort", "sandbox", "on_orphan"];
const QUEUE_ANY: &[&str] = &["name", "plugin", "threads", "sort", "sandbox", "on_orphan"];
const TASK_REQUIRED: &[&str] = &["queue", "params"];
const TASK_OPTIONAL: &[&str] = &["collection", "filter"];

/// Checks the answer's shape: success (`ok` says what it must hold) or a 4xx `{"error"}`.
fn check(r: &Reply, what: &str, ok: impl Fn(&Value) -> bool) -> Result<(), TestCaseError> {
    prop_assert!(!r.status.is_server_error(), "{}: {} {}", what, r.status, r.text);
    let value: Value = serde_json::from_str(&r.text)
        .map_err(|e| TestCaseError::fail(format!("{what}: not JSON ({e}): {}", r.text)))?;
    if r.status.is_success() {
        prop_assert!(ok(&value), "{}: unexpected success shape {}", what, r.text);
    } else {
        let known = [400, 404, 413, 415];
        prop_assert!(
            known.contains(&r.status.as_u16()),
            "{}: status {} {}",
            what,
            r.status,
            r.text
        );
        let error = value.get("error").and_then(Value::as_str);
        prop_assert!(
            error.is_some_and(|e| !e.is_empty()) && value.as_object().is_some_and(|o| o.len() == 1),
            "{}: not an error object: {}",
            what,
            r.text
        );
    }
    Ok(())
}

async fn still_serving(app: &Router) -> Result<(), TestCaseError> {
    let r = get(app, "/queues").await;
    prop_assert_eq!(r.status, StatusCode::OK, "GET /queues afterwards: {}", r.text);
    prop_assert!(serde_json::from_str::<Value>(&r.text).is_ok_and(|v| v.is_array()));
    Ok(())
}

fn is_queue(v: &Value) -> bool {
    v["id"].is_string() && v["name"].is_string() && v["plugin"].is_string() && v["counts"].is_object()
}

fn is_task(v: &Value) -> bool {
    v["id"].is_string() && v["_id"]["$oid"].is_string()
}

static QUEUES: OnceLock<Fixture> = OnceLock::new();
static UPDATES: OnceLock<Fixture> = OnceLock::new();
static TASKS: OnceLock<Fixture> = OnceLock::new();
static NODES: OnceLock<Fixture> = OnceLock::new();
static SEARCH: OnceLock<Fixture> = OnceLock::new();
static PATHS: OnceLock<Fixture> = OnceLock::new();

proptest! {
    #![proptest_config(config())]

    /// `POST /queues` with any body: a queue or a 4xx error.
    #[test]
    fn post_queues_answers_a_queue_or_an_error(body in arb_body(QUEUE_REQUIRED, QUEUE_OPTIONAL)) {
        let f = fixture(&QUEUES, "props_queues");
        runtime().block_on(async {
            let r = post_raw(&f.app, "/queues", body, "application/json").await;
            check(&r, "POST /queues", is_queue)?;
            still_serving(&f.app).await
        })?;
    }

    /// `POST /queues/{q}` with any body, on a queue made for the case.
    #[test]
    fn post_queue_answers_the_queue_or_an_error(body in arb_body(&[], QUEUE_ANY), by_id in any::<bool>()) {
        static N: AtomicU32 = AtomicU32::new(0);
        let f = fixture(&UPDATES, "props_updates");
        runtime().block_on(async {
            let name = format!("u{}", N.fetch_add(1, Ordering::Relaxed));
            let r = post_json(&f.app, "/queues", &json!({"name": name, "plugin": "demo"})).await;
            prop_assert_eq!(r.status, StatusCode::OK, "{}", r.text);
            let id = r.json()["id"].as_str().unwrap().to_owned();
            let key = if by_id { &id } else { &name };
            let r = post_raw(&f.app, &format!("/queues/{key}"), body, "application/json").await;
            check(&r, "POST /queues/{q}", is_queue)?;
            still_serving(&f.app).await?;
            let r = send(&f.app, Method::DELETE, &format!("/queues/{id}"), None, None).await;
            prop_assert_eq!(r.status, StatusCode::OK, "{}", r.text);
            Ok(())
        })?;
    }

    /// `POST /tasks` with any body: `{queue, count, ids}` or a 4xx error.
    #[test]
    fn post_tasks_answers_ids_or_an_error(body in arb_body(TASK_REQUIRED, TASK_OPTIONAL)) {
        let f = fixture(&TASKS, "props_tasks");
        runtime().block_on(async {
            let r = post_raw(&f.app, "/tasks", body, "application/json").await;
            check(&r, "POST /tasks", |v| {
                v["queue"].is_string()
                    && v["ids"].as_array().is_some_and(|ids| Some(ids.len() as u64) == v["count"].as_u64())
            })?;
            still_serving(&f.app).await
        })?;
    }

    /// `POST /nodes/{n}` with any body: the node or a 4xx error.
    #[test]
    fn post_node_answers_the_node_or_an_error(
        body in arb_body(&["maxthreads"], &[]),
        node in prop_oneof![3 => Just("n1".to_owned()), 1 => arb_text()],
    ) {
        let f = fixture(&NODES, "props_nodes");
        runtime().block_on(async {
            let r = post_raw(&f.app, &format!("/nodes/{}", urlencode(&node)), body, "application/json").await;
            check(&r, "POST /nodes/{n}", |v| v["node"].is_string())?;
            still_serving(&f.app).await
        })?;
    }

    /// `GET /tasks` with any query string: a list of tasks, `{count}`, or a 4xx error.
    #[test]
    fn get_tasks_answers_tasks_or_an_error(
        pairs in prop::collection::vec(arb_query_pair(), 0..5),
        raw in prop::option::weighted(0.2, prop::collection::vec(any::<u8>(), 0..4)),
    ) {
        let f = fixture(&SEARCH, "props_search");
        runtime().block_on(async {
            let pair = |k: &str, v: &str, encode: bool| {
                let value = if encode { urlencode(v) } else { loose_encode(v) };
                format!("{}={value}", urlencode(k))
            };
            let mut query: Vec<String> = pairs.iter().map(|(k, v, encode)| pair(k, v, *encode)).collect();
            if let Some(raw) = &raw {
                query.push(raw.iter().map(|b| format!("%{b:02X}")).collect());
            }
            let uri = format!("/tasks?{}", query.join("&")).parse::<axum::http::Uri>().unwrap_or_else(|_| {
                let encoded: Vec<String> = pairs.iter().map(|(k, v, _)| pair(k, v, true)).collect();
                format!("/tasks?{}", encoded.join("&")).parse().unwrap()
            });
            let req = Request::builder().method(Method::GET).uri(uri).body(Body::empty()).unwrap();
            let r = send_request(&f.app, req).await;
            check(&r, "GET /tasks", |v| {
                v.as_array().is_some_and(|tasks| tasks.iter().all(is_task)) || v["count"].is_u64()
            })?;
            still_serving(&f.app).await
        })?;
    }

    /// Any path segment, percent-encoded bytes included, on every route that takes one.
    #[test]
    fn any_path_segment_answers_json(
        segment in prop::collection::vec(any::<u8>(), 0..30),
        route in 0usize..7,
        content_type in prop::sample::select(vec!["application/json", "text/plain", "application/x-www-form-urlencoded"]),
    ) {
        let f = fixture(&PATHS, "props_paths");
        runtime().block_on(async {
            let encoded: String = segment.iter().map(|b| format!("%{b:02X}")).collect();
            let (method, prefix, suffix, body) = [
                (Method::GET, "/queues/", "", ""),
                (Method::POST, "/queues/", "", r#"{"threads":2}"#),
                (Method::DELETE, "/queues/", "", ""),
                (Method::GET, "/nodes/", "", ""),
                (Method::POST, "/nodes/", "", r#"{"maxthreads":2}"#),
                (Method::GET, "/tasks/", "", ""),
                (Method::GET, "/tasks/", "?output=1&epoch=1", ""),
            ][route]
                .clone();
            let uri = format!("{prefix}{encoded}{suffix}");
            let req = Request::builder()
                .method(method.clone())
                .uri(&uri)
                .header(header::CONTENT_TYPE, content_type)
                .header(disbatch::api::SHAPE_HEADER, "native")
                .body(Body::from(body))
                .unwrap();
            let r = send_request(&f.app, req).await;
            check(&r, &format!("{method} {uri}"), |v| v.is_object())?;
            still_serving(&f.app).await
        })?;
    }
}

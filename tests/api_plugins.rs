//! `POST /plugins`, `GET /plugins[?full=1]`, `GET|DELETE /plugins/{name}` and pinned
//! plugins on queues: what is accepted, what is refused and why.

use crate::common;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use common::docs::shared_runner;
use common::http::{assert_bad, get, post, send, send_request, setup, Reply};
use common::plugins::plugin_path;
use disbatch::store::plugins::{digest, MAX_PLUGIN_BYTES};
use serde_json::json;

async fn upload(app: &Router, query: &str, content_type: Option<&str>, bytes: Vec<u8>) -> Reply {
    let mut req = Request::builder()
        .method(Method::POST)
        .uri(format!("/plugins?{query}"))
        .header("x-disbatch-user", "alice@build");
    if let Some(t) = content_type {
        req = req.header(header::CONTENT_TYPE, t);
    }
    send_request(app, req.body(Body::from(bytes)).unwrap()).await
}

async fn checked() -> (common::TestDb, Router) {
    setup("api_plugins", |s| s.checker = Some(shared_runner())).await
}

#[tokio::test]
async fn an_upload_is_checked_stored_and_listed() {
    let (_db, app) = checked().await;
    let demo = std::fs::read(plugin_path("demo")).unwrap();
    let sha = digest(&demo);

    let r = upload(
        &app,
        &format!("name=demo&sha256={sha}"),
        Some("application/wasm"),
        demo.clone(),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let v = r.json();
    assert_eq!(v["created"], true);
    assert_eq!(v["sha256"], sha);
    assert_eq!(v["ref"], format!("demo@sha256:{sha}"));
    assert_eq!(v["size"], demo.len());
    assert_eq!(
        (v["wit"].as_str(), v["uploaded_by"].as_str()),
        (Some("0.2.0"), Some("alice@build"))
    );
    assert_eq!(v["allowed"], true);

    // The same component again: no new version, 200.
    let r = upload(&app, "name=demo", Some("application/octet-stream"), demo.clone()).await;
    assert_eq!((r.status, r.json()["created"].clone()), (StatusCode::OK, json!(false)));

    // A second version under the same name is the newest; a name outside the allowlist is
    // stored and said to be not allowed.
    let fail = std::fs::read(plugin_path("fail")).unwrap();
    assert_eq!(
        upload(&app, "name=demo", Some("application/wasm"), fail.clone())
            .await
            .status,
        StatusCode::CREATED
    );
    let r = upload(&app, "name=other", Some("application/wasm"), fail.clone()).await;
    assert_eq!(r.json()["allowed"], false);
    let one = get(&app, "/plugins/demo").await.json();
    let shas: Vec<_> = one["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["sha256"].clone())
        .collect();
    assert_eq!(shas, [json!(digest(&fail)), json!(sha)]);

    // The Disbatch 4 list stays the allowed names; full lists allowed and stored ones.
    assert_eq!(get(&app, "/plugins").await.json(), json!(["demo", "fail"]));
    let full = get(&app, "/plugins?full=1").await.json();
    let rows: Vec<_> = full
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].clone(),
                p["source"].clone(),
                p["allowed"].clone(),
                p["versions"].clone(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            (json!("demo"), json!("store"), json!(true), json!(2)),
            (json!("fail"), json!("plugin_dir"), json!(true), json!(0)),
            (json!("other"), json!("store"), json!(false), json!(1)),
        ]
    );
    assert_eq!(full[0]["sha256"], json!(digest(&fail)));

    // A queue may pin a stored version, and only a stored one.
    let r = post(
        &app,
        "/queues",
        json!({"name": "p", "plugin": format!("demo@sha256:{sha}")}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json()["plugin"], format!("demo@sha256:{sha}"));
    let unknown = format!("demo@sha256:{}", "0".repeat(64));
    assert_bad(
        &post(&app, "/queues", json!({"name": "q", "plugin": unknown})).await,
        "is not a stored version of \"demo\" (2 stored",
    );
    assert_bad(
        &post(&app, "/queues", json!({"name": "q", "plugin": "demo@md5:00"})).await,
        "name@sha256:",
    );
    assert_bad(
        &post(
            &app,
            "/queues",
            json!({"name": "q", "plugin": format!("other@sha256:{}", digest(&fail))}),
        )
        .await,
        "not an allowed plugin",
    );

    // Deleted: every version goes.
    let r = send(&app, Method::DELETE, "/plugins/demo", None, None).await;
    assert_eq!(r.json(), json!({"name": "demo", "deleted": 2}));
    assert_eq!(get(&app, "/plugins/demo").await.status, StatusCode::NOT_FOUND);
    let r = send(&app, Method::DELETE, "/plugins/demo", None, None).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn bad_uploads_are_refused_with_the_reason() {
    let (_db, app) = checked().await;
    let demo = std::fs::read(plugin_path("demo")).unwrap();
    let wasm = Some("application/wasm");

    let r = upload(&app, "name=demo", Some("application/json"), demo.clone()).await;
    assert_eq!(r.status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{}", r.text);
    assert!(r.error().contains("Content-Type: application/wasm"), "{}", r.text);
    // A form post, as any web page can send cross-site, is refused before anything is read.
    let r = upload(&app, "name=demo", Some("text/plain"), demo.clone()).await;
    assert_eq!(r.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(
        upload(&app, "name=demo", None, demo.clone()).await.status,
        StatusCode::UNSUPPORTED_MEDIA_TYPE
    );

    assert_bad(&upload(&app, "", wasm, demo.clone()).await, "\"name\" is required");
    assert_bad(
        &upload(&app, "name=a%2Fb", wasm, demo.clone()).await,
        "without path separators",
    );
    assert_bad(&upload(&app, "name=a%40b", wasm, demo.clone()).await, "\"@\"");
    assert_bad(
        &upload(
            &app,
            &format!("name=demo&sha256={}", "1".repeat(64)),
            wasm,
            demo.clone(),
        )
        .await,
        "the upload was damaged",
    );
    assert_bad(
        &upload(&app, "name=demo", wasm, Vec::new()).await,
        "the request body is empty",
    );
    assert_bad(
        &upload(&app, "name=demo", wasm, b"not wasm at all".to_vec()).await,
        "the component was refused",
    );
    let core = wat::parse_str("(module (func (export \"run\")))").unwrap();
    assert_bad(
        &upload(&app, "name=demo", wasm, core).await,
        "the component was refused",
    );
    for (plugin, reason) in [
        ("wrongworld", "does not implement the disbatch:plugin/plugin world"),
        ("badimport", "imports something the host does not provide"),
    ] {
        let bytes = std::fs::read(plugin_path(plugin)).unwrap();
        assert_bad(&upload(&app, "name=demo", wasm, bytes).await, reason);
    }
    let huge = vec![0u8; MAX_PLUGIN_BYTES + 1];
    let r = upload(&app, "name=demo", wasm, huge).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", r.text);
    assert!(
        r.error().contains("larger than the limit of 134217728 bytes"),
        "{}",
        r.text
    );

    // Nothing of it was stored.
    assert_eq!(get(&app, "/plugins/demo").await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn uploads_need_the_token_and_a_checking_dci() {
    let (_db, app) = setup("api_plugins_token", |s| {
        s.checker = Some(shared_runner());
        s.api_token = Some("secret".into());
    })
    .await;
    let demo = std::fs::read(plugin_path("demo")).unwrap();
    let r = upload(&app, "name=demo", Some("application/wasm"), demo.clone()).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let r = send(&app, Method::DELETE, "/plugins/demo", None, None).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);

    let (_db, app) = setup("api_plugins_unchecked", |_| {}).await;
    let r = upload(&app, "name=demo", Some("application/wasm"), demo).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text);
    assert!(r.error().contains("cannot check components"), "{}", r.text);
}

/// Refusals that need no body come before the body is read: the client sends only the
/// headers and gets its answer.
#[tokio::test]
async fn refusals_come_before_the_body_is_read() {
    let (_db, app) = checked().await;
    let addr = common::http::serve(app).await;
    for (content_type, length, status) in [
        ("text/plain", 100_000_000u64, 415),
        ("application/wasm", MAX_PLUGIN_BYTES as u64 + 1, 413),
    ] {
        let request = format!(
            "POST /plugins?name=demo HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: {content_type}\r\nContent-Length: {length}\r\n\r\n"
        );
        let answer = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            common::http::raw_http(addr, request.as_bytes(), false),
        )
        .await
        .expect("answered without the body");
        assert_eq!(answer.0, Some(status), "{}", answer.1);
    }
}

/// Stored documents another tool wrote: a digest that is not 64 lowercase hex digits (which
/// could name a path) is not a version; a length past the limit is not read.
#[tokio::test]
async fn odd_stored_plugin_documents_are_ignored_or_refused() {
    use disbatch::store::PluginStore;
    let (db, _app) = checked().await;
    let files = db.db.collection::<bson::Document>("plugins.files");
    let now = bson::DateTime::now();
    let path_like = format!("../../../../{}", "/.".repeat(26));
    assert_eq!(path_like.len(), 64);
    for (name, sha, length) in [
        ("evil", path_like.as_str(), 10i64),
        ("upper", &"AB".repeat(32), 10),
        ("huge", &"ab".repeat(32), i64::MAX),
    ] {
        files
            .insert_one(bson::doc! {"filename": name, "length": length, "chunkSize": 261120,
            "uploadDate": now, "metadata": {"sha256": sha}})
            .await
            .unwrap();
    }
    let listed: Vec<String> = db
        .store
        .plugin_versions(None)
        .await
        .unwrap()
        .into_iter()
        .map(|v| v.name)
        .collect();
    assert_eq!(listed, ["huge"]);
    let e = db.store.plugin_bytes("huge", &"ab".repeat(32)).await.unwrap_err();
    assert!(e.to_string().contains("length is not a size of at most"), "{e}");
}

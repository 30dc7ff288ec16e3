//! `GET|POST /schedules` and `GET|POST|DELETE /schedules/{name}`: created, listed with
//! their next occurrences, changed in part, paused and resumed, deleted; every bad input
//! a 400 naming its field, an unknown schedule a 404, a write without the token a 401.
//! Then the same through `disbatch schedules`, `set-schedule` and `delete-schedule`
//! against a real `disbatch web`.

use axum::http::{Method, StatusCode};
use jiff::Timestamp;
use serde_json::{json, Value};

use crate::common::http::{assert_bad, get, post, send, setup};
use crate::common::web::{run_disbatch, stderr};
use crate::common::{plugins_dir, Web};

async fn queue(app: &axum::Router, name: &str) -> String {
    let r = post(app, "/queues", json!({"name": name, "plugin": "demo"})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    r.json()["id"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_are_created_listed_changed_and_deleted() {
    let (_db, app) = setup("api_schedules", |_| {}).await;
    let q = queue(&app, "nightly-q").await;
    let r = post(
        &app,
        "/schedules",
        json!({"name": "nightly", "queue": "nightly-q", "cron": "30 2 * * *", "timezone": "America/New_York",
               "params": {"message": "hi"}, "catch_up": "last", "overlap": "skip"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let s = r.json();
    assert_eq!(s["queue"], json!(q));
    assert_eq!(s["queue_name"], "nightly-q");
    assert_eq!(
        (s["catch_up"].as_str(), s["overlap"].as_str()),
        (Some("last"), Some("skip"))
    );
    assert_eq!(s["catch_up_limit"], 100);
    assert_eq!(s["params"], json!({"message": "hi"}));
    assert_eq!(s["last_task"], Value::Null);
    let next: Vec<Timestamp> = s["next"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().parse().unwrap())
        .collect();
    assert_eq!(next.len(), 5);
    for t in &next {
        let local = t.to_zoned(jiff::tz::TimeZone::get("America/New_York").unwrap());
        assert_eq!((local.hour(), local.minute()), (2, 30), "{local}");
    }
    // A second one, by queue id, with an interval.
    let r = post(&app, "/schedules/every5", json!({"queue": q, "every": "5m"})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json()["catch_up"], "none");
    let r = get(&app, "/schedules").await;
    let names: Vec<String> = r
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().into())
        .collect();
    assert_eq!(names, ["every5", "nightly"]);

    // A partial change keeps the rest; a cron given drops the interval.
    let r = post(&app, "/schedules/every5", json!({"cron": "@hourly"})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(
        (r.json()["cron"].clone(), r.json()["every"].clone()),
        (json!("@hourly"), Value::Null)
    );
    // Paused: no next occurrences; resumed: the mark moves to now.
    let r = post(&app, "/schedules/nightly", json!({"paused": true})).await;
    assert_eq!(
        (r.json()["paused"].clone(), r.json()["next"].clone()),
        (json!(true), json!([]))
    );
    let before: Timestamp = r.json()["last"].as_str().unwrap().parse().unwrap();
    let r = post(&app, "/schedules/nightly", json!({"paused": false})).await;
    assert_eq!(r.json()["next"].as_array().unwrap().len(), 5);
    let after: Timestamp = r.json()["last"].as_str().unwrap().parse().unwrap();
    assert!(after >= before, "the mark moved to the resume: {before} then {after}");
    assert_eq!(r.json()["params"], json!({"message": "hi"}), "kept");
    // POST /schedules replaces whole: the fields not given take their defaults.
    let r = post(
        &app,
        "/schedules",
        json!({"name": "nightly", "queue": "nightly-q", "every": "1h"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(
        (r.json()["catch_up"].clone(), r.json()["params"].clone()),
        (json!("none"), json!({}))
    );

    let r = send(&app, Method::DELETE, "/schedules/nightly", None, None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json(), json!({"name": "nightly", "deleted": true}));
    for (method, uri) in [
        (Method::GET, "/schedules/nightly"),
        (Method::DELETE, "/schedules/nightly"),
    ] {
        let r = send(&app, method, uri, None, None).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_a_400_naming_the_field() {
    let (_db, app) = setup("api_schedules_bad", |_| {}).await;
    queue(&app, "q").await;
    let base = json!({"name": "s", "queue": "q", "cron": "@daily"});
    let with = |k: &str, v: Value| {
        let mut b = base.clone();
        b[k] = v;
        b
    };
    let cases = [
        (with("cron", json!("0 0 0 30 2 *")), "never fires"),
        (with("cron", json!("not a cron")), "\"cron\""),
        (with("cron", json!("* * *")), "\"cron\""),
        (with("timezone", json!("Mars/Olympus")), "\"timezone\""),
        (with("queue", json!("nope")), "\"queue\""),
        (with("every", json!("5m")), "not both"),
        (json!({"name": "s", "queue": "q"}), "\"cron\""),
        (json!({"name": "s", "queue": "q", "every": "0s"}), "\"every\""),
        (json!({"name": "s", "queue": "q", "every": "soon"}), "\"every\""),
        (json!({"name": "s", "cron": "@daily"}), "\"queue\""),
        (json!({"queue": "q", "cron": "@daily"}), "\"name\""),
        (with("name", json!("a b")), "\"name\""),
        (with("name", json!("..")), "\"name\""),
        (with("catch_up", json!("some")), "\"catch_up\""),
        (with("catch_up_limit", json!(0)), "\"catch_up_limit\""),
        (with("overlap", json!("maybe")), "\"overlap\""),
        (with("paused", json!("yes")), "\"paused\""),
        (with("params", json!([1])), "\"params\""),
        (with("colour", json!("blue")), "unknown field \"colour\""),
    ];
    for (body, mentions) in cases {
        let r = post(&app, "/schedules", body.clone()).await;
        assert_bad(&r, mentions);
    }
    let r = post(&app, "/schedules/other", json!({"name": "s"})).await;
    assert_bad(&r, "\"name\"");
    let r = post(&app, "/schedules/s", json!({})).await;
    assert_bad(&r, "nothing to change");
    assert_eq!(get(&app, "/schedules").await.json(), json!([]), "nothing written");
    // The schedules' keys are theirs: no task submitted by hand stands for an occurrence.
    let r = post(
        &app,
        "/tasks",
        json!({"queue": "q", "tasks": [{"params": {}, "key": "schedule:s:2030-01-01T00:00:00Z"}]}),
    )
    .await;
    assert_bad(&r, "\"tasks[0].key\"");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_need_the_token() {
    let (_db, app) = setup("api_schedules_token", |s| {
        s.api_token = Some("t0k3n-long-enough-for-the-check".into())
    })
    .await;
    let body = json!({"name": "s", "queue": "q", "cron": "@daily"}).to_string();
    let r = send(&app, Method::POST, "/schedules", Some(&body), None).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.text);
    let r = send(&app, Method::DELETE, "/schedules/s", None, None).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.text);
    let r = send(&app, Method::GET, "/schedules", None, None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
}

#[test]
fn the_cli_sets_lists_pauses_and_deletes_schedules() {
    let dir = tempfile::tempdir().unwrap();
    let config = json!({"plugins": ["demo"], "plugin_dir": plugins_dir()});
    let path = dir.path().join("web.json");
    std::fs::write(&path, config.to_string()).unwrap();
    let web = Web::start_embedded(&dir.path().join("c.db"), &["--config", path.to_str().unwrap()]);
    let run = |args: &[&str]| {
        let mut all = vec!["--url", web.url.as_str()];
        all.extend(args);
        let out = run_disbatch(&all, None, &[]);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr(&out),
        )
    };
    let (code, _, err) = run(&["create-queue", "q", "demo", "--threads", "0"]);
    assert_eq!(code, Some(0), "{err}");
    let (code, out, err) = run(&[
        "set-schedule",
        "nightly",
        "--queue",
        "q",
        "--cron",
        "0 3 * * *",
        "--timezone",
        "Europe/Berlin",
        "--params",
        r#"{"message": "hi"}"#,
        "--catch-up",
        "all",
        "--overlap",
        "skip",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("schedule nightly: cron 0 3 * * * (Europe/Berlin); next "),
        "{out}"
    );
    let (code, out, _) = run(&["set-schedule", "nightly", "--paused"]);
    assert_eq!(code, Some(0));
    assert!(out.contains(", paused"), "{out}");
    let (code, out, _) = run(&["schedules"]);
    assert_eq!(code, Some(0));
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("NAME") && lines[0].contains("LAST TASK"), "{out}");
    assert!(lines[1].starts_with("nightly") && lines[1].contains("paused"), "{out}");
    let (code, out, _) = run(&["--json", "schedules"]);
    assert_eq!(code, Some(0));
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["overlap"], "skip");
    // Bad input: the server's 400, naming the field, and a non-zero exit.
    let (code, _, err) = run(&["set-schedule", "bad", "--queue", "q", "--every", "0s"]);
    assert_ne!(code, Some(0));
    assert!(err.contains("\"every\""), "{err}");
    let (code, out, err) = run(&["delete-schedule", "nightly"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out, "deleted schedule nightly\n");
    let (code, _, err) = run(&["delete-schedule", "nightly"]);
    assert_ne!(code, Some(0));
    assert!(err.contains("no schedule"), "{err}");
}

//! Unit tests of the document parsing.

use super::*;

fn task_doc() -> Document {
    doc! {
        "_id": ObjectId::new(),
        "queue": ObjectId::new(),
        "ctime": DateTime::now(),
        "mtime": DateTime::now(),
        "node": null,
        "status": -2,
        "params": { "a": 1 },
        "stdout": null,
        "stderr": null,
    }
}

fn reason(e: StoreError) -> String {
    match e {
        StoreError::Malformed { collection, reason, .. } => format!("{collection}: {reason}"),
        other => panic!("not malformed: {other}"),
    }
}

#[test]
fn integers_of_any_width() {
    assert_eq!(as_int(&Bson::Int32(5)), Some(5));
    assert_eq!(as_int(&Bson::Int64(-7)), Some(-7));
    assert_eq!(as_int(&Bson::Double(3.0)), Some(3));
    assert_eq!(as_int(&Bson::Double(3.5)), None);
    assert_eq!(as_int(&Bson::String("3".into())), Some(3));
    assert_eq!(as_int(&Bson::String(" -2 ".into())), Some(-2));
    assert_eq!(as_int(&Bson::String("2.0".into())), Some(2));
    assert_eq!(as_int(&Bson::String("x".into())), None);
    assert_eq!(as_int(&Bson::String("2.5".into())), None);
    assert_eq!(crate::store::queue_doc::opt_int_bson(Some(5)), Bson::Int32(5));
    assert_eq!(
        crate::store::queue_doc::opt_int_bson(Some(1 << 40)),
        Bson::Int64(1 << 40)
    );
}

#[test]
fn task_parses_spec_document() {
    let mut d = task_doc();
    let t = task_from(&d).unwrap();
    assert_eq!(t.status, -2);
    assert_eq!(t.node, None);
    assert_eq!(t.stdout, None);
    d.insert("status", Bson::Int64(1));
    d.insert("node", "n1");
    let file = ObjectId::new();
    d.insert("stdout", "out");
    d.insert("stderr", file);
    let t = task_from(&d).unwrap();
    assert_eq!(t.status, 1);
    assert_eq!(t.node.as_deref(), Some("n1"));
    assert_eq!(t.stdout, Some(Output::Inline("out".into())));
    assert_eq!(t.stderr, Some(Output::File(file)));
}

#[test]
fn task_errors_name_the_field() {
    let mut d = task_doc();
    d.insert("status", "queued");
    assert!(reason(task_from(&d).unwrap_err()).contains("`status`"));
    let mut d = task_doc();
    d.insert("queue", "q");
    assert!(reason(task_from(&d).unwrap_err()).contains("`queue`"));
    let mut d = task_doc();
    d.insert("stdout", 5);
    assert!(reason(task_from(&d).unwrap_err()).contains("`stdout`"));
}

#[test]
fn perl_written_task() {
    let mut d = task_doc();
    d.insert("status", "-2");
    d.insert("node", -1);
    d.insert("ctime", 1_461_693_573_i64);
    d.insert("mtime", 1_461_693_573_500.0);
    let t = task_from(&d).unwrap();
    assert_eq!(t.status, -2);
    assert_eq!(t.node, None);
    assert_eq!(t.ctime.timestamp_millis(), 1_461_693_573_000);
    assert_eq!(t.mtime.timestamp_millis(), 1_461_693_573_500);
    d.insert("ctime", "soon");
    assert!(reason(task_from(&d).unwrap_err()).contains("`ctime`"));
}

#[test]
fn unreadable_task_is_shown_with_its_problem() {
    let mut d = task_doc();
    d.insert("status", "queued");
    d.insert("params", "p");
    let t = task_or_problem(&d).unwrap();
    assert_eq!(t.status, i32::MIN);
    assert!(t.problem.unwrap().contains("`status`"));
    assert!(task_or_problem(&task_doc()).unwrap().problem.is_none());
}

#[test]
fn task_missing_times_fall_back() {
    let mut d = task_doc();
    d.remove("ctime");
    d.remove("mtime");
    d.remove("params");
    let t = task_from(&d).unwrap();
    assert_eq!(t.ctime, t.mtime);
    assert!(t.params.is_empty());
}

#[test]
fn node_maxthreads() {
    let d = doc! { "_id": ObjectId::new(), "node": "n", "timestamp": DateTime::now(), "maxthreads": 4.0 };
    assert_eq!(node_from(&d).unwrap().maxthreads, Some(4));
    let d = doc! { "_id": ObjectId::new(), "node": "n", "timestamp": DateTime::now() };
    assert_eq!(node_from(&d).unwrap().maxthreads, None);
    let d = doc! { "_id": ObjectId::new(), "node": "n", "timestamp": 1_700_000_000, "maxthreads": "3" };
    let n = node_from(&d).unwrap();
    assert_eq!(
        (n.maxthreads, n.timestamp.timestamp_millis()),
        (Some(3), 1_700_000_000_000)
    );
    let d = doc! { "_id": ObjectId::new(), "node": "n", "timestamp": DateTime::now(), "maxthreads": "x" };
    let n = node_from(&d).unwrap();
    assert_eq!(n.maxthreads, Some(0), "an unreadable limit claims nothing");
    assert!(n.problem.unwrap().contains("`maxthreads`"));
    let d = doc! { "_id": ObjectId::new(), "node": "n", "timestamp": "soon" };
    let n = node_from(&d).unwrap();
    assert_eq!(n.timestamp.timestamp_millis(), 0, "an unreadable heartbeat is stale");
    assert!(n.problem.unwrap().contains("`timestamp`"));
    let d = doc! { "_id": ObjectId::new(), "node": 5, "timestamp": DateTime::now() };
    assert!(reason(node_from(&d).unwrap_err()).contains("`node`"));
}

#[test]
fn filter_documents() {
    let q = ObjectId::new();
    let f = TaskFilter {
        queue: Some(q),
        status: Some(vec![-2, 1]),
        node: Some(None),
        ..Default::default()
    };
    assert_eq!(
        task_filter_doc(&f),
        doc! { "queue": q, "status": { "$in": [-2, 1] }, "node": { "$in": [null, -1] } }
    );
}

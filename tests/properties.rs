//! Property tests (proptest): parsers never panic and either accept or name the problem;
//! GridFS chunking and output capture round-trip any text.

use std::time::Duration;

use disbatch::config::Config;
use disbatch::runner::DirGrant;
use disbatch::store::mongo::gridfs::{split_utf8, CHUNK_SIZE};
use proptest::prelude::*;
use serde_json::{json, Value};

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        ".{0,12}".prop_map(Value::String),
        Just(json!("mongodb://localhost")),
        Just(json!("auto")),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{1,10}", inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

const KEYS: [&str; 16] = [
    "mongohost",
    "database",
    "plugins",
    "gfs",
    "activequeues",
    "ignorequeues",
    "heartbeat_stale",
    "sandbox",
    "attributes",
    "auth",
    "node",
    "plugin_dir",
    "max_instances",
    "balance",
    "bind",
    "api_token",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Any text is either a config or an error naming the file (and a key where one is at fault).
    #[test]
    fn config_text_never_panics(text in ".{0,200}") {
        if let Err(e) = Config::from_json_str(&text, "fuzz.json", &|_| None) {
            prop_assert!(e.to_string().starts_with("config file fuzz.json"), "{}", e);
        }
    }

    /// Config objects with known keys holding arbitrary values: accepted or refused naming a key.
    #[test]
    fn config_values_are_validated_per_key(
        values in prop::collection::vec((0..KEYS.len(), arb_json()), 0..8),
    ) {
        let mut obj = serde_json::Map::new();
        obj.insert("mongohost".into(), json!("mongodb://localhost"));
        obj.insert("database".into(), json!("db"));
        for (k, v) in values {
            obj.insert(KEYS[k].into(), v);
        }
        let text = Value::Object(obj).to_string();
        match Config::from_json_str(&text, "fuzz.json", &|_| None) {
            Ok(c) => {
                prop_assert!(!c.database.is_empty());
                prop_assert!(c.heartbeat_stale > Duration::ZERO);
            }
            Err(e) => {
                let msg = e.to_string();
                prop_assert!(KEYS.iter().any(|k| msg.contains(&format!("\"{k}"))), "no key named: {}", msg);
            }
        }
    }

    /// Directory grants parse or explain themselves; parsed grants print back to themselves.
    #[test]
    fn dir_grants_round_trip(s in "[a-z/:.]{0,30}") {
        match s.parse::<DirGrant>() {
            Ok(g) => {
                let again: DirGrant = g.to_string().parse().unwrap();
                prop_assert_eq!(again, g);
            }
            Err(e) => prop_assert!(e.contains("invalid directory grant")),
        }
    }

    /// GridFS chunks: concatenation is the text, each piece fits and is valid UTF-8.
    #[test]
    fn gridfs_chunks_round_trip(text in "(.|\\n){0,3000}", max in 4usize..64) {
        let pieces = split_utf8(&text, max);
        prop_assert_eq!(pieces.concat(), text.clone());
        for p in &pieces {
            prop_assert!(!p.is_empty() && p.len() <= max);
        }
        if text.is_empty() {
            prop_assert!(pieces.is_empty());
        }
    }
}

#[test]
fn gridfs_chunking_of_a_large_multibyte_text() {
    let text = "aé€😀".repeat(200_000);
    let pieces = split_utf8(&text, CHUNK_SIZE);
    assert_eq!(pieces.concat(), text);
    assert!(pieces.iter().all(|p| p.len() <= CHUNK_SIZE));
    assert!(pieces.len() >= text.len().div_ceil(CHUNK_SIZE));
}

//! A fresh database per test, with a driver handle and a connected store.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bson::doc;
use disbatch::store::mongo::MongoStore;
use disbatch::store::Store;
use mongodb::options::ClientOptions;
use mongodb::{Client, Database};

use super::server::server_uri;

/// A test's own database.
pub struct TestDb {
    /// The server's URI.
    pub uri: String,
    /// The database name, unique to this test.
    pub name: String,
    /// The database.
    pub db: Database,
    /// The store on this database, indexes ensured.
    pub store: MongoStore,
}

/// A unique database name: `<hint>_<pid>_<counter>`, the hint cut to characters valid in
/// a database name.
pub fn unique_db_name(hint: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let clean: String = hint
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' })
        .take(40)
        .collect();
    format!("{clean}_{}_{n}", std::process::id())
}

/// A fresh database on the shared test server (see [`server_uri`]).
pub async fn test_db(hint: &str) -> TestDb {
    let uri = tokio::task::spawn_blocking(server_uri)
        .await
        .expect("starting the test server panicked");
    test_db_at(&uri, hint).await
}

/// A fresh database on the server at `uri` (e.g. a [`super::TestServer`] of the test's own).
pub async fn test_db_at(uri: &str, hint: &str) -> TestDb {
    let name = unique_db_name(hint);
    let mut options = ClientOptions::parse(uri)
        .await
        .unwrap_or_else(|e| panic!("bad test server URI {uri:?}: {e}"));
    options.server_selection_timeout = Some(Duration::from_secs(10));
    // The driver's monitor gives a server this long to answer its check, and on a miss it
    // interrupts every command in flight. A loaded test machine can keep the test server
    // from answering for longer than the default 10 s; a test's own reads and writes wait.
    options.connect_timeout = Some(Duration::from_secs(60));
    let client = Client::with_options(options).expect("cannot create a driver client");
    let db = client.database(&name);
    db.run_command(doc! { "ping": 1 })
        .await
        .unwrap_or_else(|e| panic!("test server at {uri} does not answer: {e}"));
    let store = MongoStore::from_database(db.clone());
    store
        .ensure_indexes()
        .await
        .unwrap_or_else(|e| panic!("ensure_indexes on {name}: {e}"));
    TestDb {
        uri: uri.to_string(),
        name,
        db,
        store,
    }
}

//! Plugins of the embedded store: one row of `plugins` per version, bytes included.

use async_trait::async_trait;
use bson::DateTime;
use rusqlite::{params, OptionalExtension};

use super::records::db_err;
use super::SqliteStore;
use crate::store::plugins::is_digest;
use crate::store::{PluginStore, PluginVersion, Pushed, StoreError, StoreResult};

/// The table of plugin versions.
pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS plugins (
    name TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    size INTEGER NOT NULL,
    wit TEXT,
    uploaded INTEGER NOT NULL,
    uploaded_by TEXT,
    bytes BLOB NOT NULL,
    PRIMARY KEY (name, sha256)
);
CREATE INDEX IF NOT EXISTS plugins_name_uploaded ON plugins (name, uploaded);
";

const COLUMNS: &str = "name, sha256, size, wit, uploaded, uploaded_by";

fn version_from(row: &rusqlite::Row<'_>) -> rusqlite::Result<PluginVersion> {
    Ok(PluginVersion {
        name: row.get(0)?,
        sha256: row.get(1)?,
        size: u64::try_from(row.get::<_, i64>(2)?).unwrap_or(0),
        wit: row.get(3)?,
        uploaded: DateTime::from_millis(row.get(4)?),
        uploaded_by: row.get(5)?,
    })
}

#[async_trait]
impl PluginStore for SqliteStore {
    async fn put_plugin(&self, version: &PluginVersion, bytes: &[u8]) -> StoreResult<Pushed> {
        let (v, bytes) = (version.clone(), bytes.to_vec());
        let size = i64::try_from(v.size).map_err(|_| StoreError::Rejected("plugin size out of range".into()))?;
        self.write_quiet("store plugin", move |tx| {
            let touched = tx
                .execute(
                    "UPDATE plugins SET uploaded = ?3, uploaded_by = ?4 WHERE name = ?1 AND sha256 = ?2",
                    params![v.name, v.sha256, v.uploaded.timestamp_millis(), v.uploaded_by],
                )
                .map_err(db_err("store plugin"))?;
            if touched > 0 {
                return Ok(Pushed::Existing);
            }
            tx.execute(
                &format!("INSERT INTO plugins ({COLUMNS}, bytes) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"),
                params![
                    v.name,
                    v.sha256,
                    size,
                    v.wit,
                    v.uploaded.timestamp_millis(),
                    v.uploaded_by,
                    bytes
                ],
            )
            .map_err(db_err("store plugin"))?;
            Ok(Pushed::Created)
        })
        .await
    }

    async fn plugin_versions(&self, name: Option<&str>) -> StoreResult<Vec<PluginVersion>> {
        let name = name.map(str::to_owned);
        self.with(move |conn| {
            let mut stmt = conn
                .prepare_cached(&format!(
                    "SELECT {COLUMNS} FROM plugins WHERE ?1 IS NULL OR name = ?1 ORDER BY uploaded DESC, rowid DESC"
                ))
                .map_err(db_err("list plugins"))?;
            let rows = stmt
                .query_map(params![name], version_from)
                .map_err(db_err("list plugins"))?;
            let versions = rows.collect::<Result<Vec<_>, _>>().map_err(db_err("list plugins"))?;
            Ok(versions.into_iter().filter(|v| is_digest(&v.sha256)).collect())
        })
        .await
    }

    async fn plugin_bytes(&self, name: &str, sha256: &str) -> StoreResult<Option<Vec<u8>>> {
        let (name, sha256) = (name.to_owned(), sha256.to_owned());
        self.with(move |conn| {
            conn.query_row(
                "SELECT bytes FROM plugins WHERE name = ?1 AND sha256 = ?2",
                params![name, sha256],
                |row| row.get(0),
            )
            .optional()
            .map_err(db_err("read plugin"))
        })
        .await
    }

    async fn delete_plugin(&self, name: &str) -> StoreResult<u64> {
        let name = name.to_owned();
        self.write_quiet("delete plugin", move |tx| {
            let n = tx
                .execute("DELETE FROM plugins WHERE name = ?1", params![name])
                .map_err(db_err("delete plugin"))?;
            Ok(n as u64)
        })
        .await
    }
}

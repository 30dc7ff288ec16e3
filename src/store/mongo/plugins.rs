//! Plugins on MongoDB: each version a file of the GridFS bucket `plugins` with Binary
//! chunks. The chunks are written before the file document, so a reader never sees a
//! version whose bytes are incomplete; deleting removes the file documents first.

use async_trait::async_trait;
use bson::oid::ObjectId;
use bson::spec::BinarySubtype;
use bson::{doc, Binary, Bson, Document};
use futures::TryStreamExt;
use mongodb::options::IndexOptions;
use mongodb::IndexModel;

use super::gridfs::CHUNK_SIZE;
use super::records::{as_date, as_int};
use super::{db_err, is_duplicate_key, MongoStore};
use crate::store::plugins::{is_digest, MAX_PLUGIN_BYTES};
use crate::store::{PluginStore, PluginVersion, Pushed, StoreError, StoreResult};

/// Collection of the plugin files (one per version).
pub const PLUGIN_FILES: &str = "plugins.files";
/// Collection of the plugin files' chunks.
pub const PLUGIN_CHUNKS: &str = "plugins.chunks";
/// Chunks sent per `insert_many` (about 5 MiB).
const CHUNKS_PER_BATCH: usize = 20;

impl MongoStore {
    fn plugin_files(&self) -> mongodb::Collection<Document> {
        self.db.collection(PLUGIN_FILES)
    }

    fn plugin_chunks(&self) -> mongodb::Collection<Document> {
        self.db.collection(PLUGIN_CHUNKS)
    }

    /// The indexes of the bucket: one file per plugin and digest, chunks by file and number.
    pub(super) async fn ensure_plugin_indexes(&self) -> StoreResult<()> {
        let unique = |keys: Document| {
            IndexModel::builder()
                .keys(keys)
                .options(IndexOptions::builder().unique(true).build())
                .build()
        };
        let err = db_err("create plugin indexes");
        self.plugin_files()
            .create_indexes([
                unique(doc! { "filename": 1, "metadata.sha256": 1 }),
                IndexModel::builder()
                    .keys(doc! { "filename": 1, "uploadDate": 1 })
                    .build(),
            ])
            .await
            .map_err(&err)?;
        self.plugin_chunks()
            .create_index(unique(doc! { "files_id": 1, "n": 1 }))
            .await
            .map_err(&err)?;
        Ok(())
    }

    /// Makes an existing version the newest again; whether there was one.
    async fn touch_plugin(&self, v: &PluginVersion) -> StoreResult<bool> {
        let by = v.uploaded_by.clone().map_or(Bson::Null, Bson::String);
        let r = self
            .plugin_files()
            .update_one(
                doc! { "filename": &v.name, "metadata.sha256": &v.sha256 },
                doc! { "$set": { "uploadDate": v.uploaded, "metadata.uploaded_by": by } },
            )
            .await
            .map_err(db_err("store plugin"))?;
        Ok(r.matched_count > 0)
    }

    fn version_from(&self, d: &Document) -> Option<PluginVersion> {
        let id = d.get("_id").map(|b| b.to_string()).unwrap_or_else(|| "?".into());
        let meta = d.get_document("metadata").ok();
        let text = |m: Option<&Document>, k: &str| m.and_then(|m| m.get_str(k).ok()).map(str::to_owned);
        let version = (|| {
            Some(PluginVersion {
                name: d.get_str("filename").ok()?.to_owned(),
                sha256: text(meta, "sha256").filter(|s| is_digest(s))?,
                size: u64::try_from(as_int(d.get("length")?)?).ok()?,
                wit: text(meta, "wit"),
                uploaded: as_date(d.get("uploadDate")?)?,
                uploaded_by: text(meta, "uploaded_by"),
            })
        })();
        if version.is_none() {
            self.warn_once(format!(
                "{PLUGIN_FILES} document {id} is not a plugin version (it needs filename, length, uploadDate and metadata.sha256 of 64 lowercase hex digits); ignored"
            ));
        }
        version
    }
}

#[async_trait]
impl PluginStore for MongoStore {
    async fn put_plugin(&self, v: &PluginVersion, bytes: &[u8]) -> StoreResult<Pushed> {
        if self.touch_plugin(v).await? {
            return Ok(Pushed::Existing);
        }
        let id = ObjectId::new();
        let chunks: Vec<Document> = bytes
            .chunks(CHUNK_SIZE)
            .enumerate()
            .map(|(n, data)| {
                doc! {
                    "files_id": id,
                    "n": n as i32,
                    "data": Binary { subtype: BinarySubtype::Generic, bytes: data.to_vec() },
                }
            })
            .collect();
        for batch in chunks.chunks(CHUNKS_PER_BATCH) {
            if let Err(e) = self.plugin_chunks().insert_many(batch.to_vec()).await {
                self.discard_chunks(&[id]).await;
                return Err(db_err("store plugin")(e));
            }
        }
        let file = doc! {
            "_id": id,
            "filename": &v.name,
            "length": i64::try_from(bytes.len()).unwrap_or(i64::MAX),
            "chunkSize": CHUNK_SIZE as i32,
            "uploadDate": v.uploaded,
            "metadata": {
                "sha256": &v.sha256,
                "wit": v.wit.clone().map_or(Bson::Null, Bson::String),
                "uploaded_by": v.uploaded_by.clone().map_or(Bson::Null, Bson::String),
            },
        };
        match self.plugin_files().insert_one(file).await {
            Ok(_) => Ok(Pushed::Created),
            Err(e) => {
                self.discard_chunks(&[id]).await;
                if is_duplicate_key(&e) && self.touch_plugin(v).await? {
                    // Pushed at the same moment by someone else.
                    Ok(Pushed::Existing)
                } else {
                    Err(db_err("store plugin")(e))
                }
            }
        }
    }

    async fn plugin_versions(&self, name: Option<&str>) -> StoreResult<Vec<PluginVersion>> {
        let filter = match name {
            Some(n) => doc! { "filename": n },
            None => doc! {},
        };
        let docs: Vec<Document> = self
            .plugin_files()
            .find(filter)
            .sort(doc! { "uploadDate": -1, "_id": -1 })
            .await
            .map_err(db_err("list plugins"))?
            .try_collect()
            .await
            .map_err(db_err("list plugins"))?;
        Ok(docs.iter().filter_map(|d| self.version_from(d)).collect())
    }

    async fn plugin_bytes(&self, name: &str, sha256: &str) -> StoreResult<Option<Vec<u8>>> {
        let Some(file) = self
            .plugin_files()
            .find_one(doc! { "filename": name, "metadata.sha256": sha256 })
            .await
            .map_err(db_err("read plugin"))?
        else {
            return Ok(None);
        };
        let id = file.get("_id").cloned().unwrap_or(Bson::Null);
        let malformed = |reason: String| StoreError::Malformed {
            collection: PLUGIN_FILES,
            id: id.to_string(),
            reason,
        };
        let length = file
            .get("length")
            .and_then(as_int)
            .and_then(|l| usize::try_from(l).ok())
            .filter(|l| *l <= MAX_PLUGIN_BYTES)
            .ok_or_else(|| malformed(format!("length is not a size of at most {MAX_PLUGIN_BYTES} bytes")))?;
        let mut chunks = self
            .plugin_chunks()
            .find(doc! { "files_id": &id })
            .sort(doc! { "n": 1 })
            .await
            .map_err(db_err("read plugin"))?;
        let mut bytes = Vec::with_capacity(length);
        let mut expect = 0i64;
        while let Some(chunk) = chunks.try_next().await.map_err(db_err("read plugin"))? {
            if chunk.get("n").and_then(as_int) != Some(expect) {
                return Err(malformed(format!("chunk {expect} is missing")));
            }
            match chunk.get("data") {
                Some(Bson::Binary(b)) => bytes.extend_from_slice(&b.bytes),
                _ => return Err(malformed(format!("chunk {expect} has no Binary data"))),
            }
            if bytes.len() > length {
                return Err(malformed(format!(
                    "the chunks hold more than its length of {length} bytes"
                )));
            }
            expect += 1;
        }
        if bytes.len() != length {
            return Err(malformed(format!(
                "the chunks hold {} bytes, not its length of {length}",
                bytes.len()
            )));
        }
        Ok(Some(bytes))
    }

    async fn delete_plugin(&self, name: &str) -> StoreResult<u64> {
        let ids: Vec<ObjectId> = self
            .plugin_files()
            .find(doc! { "filename": name })
            .projection(doc! { "_id": 1 })
            .await
            .map_err(db_err("delete plugin"))?
            .try_collect::<Vec<Document>>()
            .await
            .map_err(db_err("delete plugin"))?
            .iter()
            .filter_map(|d| d.get_object_id("_id").ok())
            .collect();
        let deleted = self
            .plugin_files()
            .delete_many(doc! { "_id": { "$in": &ids } })
            .await
            .map_err(db_err("delete plugin"))?
            .deleted_count;
        self.plugin_chunks()
            .delete_many(doc! { "files_id": { "$in": &ids } })
            .await
            .map_err(db_err("delete plugin"))?;
        Ok(deleted)
    }
}

impl MongoStore {
    /// Deletes the chunks of files that were not stored, logging a failure (left-over
    /// chunks without a file document are never read).
    async fn discard_chunks(&self, ids: &[ObjectId]) {
        if let Err(e) = self
            .plugin_chunks()
            .delete_many(doc! { "files_id": { "$in": ids } })
            .await
        {
            tracing::warn!(error = %e, "could not delete the chunks of a plugin that was not stored");
        }
    }
}

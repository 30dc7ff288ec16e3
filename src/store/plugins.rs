//! Plugins kept in the store: components uploaded once (`POST /plugins`) that every DEN
//! of the database can run.
//!
//! A plugin has versions, one per distinct component (by SHA-256) pushed under its name.
//! The newest is the one a queue naming the plugin runs; a queue may pin one instead
//! (`plugin: "name@sha256:<hex>"`, see [`PluginRef`]). Pushing a component the name
//! already has makes that version the newest again without storing the bytes twice.
//!
//! MongoDB keeps each version as a file of the GridFS bucket `plugins` (`plugins.files`,
//! `plugins.chunks`, Binary chunks): `filename` is the plugin's name, `uploadDate` when it
//! was last pushed, `metadata` `{sha256, wit, uploaded_by}`. The embedded store keeps a
//! row per version, bytes included, in its file.

use async_trait::async_trait;
use bson::DateTime;

use super::StoreResult;

/// Largest component the store accepts: 128 MiB (a Python component is about 18 MB).
pub const MAX_PLUGIN_BYTES: usize = 128 << 20;

/// One stored version of a plugin (its bytes excepted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginVersion {
    /// The plugin's name.
    pub name: String,
    /// Hex SHA-256 of the component's bytes.
    pub sha256: String,
    /// Size of the component in bytes.
    pub size: u64,
    /// Version of the `disbatch:plugin` interface the component imports, when it imports
    /// one (a component that never reports progress imports none).
    pub wit: Option<String>,
    /// When this version was last pushed.
    pub uploaded: DateTime,
    /// Who pushed it, when known.
    pub uploaded_by: Option<String>,
}

/// What [`PluginStore::put_plugin`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    /// A new version was stored.
    Created,
    /// The plugin already had this component; it is the newest version again.
    Existing,
}

/// A queue's `plugin`: a name, optionally pinned to one version by digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginRef {
    /// The plugin's name.
    pub name: String,
    /// The pinned version's hex SHA-256 (lowercase), if pinned.
    pub pin: Option<String>,
}

impl PluginRef {
    /// Parses `name` or `name@sha256:<64 hex digits>`.
    pub fn parse(s: &str) -> Result<PluginRef, String> {
        let Some((name, digest)) = s.split_once('@') else {
            return Ok(PluginRef {
                name: s.to_owned(),
                pin: None,
            });
        };
        let hex = digest.strip_prefix("sha256:").ok_or_else(|| {
            format!("plugin {s:?}: a pinned version is written name@sha256:<64 hex digits>, not {digest:?}")
        })?;
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!(
                "plugin {s:?}: the digest after sha256: must be 64 hex digits, got {} characters",
                hex.len()
            ));
        }
        Ok(PluginRef {
            name: name.to_owned(),
            pin: Some(hex.to_ascii_lowercase()),
        })
    }
}

impl std::fmt::Display for PluginRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.pin {
            Some(pin) => write!(f, "{}@sha256:{pin}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// The newest version of each plugin in `versions` (which lists the newest first).
pub fn newest(versions: &[PluginVersion]) -> Vec<&PluginVersion> {
    let mut seen = std::collections::HashSet::new();
    versions.iter().filter(|v| seen.insert(v.name.as_str())).collect()
}

/// Whether `s` is a digest as stored: 64 lowercase hex digits. A stored version whose
/// digest is anything else is ignored, so a digest never names a path outside the cache.
pub fn is_digest(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Hex SHA-256 of `bytes`, as plugins are named by.
pub fn digest(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(bytes))
}

/// The plugin operations of a [`Store`](super::Store).
#[async_trait]
pub trait PluginStore: Send + Sync {
    /// Stores `bytes` as version `version` (whose `sha256` and `size` describe them) of
    /// plugin `version.name`, or, when the plugin has that component already, makes it
    /// the newest version again with `version`'s `uploaded` and `uploaded_by`.
    async fn put_plugin(&self, version: &PluginVersion, bytes: &[u8]) -> StoreResult<Pushed>;

    /// The stored versions of plugin `name`, or of every plugin when `None`; newest first.
    async fn plugin_versions(&self, name: Option<&str>) -> StoreResult<Vec<PluginVersion>>;

    /// The bytes of version `sha256` of plugin `name`, as stored (the caller verifies
    /// them); `None` when there is no such version.
    async fn plugin_bytes(&self, name: &str, sha256: &str) -> StoreResult<Option<Vec<u8>>>;

    /// Deletes every version of plugin `name`; returns how many there were.
    async fn delete_plugin(&self, name: &str) -> StoreResult<u64>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_refs() {
        let plain = PluginRef::parse("demo").unwrap();
        assert_eq!((plain.name.as_str(), plain.pin), ("demo", None));
        let hex = "AB".repeat(32);
        let pinned = PluginRef::parse(&format!("demo@sha256:{hex}")).unwrap();
        assert_eq!(pinned.pin.as_deref(), Some("ab".repeat(32).as_str()));
        assert_eq!(pinned.to_string(), format!("demo@sha256:{}", "ab".repeat(32)));
        assert!(PluginRef::parse("demo@md5:00").unwrap_err().contains("name@sha256:"));
        assert!(PluginRef::parse("demo@sha256:abc")
            .unwrap_err()
            .contains("64 hex digits"));
        assert!(PluginRef::parse(&format!("demo@sha256:{}", "g".repeat(64))).is_err());
    }

    #[test]
    fn newest_keeps_the_first_of_each_name() {
        let v = |name: &str, sha: &str| PluginVersion {
            name: name.into(),
            sha256: sha.into(),
            size: 1,
            wit: None,
            uploaded: DateTime::now(),
            uploaded_by: None,
        };
        let all = [v("a", "2"), v("b", "1"), v("a", "1")];
        let heads: Vec<_> = newest(&all).into_iter().map(|v| (&*v.name, &*v.sha256)).collect();
        assert_eq!(heads, [("a", "2"), ("b", "1")]);
    }
}

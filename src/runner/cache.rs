//! The on-disk cache of compiled components, and the paths a grant may never expose.
//!
//! A cached artifact is native code that the host maps executable, so it must not be
//! forgeable by anyone who can write into the cache directory (for example a plugin given
//! a writable grant over it). Every artifact is stored as `MAC || bytes`, where the MAC is
//! HMAC-SHA256 over the component's content hash, the engine's compatibility key and the
//! artifact, under a per-host secret kept in a 0600 key file in a 0700 directory of its own
//! (outside the cache directory). The MAC is verified before the artifact is deserialized;
//! a bad or missing MAC discards the artifact with a warning and the component is compiled
//! again.

use std::fs;
use std::hash::{Hash, Hasher};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::compile::{compile_in_child, CompileLimits};
use wasmtime::component::Component;
use wasmtime::Engine;

/// Length of the MAC that prefixes every cached artifact.
const MAC_LEN: usize = 32;
/// Length of the per-host secret.
const KEY_LEN: usize = 32;
/// Name of the key file inside its directory.
const KEY_FILE: &str = "cache.key";

/// `$DISBATCH_CACHE_KEY` (a file path), else `<cache dir>-key/cache.key`: next to the
/// cache directory but outside it, so a grant over the cache never exposes the key.
pub fn default_key_path(cache_dir: &Path) -> PathBuf {
    if let Some(p) = std::env::var_os("DISBATCH_CACHE_KEY") {
        return PathBuf::from(p);
    }
    let mut name = cache_dir
        .file_name()
        .map(|n| n.to_owned())
        .unwrap_or_else(|| "cache".into());
    name.push("-key");
    cache_dir.with_file_name(name).join(KEY_FILE)
}

/// The host paths no sandbox grant may contain, equal or lie inside: the cache directory
/// and the directory of its key.
pub fn protected_paths(cache_dir: Option<&Path>) -> Vec<PathBuf> {
    let Some(dir) = cache_dir else { return Vec::new() };
    let key = default_key_path(dir);
    let key_dir = key.parent().map(Path::to_owned).unwrap_or_else(|| key.clone());
    vec![dir.to_owned(), key_dir]
}

/// Canonical form of `p`, resolving the longest existing ancestor when `p` does not exist.
fn canonical(p: &Path) -> PathBuf {
    let abs = if p.is_absolute() {
        p.to_owned()
    } else {
        std::env::current_dir().unwrap_or_default().join(p)
    };
    let mut rest = Vec::new();
    let mut cur = abs.as_path();
    loop {
        if let Ok(c) = fs::canonicalize(cur) {
            return rest.iter().rev().fold(c, |acc, part| acc.join(part));
        }
        match (cur.parent(), cur.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_owned());
                cur = parent;
            }
            _ => return abs,
        }
    }
}

/// The first protected path that the grant of host directory `host` equals, contains or
/// lies inside (both sides canonicalized), if any.
pub fn grant_conflict<'a>(host: &Path, protected: &'a [PathBuf]) -> Option<&'a PathBuf> {
    let grant = canonical(host);
    protected.iter().find(|p| {
        let p = canonical(p);
        p.starts_with(&grant) || grant.starts_with(&p)
    })
}

/// Creates `dir` (mode 0700) when missing and checks that it is a directory owned by this
/// user and closed to others.
pub(crate) fn private_dir(dir: &Path, mask: u32) -> Result<(), String> {
    if !dir.exists() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let meta = fs::symlink_metadata(dir).map_err(|e| format!("cannot stat {}: {e}", dir.display()))?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if !meta.is_dir() || meta.uid() != me || meta.permissions().mode() & mask != 0 {
        return Err(format!(
            "{} is not a directory owned by this user and closed to others",
            dir.display()
        ));
    }
    Ok(())
}

/// Reads the per-host secret at `path`, creating it (0600, in a 0700 directory) on first use.
fn load_key(path: &Path) -> Result<[u8; KEY_LEN], String> {
    let dir = path
        .parent()
        .ok_or_else(|| format!("cache key path {} has no directory", path.display()))?;
    private_dir(dir, 0o077)?;
    let created = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path);
    match created {
        Ok(mut f) => {
            let mut key = [0u8; KEY_LEN];
            fs::File::open("/dev/urandom")
                .and_then(|mut r| r.read_exact(&mut key))
                .map_err(|e| format!("cannot read random bytes for the cache key: {e}"))?;
            f.write_all(&key)
                .and_then(|_| f.sync_all())
                .map_err(|e| format!("cannot write cache key {}: {e}", path.display()))?;
            return Ok(key);
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create cache key {}: {e}", path.display())),
    }
    let meta = fs::symlink_metadata(path).map_err(|e| format!("cannot stat cache key {}: {e}", path.display()))?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if !meta.is_file() || meta.uid() != me || meta.permissions().mode() & 0o077 != 0 {
        return Err(format!(
            "cache key {} is not a file owned by this user with mode 0600",
            path.display()
        ));
    }
    let bytes = fs::read(path).map_err(|e| format!("cannot read cache key {}: {e}", path.display()))?;
    bytes
        .try_into()
        .map_err(|_| format!("cache key {} is not {KEY_LEN} bytes long", path.display()))
}

struct ShaHasher(Sha256);

impl Hasher for ShaHasher {
    fn finish(&self) -> u64 {
        0
    }
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}

/// Hex SHA-256 of a component's bytes.
pub(crate) fn content_hash(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The engine's compatibility key: a wasmtime upgrade or a config change changes it.
fn engine_key(engine: &Engine) -> String {
    let mut h = ShaHasher(Sha256::new());
    engine.precompile_compatibility_hash().hash(&mut h);
    hex::encode(&h.0.finalize()[..8])
}

/// HMAC-SHA256 (RFC 2104) of the content hash, the engine key and the artifact.
fn mac(key: &[u8; KEY_LEN], hash: &str, engine_key: &str, artifact: &[u8]) -> [u8; MAC_LEN] {
    // The key is shorter than SHA-256's 64-byte block, so it is zero-padded as is.
    let mut block = [0u8; 64];
    block[..KEY_LEN].copy_from_slice(key);
    let pad = |x: u8| block.map(|b| b ^ x);
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(hash.as_bytes())
        .chain_update(b"\0")
        .chain_update(engine_key.as_bytes())
        .chain_update(b"\0")
        .chain_update(artifact)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

/// Compares two MACs in time independent of where they differ.
fn same_mac(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Compiles `bytes` (in a child under `limits` when given, see [`super::compile`]), or loads
/// the compiled artifact from the cache directory; the flag tells whether it came from the
/// cache.
pub(crate) fn compile_cached(
    engine: &Engine,
    bytes: &[u8],
    hash: &str,
    cache_dir: Option<&Path>,
    limits: Option<&CompileLimits>,
) -> Result<(Component, bool), wasmtime::Error> {
    let usable = cache_dir.map(|d| {
        private_dir(d, 0o022)?;
        load_key(&default_key_path(d)).map(|k| (d, k))
    });
    let (dir, key) = match usable {
        Some(Ok(v)) => v,
        Some(Err(why)) => {
            tracing::warn!("component cache disabled: {why}");
            return Ok((compile(engine, bytes, limits)?.0, false));
        }
        None => return Ok((compile(engine, bytes, limits)?.0, false)),
    };
    let ekey = engine_key(engine);
    let path = dir.join(format!("{hash}-{ekey}.cwasm"));
    if let Ok(stored) = fs::read(&path) {
        let verified =
            stored.len() > MAC_LEN && same_mac(&mac(&key, hash, &ekey, &stored[MAC_LEN..]), &stored[..MAC_LEN]);
        if verified {
            // SAFETY: the artifact carries a valid MAC under this host's secret, so it is
            // exactly what `Component::serialize` produced for an engine with the same
            // compatibility key.
            match unsafe { Component::deserialize(engine, &stored[MAC_LEN..]) } {
                Ok(c) => return Ok((c, true)),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "discarding unusable cached component");
                }
            }
        } else {
            tracing::warn!(path = %path.display(), "discarding cached component with a bad MAC (tampered or stale); recompiling");
        }
        let _ = fs::remove_file(&path);
    }
    let (component, artifact) = compile(engine, bytes, limits)?;
    let artifact = match artifact {
        Some(a) => a,
        None => component.serialize()?,
    };
    let tag = mac(&key, hash, &ekey, &artifact);
    if let Err(e) = write_atomically(&path, &[&tag, &artifact]) {
        tracing::warn!(path = %path.display(), error = %e, "cannot cache compiled component");
    }
    Ok((component, false))
}

/// Compiles `bytes`: in a child under `limits` when given, then also returning the
/// child's artifact; in this process otherwise.
fn compile(
    engine: &Engine,
    bytes: &[u8],
    limits: Option<&CompileLimits>,
) -> Result<(Component, Option<Vec<u8>>), wasmtime::Error> {
    let Some(limits) = limits else {
        return Ok((Component::new(engine, bytes)?, None));
    };
    let artifact = compile_in_child(bytes, limits)?;
    // SAFETY: the artifact is what `Engine::precompile_component` of this same executable,
    // under the same compilation config, wrote into a pipe only this process reads.
    let component = unsafe { Component::deserialize(engine, &artifact) }?;
    Ok((component, Some(artifact)))
}

/// Writes `parts` one after the other to `path` (mode 0600) through a temporary file
/// renamed into place, so a reader sees the whole file or none. `path` lies in a directory
/// closed to others ([`private_dir`]).
pub(crate) fn write_atomically(path: &Path, parts: &[&[u8]]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    for part in parts {
        f.write_all(part)?;
    }
    f.sync_all()?;
    fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_dir_must_be_private() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("c");
        private_dir(&dir, 0o022).unwrap();
        assert_eq!(fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(private_dir(&dir, 0o022).unwrap_err().contains("closed to others"));
    }

    #[test]
    fn key_is_created_private_and_reused() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("k").join(KEY_FILE);
        let a = load_key(&path).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(load_key(&path).unwrap(), a);
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        assert!(load_key(&path).is_err());
    }

    #[test]
    fn grants_over_protected_paths_conflict() {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().join("home");
        let cache = home.join(".cache").join("disbatch").join("components");
        let protected = protected_paths(Some(&cache));
        assert!(grant_conflict(&home, &protected).is_some(), "a parent of the cache");
        assert!(grant_conflict(&cache, &protected).is_some(), "the cache itself");
        assert!(
            grant_conflict(&cache.join("x"), &protected).is_some(),
            "inside the cache"
        );
        fs::create_dir_all(home.join("data")).unwrap();
        assert!(grant_conflict(&home.join("data"), &protected).is_none());
        assert!(grant_conflict(&home.join("data/../.cache"), &protected).is_some());
    }
}

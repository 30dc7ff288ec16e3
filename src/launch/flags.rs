//! The flags choosing the config and the store (`--config`, `--embedded [FILE]`,
//! `--plugin-dir DIR`) and the [`Config`] they give: with `--embedded` the config file is
//! optional, and without one the defaults apply with every `*.wasm` of the plugin
//! directory allowed.

use std::path::{Path, PathBuf};

use super::StartError;
use crate::config::{check_plugin_name, Config, StoreKind};

/// The config file used when neither `--config` nor `--embedded` is given and the file
/// exists (Disbatch 4's default).
pub const DEFAULT_CONFIG_PATH: &str = "/etc/disbatch/config.json";

/// Default file of the embedded store (`--embedded` without a value, `disbatch dev --db`).
pub const DEFAULT_EMBEDDED_PATH: &str = "./disbatch.db";

/// The flags choosing the config and the store, shared by `den` and `disbatch web`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct StoreArgs {
    /// The JSON config file (optional with --embedded: the defaults apply without one).
    #[arg(long, env = "DISBATCH_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Use the embedded store, a SQLite file (default ./disbatch.db), instead of MongoDB.
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = DEFAULT_EMBEDDED_PATH)]
    pub embedded: Option<PathBuf>,
    /// Directory of plugin components, over the config's `plugin_dir`. Without a config
    /// file every `*.wasm` in it is an allowed plugin.
    #[arg(long, value_name = "DIR")]
    pub plugin_dir: Option<PathBuf>,
}

impl StoreArgs {
    /// The host files these flags name, which no plugin may be granted: the config file
    /// and the embedded database.
    pub fn host_files(&self) -> Vec<PathBuf> {
        let default = Path::new(DEFAULT_CONFIG_PATH);
        let mut files: Vec<PathBuf> = self
            .config_file(default)
            .into_iter()
            .chain(self.embedded.clone())
            .collect();
        // A Disbatch 4 config there (with its database passwords) is protected even when
        // another file is in use.
        if default.is_file() && !files.iter().any(|f| f == default) {
            files.push(default.to_owned());
        }
        files
    }

    /// The config file these flags give: `--config`, else `default` when there is no
    /// `--embedded` and `default` exists.
    fn config_file(&self, default: &Path) -> Option<PathBuf> {
        match &self.config {
            Some(path) => Some(path.clone()),
            None if self.embedded.is_none() && default.is_file() => Some(default.to_owned()),
            None => None,
        }
    }

    /// The config these flags give: the `--config` file (the environment overrides
    /// applied), or with `--embedded` and no file the defaults; then `--plugin-dir` over
    /// `plugin_dir`; without a config file the allowed plugins are the `*.wasm` files of
    /// the plugin directory ([`allow_plugins_in_dir`]).
    pub fn load_config(&self) -> Result<Config, StartError> {
        self.load_config_with(Path::new(DEFAULT_CONFIG_PATH))
    }

    /// [`StoreArgs::load_config`] with `default` as the default config file.
    fn load_config_with(&self, default: &Path) -> Result<Config, StartError> {
        let env = |k: &str| std::env::var(k).ok();
        let kind = if self.embedded.is_some() {
            StoreKind::Embedded
        } else {
            StoreKind::Mongo
        };
        let file = self.config_file(default);
        let mut config = match &file {
            Some(path) => Config::load_for(path, kind, &env)?,
            None if self.embedded.is_some() => Config::defaults(&env)?,
            None => {
                return Err(StartError::Usage(format!(
                    "no config file: give --config FILE (or set DISBATCH_CONFIG; {} is used when it \
                         exists), or use --embedded [FILE] to run on the embedded store without one",
                    default.display()
                )))
            }
        };
        if let Some(dir) = &self.plugin_dir {
            config.plugin_dir = dir.clone();
        }
        if file.is_none() {
            allow_plugins_in_dir(&mut config)?;
        }
        let mut own = self.host_files();
        own.extend(file);
        own.push(config.plugin_dir.clone());
        own.extend(config.cache_dir.clone().or_else(crate::runner::default_cache_dir));
        check_web_root(&mut config, &own)?;
        Ok(config)
    }
}

/// Refuses a `web_root` that holds one of the host's own files (`own`: the config file, the
/// embedded database, the plugin directory, the compiled-component cache), which the DCI
/// would otherwise serve to anyone.
fn check_web_root(config: &mut Config, own: &[PathBuf]) -> Result<(), StartError> {
    let Some(root) = config.web_root.as_deref() else {
        return Ok(());
    };
    let Ok(root) = std::fs::canonicalize(root) else {
        // A DEN-only host of a Disbatch 4 installation has no htdocs: nothing to serve.
        config.warnings.push(format!(
            "web_root {} does not exist; `disbatch web` serves no files from it",
            root.display()
        ));
        return Ok(());
    };
    for file in own {
        let inside = match std::fs::canonicalize(file) {
            // A directory of ours (the plugins, the cache) must not hold web_root either.
            Ok(real) => real.starts_with(&root) || (real.is_dir() && root.starts_with(&real)),
            // A file not created yet will be under its nearest existing ancestor.
            Err(_) => file
                .ancestors()
                .skip(1)
                .find_map(|a| std::fs::canonicalize(if a.as_os_str().is_empty() { Path::new(".") } else { a }).ok())
                .is_some_and(|a| a.starts_with(&root)),
        };
        if inside {
            return Err(StartError::Usage(format!(
                "web_root {} would serve {}, a file of this host's own; give web_root a directory of web documents only",
                root.display(),
                file.display()
            )));
        }
    }
    Ok(())
}

/// Sets `config.plugins` to the stem of every `*.wasm` file in `config.plugin_dir`, sorted.
/// Files whose stem is not a valid plugin name are left out with a warning in
/// `config.warnings`; a directory without components gets a warning too, and one that
/// cannot be read is an error naming it.
pub fn allow_plugins_in_dir(config: &mut Config) -> Result<(), StartError> {
    let dir = &config.plugin_dir;
    let entries = std::fs::read_dir(dir).map_err(|e| {
        StartError::Usage(format!(
            "cannot read the plugin directory {}: {e}; --plugin-dir DIR names the directory of plugin components",
            dir.display()
        ))
    })?;
    let mut plugins = Vec::new();
    for entry in entries {
        let path = entry
            .map_err(|e| StartError::Usage(format!("cannot read the plugin directory {}: {e}", dir.display())))?
            .path();
        if path.extension().is_none_or(|e| e != "wasm") || !path.is_file() {
            continue;
        }
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
            config
                .warnings
                .push(format!("{}: the file name is not UTF-8, not a plugin", path.display()));
            continue;
        };
        match check_plugin_name(stem) {
            Ok(()) => plugins.push(stem.to_owned()),
            Err(e) => config.warnings.push(format!("{}: {e}, not a plugin", path.display())),
        }
    }
    plugins.sort();
    if plugins.is_empty() {
        config
            .warnings
            .push(format!("no plugin components (*.wasm) in {}", dir.display()));
    }
    config.plugins = plugins;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugins_are_the_components_of_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        for f in ["b.wasm", "a.wasm", ".hidden.wasm", "notes.txt", "wasm"] {
            std::fs::write(dir.path().join(f), b"").unwrap();
        }
        std::fs::create_dir(dir.path().join("dir.wasm")).unwrap();
        let mut config = Config::defaults(&|_| None).unwrap();
        config.plugin_dir = dir.path().to_owned();
        allow_plugins_in_dir(&mut config).unwrap();
        assert_eq!(config.plugins, ["a", "b"]);
        assert!(
            config.warnings.iter().any(|w| w.contains(".hidden.wasm")),
            "{:?}",
            config.warnings
        );

        config.plugin_dir = dir.path().join("none");
        let e = allow_plugins_in_dir(&mut config).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(
            e.to_string().contains("none") && e.to_string().contains("--plugin-dir"),
            "{e}"
        );
    }

    #[test]
    fn a_config_file_is_needed_without_embedded() {
        let dir = tempfile::tempdir().unwrap();
        let default = dir.path().join("config.json");
        let e = StoreArgs::default().load_config_with(&default).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("--embedded"), "{e}");
        assert!(e.to_string().contains(&*default.to_string_lossy()), "{e}");
    }

    #[test]
    fn the_default_config_file_is_used_when_it_exists() {
        let dir = tempfile::tempdir().unwrap();
        let default = dir.path().join("config.json");
        std::fs::write(
            &default,
            "# as Disbatch 4 writes it\n{\"mongohost\": \"mongodb://db:27017\", \"database\": \"perl\",}\n",
        )
        .unwrap();
        let args = StoreArgs::default();
        let config = args.load_config_with(&default).unwrap();
        assert_eq!(config.database, "perl");
        assert_eq!(args.config_file(&default), Some(default.clone()));
        // With --embedded and no --config the defaults apply, not the file.
        let embedded = StoreArgs {
            embedded: Some(dir.path().join("d.db")),
            plugin_dir: Some(dir.path().to_owned()),
            ..StoreArgs::default()
        };
        assert_eq!(embedded.config_file(&default), None);
    }
}

//! `disbatch web` as a real process on a test database, and the `disbatch` client verbs run
//! as processes against it.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use serde_json::{json, Value};

/// A `disbatch web` process; killed when dropped.
pub struct Web {
    child: Child,
    pub url: String,
    _dir: tempfile::TempDir,
}

impl Web {
    /// Starts `disbatch web` on a free port for database `db` at `uri`, plugins `demo` and
    /// `fail`; `extra` sets more config keys. Returns once it listens.
    pub fn start(uri: &str, db: &str, extra: Value) -> Web {
        let dir = tempfile::tempdir().unwrap();
        let mut config = json!({"mongohost": uri, "database": db, "plugins": ["demo", "fail"],
            "plugin_dir": dir.path()});
        for (k, v) in extra.as_object().unwrap() {
            config[k] = v.clone();
        }
        let path = dir.path().join("web.json");
        std::fs::write(&path, config.to_string()).unwrap();
        Web::spawn(&["--config".as_ref(), path.as_os_str()], dir)
    }

    /// Starts `disbatch web --embedded <file> <args>` on a free port, without a config.
    pub fn start_embedded(file: &Path, args: &[&str]) -> Web {
        let mut all = vec!["--embedded".as_ref(), file.as_os_str()];
        all.extend(args.iter().map(OsStr::new));
        Web::spawn(&all, tempfile::tempdir().unwrap())
    }

    /// Starts `disbatch web --bind 127.0.0.1:0 <args>`; returns once it listens.
    fn spawn(args: &[&OsStr], dir: tempfile::TempDir) -> Web {
        let mut child = Command::new(env!("CARGO_BIN_EXE_disbatch"))
            .args(["web", "--bind", "127.0.0.1:0"])
            .args(args)
            .env_remove("DISBATCH_CONFIG")
            .env_remove("DISBATCH_API_TOKEN")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start disbatch web");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .strip_prefix("disbatch web: listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .trim_end_matches('/')
            .to_owned();
        Web { child, url, _dir: dir }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Runs `disbatch <args>` against this server.
    pub fn run(&self, args: &[&str]) -> Output {
        self.run_with(args, None, &[])
    }

    /// Runs `disbatch <args>` against this server with `stdin` and more environment.
    pub fn run_with(&self, args: &[&str], stdin: Option<&str>, env: &[(&str, &str)]) -> Output {
        run_disbatch(args, stdin, &[&[("DISBATCH_URL", self.url.as_str())], env].concat())
    }

    /// Runs a verb that must succeed; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "disbatch {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Runs a verb with `--json` that must succeed; returns the JSON.
    pub fn json(&self, args: &[&str]) -> Value {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        serde_json::from_str(&self.ok(&all)).unwrap()
    }
}

impl Drop for Web {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `disbatch <args>` with `stdin`, without `DISBATCH_URL` and `DISBATCH_TOKEN` from the
/// test's environment, plus `env`.
pub fn run_disbatch(args: &[&str], stdin: Option<&str>, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_disbatch"));
    cmd.args(args)
        .env_remove("DISBATCH_URL")
        .env_remove("DISBATCH_TOKEN")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let mut pipe = child.stdin.take().unwrap();
    if let Some(s) = stdin {
        pipe.write_all(s.as_bytes()).unwrap();
    }
    drop(pipe);
    child.wait_with_output().unwrap()
}

/// A process's stderr as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

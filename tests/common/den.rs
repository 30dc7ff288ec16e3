//! `den` as a real process, and waiting for conditions.

use std::ffi::OsStr;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `den` process with its config and log files; killed when dropped.
pub struct DenProcess {
    child: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl DenProcess {
    /// Starts `den` as `node` on database `db` at `uri`, with a config of test defaults
    /// (the built plugins, `heartbeat_stale` 2 s, `shutdown_grace` 1 s) overridden by `extra`.
    pub fn start(uri: &str, db: &str, node: &str, extra: serde_json::Value) -> DenProcess {
        let mut config = serde_json::json!({"mongohost": uri, "database": db});
        for (k, v) in extra.as_object().unwrap() {
            config[k] = v.clone();
        }
        DenProcess::spawn(node, config, &[], |_| {})
    }

    /// Starts `den --embedded <file>` as `node`, with a config file of the same test
    /// defaults as [`DenProcess::start`] (no `mongohost`, no `database`) overridden by `extra`.
    pub fn start_embedded(file: &Path, node: &str, extra: serde_json::Value) -> DenProcess {
        DenProcess::start_embedded_with(file, node, extra, |_| {})
    }

    /// [`DenProcess::start_embedded`] with the command adjusted by `adjust` before it runs
    /// (e.g. resource limits set in the child).
    pub fn start_embedded_with(
        file: &Path,
        node: &str,
        extra: serde_json::Value,
        adjust: impl FnOnce(&mut Command),
    ) -> DenProcess {
        DenProcess::spawn(node, extra, &["--embedded".as_ref(), file.as_os_str()], adjust)
    }

    /// Starts `den <args> --config <file>`, the config being the test defaults overridden
    /// by `extra`.
    fn spawn(node: &str, extra: serde_json::Value, args: &[&OsStr], adjust: impl FnOnce(&mut Command)) -> DenProcess {
        let dir = tempfile::tempdir().unwrap();
        let mut config = serde_json::json!({
            "plugins": ["demo"],
            "plugin_dir": super::plugins_dir(),
            "node": node,
            "heartbeat_stale": 2,
            "shutdown_grace": 1,
        });
        for (k, v) in extra.as_object().unwrap() {
            config[k] = v.clone();
        }
        let config_path = dir.path().join("den.json");
        std::fs::write(&config_path, config.to_string()).unwrap();
        let log = dir.path().join("den.log");
        let mut command = Command::new(env!("CARGO_BIN_EXE_den"));
        command
            .args(args)
            .arg("--config")
            .arg(&config_path)
            .env("DISBATCH_CACHE_DIR", dir.path().join("cache"))
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        adjust(&mut command);
        let child = command.spawn().expect("start den");
        DenProcess { child, log, _dir: dir }
    }

    /// What the process logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the process's log contains `line`, polling every 20 ms; panics with the
    /// log after `limit`. A line the process logs after a write it makes is awaited this way
    /// once the write is seen, not asserted at once.
    pub async fn wait_for_log(&self, limit: Duration, line: &str) {
        let start = Instant::now();
        while !self.log().contains(line) {
            assert!(
                start.elapsed() < limit,
                "timed out after {limit:?} waiting for {line:?} in the den's log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The file the process logs to.
    pub fn log_path(&self) -> PathBuf {
        self.log.clone()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends signal `sig` to the process.
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, sig) }, 0);
    }

    /// Waits for the process to exit; panics with its log after `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                start.elapsed() < limit,
                "den did not exit within {limit:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for DenProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `cond` every 20 ms until it holds; panics naming `what` after `limit`.
pub async fn wait_for<F, Fut>(limit: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while !cond().await {
        assert!(start.elapsed() < limit, "timed out after {limit:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

impl DenProcess {
    /// Stops the process (SIGSTOP), as a stall or a frozen VM would.
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// Lets a paused process go on (SIGCONT).
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }
}

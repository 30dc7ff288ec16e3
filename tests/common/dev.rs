//! `disbatch dev` as a real process: one process with the embedded store, a `demo` queue,
//! a DEN and the web UI.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

/// A `disbatch dev` process and the lines it printed; killed when dropped.
pub struct Dev {
    pub child: Child,
    pub lines: Vec<String>,
    pub url: String,
    pub log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Dev {
    /// Starts `disbatch dev <args>` in `cwd` and waits (at most a minute) for its three lines.
    pub fn start(cwd: &Path, args: &[&str]) -> Dev {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("dev.log");
        let mut child = Command::new(env!("CARGO_BIN_EXE_disbatch"))
            .arg("dev")
            .args(args)
            .current_dir(cwd)
            .env("DISBATCH_CACHE_DIR", dir.path().join("cache"))
            .env_remove("DISBATCH_BIND")
            .env_remove("DISBATCH_PLUGIN_DIR")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start disbatch dev");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout).lines() {
                if tx.send(line.unwrap_or_default()).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut lines = Vec::new();
        while lines.len() < 3 {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => lines.push(line),
                Err(e) => panic!(
                    "disbatch dev printed {lines:?} and then {e}:\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                ),
            }
        }
        let url = lines[0]
            .strip_prefix("disbatch dev: web UI and API at ")
            .unwrap_or_else(|| panic!("unexpected first line {:?}", lines[0]))
            .trim_end_matches('/')
            .to_owned();
        Dev {
            child,
            lines,
            url,
            log,
            _dir: dir,
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The arguments of the `disbatch …` command the third line suggests.
    pub fn try_args(&self) -> Vec<String> {
        let line = &self.lines[2];
        let cmd = line
            .strip_prefix("disbatch dev: try   disbatch ")
            .unwrap_or_else(|| panic!("unexpected third line {line:?}"));
        cmd.split_whitespace().map(str::to_owned).collect()
    }

    pub async fn get(&self, path: &str) -> (u16, String) {
        let r = reqwest::get(format!("{}{path}", self.url)).await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }

    pub async fn get_json(&self, path: &str) -> Value {
        let (status, text) = self.get(path).await;
        assert_eq!(status, 200, "GET {path}: {text}");
        serde_json::from_str(&text).unwrap()
    }

    /// Sends SIGTERM and returns the exit code, waiting at most 30 s.
    pub fn terminate(&mut self) -> Option<i32> {
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) }, 0);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            assert!(Instant::now() < deadline, "no exit 30 s after SIGTERM:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

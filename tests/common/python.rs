//! A Python with a pinned package from PyPI, for tests that check our output with another
//! project's own parser: a venv installed once per machine under
//! `${DISBATCH_TOOLS:-~/.cache/disbatch-plugin-tools}`, as `plugins/build-py-js` installs
//! its tools.

use std::path::PathBuf;
use std::process::{Command, Stdio};

/// The Python interpreter of a venv holding `requirement` (`name==version`), installing it
/// on first use. Panics saying what to install when python3, its venv module or the
/// package cannot be had.
pub fn python_with(requirement: &str) -> PathBuf {
    let tools = std::env::var_os("DISBATCH_TOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(".cache/disbatch-plugin-tools")
        });
    let version = Command::new("python3")
        .arg("--version")
        .output()
        .expect("python3 is missing: install Python 3 with its venv module (Debian: apt-get install python3-venv)");
    let version = String::from_utf8_lossy(&version.stdout).trim().replace(' ', "-");
    let name: String = requirement
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '.' { c } else { '-' })
        .collect();
    let env = tools.join(format!("test-{name}-{version}"));
    let python = env.join("bin/python");
    if env.join(".installed").is_file() {
        return python;
    }
    // Installed beside it, then renamed into place: concurrent tests never see half a venv.
    std::fs::create_dir_all(&tools).unwrap();
    let staging = tools.join(format!("test-{name}-{version}.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    let run = |cmd: &mut Command, what: &str| {
        let out = cmd
            .stdout(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(
            out.status.success(),
            "{what} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(
        Command::new("python3").args(["-m", "venv"]).arg(&staging),
        "python3 -m venv (install Python's venv module: apt-get install python3-venv)",
    );
    run(
        Command::new(staging.join("bin/python")).args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            requirement,
        ]),
        &format!("pip install {requirement}"),
    );
    std::fs::write(staging.join(".installed"), requirement).unwrap();
    if env.is_dir() && !env.join(".installed").is_file() {
        // Left half-made by an install that was interrupted.
        let _ = std::fs::remove_dir_all(&env);
    }
    if std::fs::rename(&staging, &env).is_err() {
        // Another test installed it first.
        let _ = std::fs::remove_dir_all(&staging);
    }
    assert!(env.join(".installed").is_file(), "{} was not installed", env.display());
    python
}

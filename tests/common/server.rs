//! The test database server: `secantusd-rs`, a MongoDB-wire server, started on a free port
//! in a directory of its own.
//!
//! [`server_uri`] gives every test of a binary the same server (started once, or the one
//! `MONGODB_URI` names). [`TestServer::start_private`] gives a test a server of its own to
//! stop, kill and restart on the same data. Servers are spawned from one long-lived thread
//! with `PR_SET_PDEATHSIG`, so they die with the test binary whatever way it ends; their
//! directories live under `target/tmp/secantus/<pid>-…` and those of dead test binaries
//! are removed when the next one starts a server.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bson::{doc, Document};

/// The command that installs the server.
pub const INSTALL_HINT: &str = "apt-get install -y cmake && cargo install secantus-mdb --version 0.5.3-beta.196 \
                                --locked --ignore-rust-version --root /opt/secantus";
/// Where the install command puts the server.
pub const DEFAULT_BINARY: &str = "/opt/secantus/bin/secantusd-rs";
/// How long a server may take to come up.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a graceful stop may take before the server is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);

/// The URI of the server shared by all tests of this binary: `MONGODB_URI` when set,
/// else a `secantusd-rs` started on first use.
pub fn server_uri() -> String {
    if let Some(uri) = std::env::var("MONGODB_URI").ok().filter(|u| !u.is_empty()) {
        return uri;
    }
    static SHARED: OnceLock<TestServer> = OnceLock::new();
    SHARED.get_or_init(|| TestServer::start_in_new_dir("shared")).uri()
}

/// The server binary: `$SECANTUSD`, else [`DEFAULT_BINARY`], else `secantusd-rs` on `PATH`.
/// Panics with the install command when there is none.
pub fn server_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("SECANTUSD").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        assert!(
            p.is_file(),
            "SECANTUSD={} is not a file; install the test server with:\n    {INSTALL_HINT}",
            p.display()
        );
        return p;
    }
    let default = Path::new(DEFAULT_BINARY);
    if default.is_file() {
        return default.to_path_buf();
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join("secantusd-rs"))
        .find(|p| p.is_file());
    on_path.unwrap_or_else(|| {
        panic!("the test server secantusd-rs is not installed (nor $SECANTUSD set, nor on PATH); install it with:\n    {INSTALL_HINT}")
    })
}

/// A `secantusd-rs` process owned by a test. Dropping it kills the server and removes its
/// directory.
#[derive(Debug)]
pub struct TestServer {
    binary: PathBuf,
    dir: Option<tempfile::TempDir>,
    dir_path: PathBuf,
    port: u16,
    child: Option<Child>,
}

impl TestServer {
    /// Starts a server of the calling test's own, on a free port, in a new directory.
    pub fn start_private() -> TestServer {
        Self::start_in_new_dir("private")
    }

    fn start_in_new_dir(kind: &str) -> TestServer {
        let binary = server_binary();
        let root = servers_root();
        let dir = tempfile::Builder::new()
            .prefix(&format!("{}-{kind}-", std::process::id()))
            .tempdir_in(&root)
            .unwrap_or_else(|e| panic!("cannot create a server directory in {}: {e}", root.display()));
        let dir_path = dir.path().to_path_buf();
        let mut server = TestServer {
            binary,
            dir: Some(dir),
            dir_path,
            port: 0,
            child: None,
        };
        server.launch(0);
        server
    }

    /// `mongodb://127.0.0.1:<port>/?directConnection=true`.
    pub fn uri(&self) -> String {
        format!("mongodb://127.0.0.1:{}/?directConnection=true", self.port)
    }

    /// The port it listens on (kept across restarts when still free).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's data directory (WiredTiger home).
    pub fn storage_path(&self) -> PathBuf {
        self.dir_path.join("data")
    }

    /// Everything the server printed so far, across restarts.
    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Whether the process is alive.
    pub fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Stops the server gracefully (SIGTERM; SIGKILL after 20 s). Does nothing when it is
    /// not running.
    pub fn stop(&mut self) {
        self.signal_and_wait(libc::SIGTERM);
    }

    /// Kills the server at once (SIGKILL), like a crash.
    pub fn kill(&mut self) {
        self.signal_and_wait(libc::SIGKILL);
    }

    /// Stops the server when it runs, then starts it again on the same data directory and,
    /// when still free, the same port — read [`TestServer::uri`] again afterwards.
    pub fn restart(&mut self) {
        self.stop();
        let port = self.port;
        self.launch(port);
    }

    fn log_path(&self) -> PathBuf {
        self.dir_path.join("server.log")
    }

    fn signal_and_wait(&mut self, signal: libc::c_int) {
        let Some(mut child) = self.child.take() else { return };
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        let pid = child.id() as libc::pid_t;
        // SAFETY: plain kill(2) of our own child, which has not been reaped yet.
        unsafe { libc::kill(pid, signal) };
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            match child.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) if Instant::now() >= deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// Starts the process on `port` (0 = any), falling back to any port when `port` is
    /// taken, and waits until it answers a `ping`.
    fn launch(&mut self, port: u16) {
        match self.try_launch(port) {
            Ok(()) => {}
            Err(first) if port != 0 => {
                if let Err(e) = self.try_launch(0) {
                    panic!(
                        "test server did not start on port {port} ({first}) nor on any port: {e}\n{}",
                        self.log()
                    );
                }
            }
            Err(e) => panic!("test server did not start: {e}\n--- server output ---\n{}", self.log()),
        }
    }

    fn try_launch(&mut self, port: u16) -> Result<(), String> {
        let log_path = self.log_path();
        let log = File::options()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| format!("cannot open {}: {e}", log_path.display()))?;
        let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
        let stderr = log.try_clone().map_err(|e| e.to_string())?;
        let mut cmd = Command::new(&self.binary);
        cmd.arg("--host")
            .arg("127.0.0.1")
            .arg("--port")
            .arg(port.to_string())
            .arg("--storage-path")
            .arg(self.storage_path())
            .args(["--log-file-max", "16MB", "--cache-size", "256M"])
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(stderr));
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: the closure only calls async-signal-safe functions (prctl, getppid).
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                if libc::getppid() != parent {
                    return Err(io::Error::other("the test binary exited"));
                }
                Ok(())
            });
        }
        let mut child =
            spawn_from_long_lived_thread(cmd).map_err(|e| format!("cannot run {}: {e}", self.binary.display()))?;

        let deadline = Instant::now() + START_TIMEOUT;
        let found = loop {
            if let Some(p) = listening_port(&log_path, log_start) {
                break p;
            }
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!("server exited with {status} before listening"));
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("server did not listen within {START_TIMEOUT:?}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        self.port = found;
        self.child = Some(child);
        loop {
            match ping(found) {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() >= deadline => {
                    self.kill();
                    return Err(format!("server did not answer ping within {START_TIMEOUT:?}: {e}"));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.kill();
        if let Some(dir) = self.dir.take() {
            let _ = dir.close();
        }
    }
}

/// The directory holding all server directories, with those of dead test binaries removed.
fn servers_root() -> PathBuf {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let root = match option_env!("CARGO_TARGET_TMPDIR") {
            Some(tmp) => PathBuf::from(tmp),
            None => Path::new(env!("CARGO_MANIFEST_DIR")).join("target/tmp"),
        }
        .join("secantus");
        fs::create_dir_all(&root).unwrap_or_else(|e| panic!("cannot create {}: {e}", root.display()));
        if let Ok(entries) = fs::read_dir(&root) {
            for entry in entries.flatten() {
                let name = entry.file_name();
                let pid = name
                    .to_str()
                    .and_then(|n| n.split('-').next())
                    .and_then(|p| p.parse::<u32>().ok());
                if let Some(pid) = pid {
                    if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
                        let _ = fs::remove_dir_all(entry.path());
                    }
                }
            }
        }
        root
    })
    .clone()
}

/// The port of the last `listening on HOST:PORT` line the server printed after `from`.
fn listening_port(log: &Path, from: u64) -> Option<u16> {
    let text = fs::read(log).ok()?;
    let text = String::from_utf8_lossy(text.get(usize::try_from(from).ok()?..)?);
    text.lines()
        .filter_map(|line| line.split_once("listening on ").map(|(_, addr)| addr.trim()))
        .filter_map(|addr| addr.rsplit_once(':').and_then(|(_, port)| port.parse().ok()))
        .next_back()
}

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

/// Spawns `cmd` from a thread that lives as long as the test binary: `PR_SET_PDEATHSIG`
/// fires when the spawning *thread* exits, and test threads exit early.
fn spawn_from_long_lived_thread(cmd: Command) -> io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let sender = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("test-server-spawner".to_string())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("cannot start the server spawner thread");
        Mutex::new(tx)
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    sender
        .lock()
        .map_err(|_| io::Error::other("spawner lock poisoned"))?
        .send((cmd, reply_tx))
        .map_err(|_| io::Error::other("spawner thread is gone"))?;
    reply_rx
        .recv()
        .map_err(|_| io::Error::other("spawner thread is gone"))?
}

/// Sends `{ping: 1}` as an OP_MSG and checks for `ok: 1`.
pub fn ping(port: u16) -> io::Result<()> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut body = Vec::new();
    doc! { "ping": 1, "$db": "admin" }
        .to_writer(&mut body)
        .map_err(io::Error::other)?;
    let len = i32::try_from(16 + 4 + 1 + body.len()).map_err(io::Error::other)?;
    let mut msg = Vec::with_capacity(len as usize);
    msg.extend_from_slice(&len.to_le_bytes());
    msg.extend_from_slice(&1i32.to_le_bytes()); // requestID
    msg.extend_from_slice(&0i32.to_le_bytes()); // responseTo
    msg.extend_from_slice(&2013i32.to_le_bytes()); // OP_MSG
    msg.extend_from_slice(&0u32.to_le_bytes()); // flagBits
    msg.push(0); // section kind 0: body
    msg.extend_from_slice(&body);
    stream.write_all(&msg)?;

    let mut header = [0u8; 16];
    stream.read_exact(&mut header)?;
    let total = i32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    let rest = usize::try_from(total)
        .ok()
        .and_then(|t| t.checked_sub(16))
        .filter(|r| *r >= 5 && *r < 1 << 24);
    let rest = rest.ok_or_else(|| io::Error::other(format!("bad reply length {total}")))?;
    let mut reply = vec![0u8; rest];
    stream.read_exact(&mut reply)?;
    let reply = Document::from_reader(&mut &reply[5..]).map_err(io::Error::other)?;
    let ok = match reply.get("ok") {
        Some(bson::Bson::Double(f)) => *f == 1.0,
        Some(bson::Bson::Int32(n)) => *n == 1,
        Some(bson::Bson::Int64(n)) => *n == 1,
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(io::Error::other(format!("ping answered {reply}")))
    }
}

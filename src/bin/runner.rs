//! `runner`: run a Disbatch plugin component locally, exactly as the DEN runs it.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use disbatch::runner::{DirGrant, EngineOptions, Failure, Outcome, Progress, ProgressSink, Runner, Sandbox};

/// Exit codes of `runner exec` (also documented in the README).
mod exit {
    /// The task succeeded (status 1).
    pub const SUCCEEDED: u8 = 0;
    /// The plugin finished with another status or returned an error.
    pub const TASK_FAILED: u8 = 1;
    /// Bad arguments, params, plugin file or sandbox grants.
    pub const USAGE: u8 = 2;
    /// The plugin ran past its timeout.
    pub const TIMEOUT: u8 = 3;
    /// The plugin hit its memory limit.
    pub const MEMORY: u8 = 4;
    /// The plugin trapped (crashed).
    pub const TRAP: u8 = 5;
    /// The plugin returned a non-positive status.
    pub const NON_POSITIVE: u8 = 6;
}

#[derive(Parser)]
#[command(name = "runner", version, about = "Run Disbatch plugin components in the sandbox")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a plugin once with the given params, as the DEN would run a task.
    Exec(Box<ExecArgs>),
    /// Check that a file is a loadable plugin (and cache its compiled form).
    Check {
        /// The plugin component (.wasm).
        plugin: PathBuf,
    },
}

#[derive(clap::Args)]
struct ExecArgs {
    /// The plugin component (.wasm).
    plugin: PathBuf,
    /// The task's params: JSON text, @file.json, or - to read stdin.
    #[arg(long, default_value = "{}")]
    params: String,
    /// Wall-time limit, e.g. 30s, 500ms, 2m.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1h")]
    timeout: Duration,
    /// Linear-memory limit in MiB.
    #[arg(long, value_name = "MIB", default_value_t = disbatch::runner::DEFAULT_MEMORY >> 20)]
    memory: u64,
    /// Bytes kept of each of stdout and stderr, in MiB (the rest is dropped and reported).
    #[arg(long, value_name = "MIB", default_value_t = (disbatch::runner::DEFAULT_OUTPUT_CAP >> 20) as u64)]
    output_cap: u64,
    /// Grant a host directory: HOST, HOST:GUEST or HOST:GUEST:rw (read-only unless :rw). Repeatable.
    #[arg(long = "dir", value_name = "HOST[:GUEST][:rw]")]
    dirs: Vec<DirGrant>,
    /// Bytes the plugin may write into its writable grants, in MiB.
    #[arg(long, value_name = "MIB", default_value_t = disbatch::runner::DEFAULT_WRITE_QUOTA >> 20)]
    write_quota: u64,
    /// Files and directories the plugin may create in its writable grants.
    #[arg(long, value_name = "N", default_value_t = disbatch::runner::DEFAULT_FILE_QUOTA)]
    file_quota: u64,
    /// Set an environment variable (K=V), or pass one through from this process (K). Repeatable.
    #[arg(long = "env", value_name = "K=V|K")]
    env: Vec<String>,
    /// Allow TCP/UDP sockets and name lookups (loopback, private and link-local addresses stay refused).
    #[arg(long)]
    network: bool,
    /// With --network or --http, also allow this internal range (CIDR or address). Repeatable.
    #[arg(long = "network-allow", value_name = "CIDR", value_parser = disbatch::runner::parse_network_allow)]
    network_allow: Vec<ipnet::IpNet>,
    /// Allow HTTP requests to this host: [scheme://]host[:port], e.g. api.example.com or
    /// https://*.corp:8443 (internal addresses only when named or in --network-allow). Repeatable.
    #[arg(long = "http", value_name = "HOST")]
    http: Vec<disbatch::runner::HttpRule>,
    /// HTTP requests the plugin may send.
    #[arg(long, value_name = "N", default_value_t = disbatch::runner::DEFAULT_HTTP_MAX_REQUESTS)]
    http_max_requests: u32,
    /// Body bytes the plugin's HTTP requests and responses may carry together, in MiB.
    #[arg(long, value_name = "MIB", default_value_t = disbatch::runner::DEFAULT_HTTP_MAX_BODY >> 20)]
    http_max_body: u64,
    /// Grant submitting follow-up tasks to this queue (name or id), as a queue's
    /// sandbox.submit does. Nothing is created: each accepted follow-up is shown. Repeatable.
    #[arg(long = "submit", value_name = "QUEUE")]
    submit: Vec<String>,
    /// Follow-up tasks the plugin may submit.
    #[arg(long, value_name = "N", default_value_t = disbatch::runner::DEFAULT_SUBMIT_MAX)]
    submit_max: u32,
    /// Print one JSON object {status, stdout, stderr, duration_ms, error, submitted…} instead of the streams.
    #[arg(long)]
    json: bool,
    /// Do not use the on-disk cache of compiled components.
    #[arg(long)]
    no_cache: bool,
    /// Size of the instance pool, as the DEN's `max_instances` (lower it under a tight
    /// address-space limit such as `ulimit -v`).
    #[arg(long, value_name = "N", default_value_t = disbatch::config::DEFAULT_MAX_INSTANCES,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(disbatch::config::MAX_INSTANCES)))]
    max_instances: u32,
}

fn main() {
    // Compiles a component and exits when started as a compile child.
    disbatch::runner::serve_compile_child();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Exec(args) => exec(*args),
        Command::Check { plugin } => check(&plugin),
    };
    let code = match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("runner: {e:#}");
            exit::USAGE
        }
    };
    // Exit at once: a plugin thread blocked in a host call must not keep the process alive.
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    std::process::exit(code.into())
}

fn read_params(arg: &str) -> anyhow::Result<String> {
    let (text, source) = if arg == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("cannot read params from stdin")?;
        (s, "stdin".to_owned())
    } else if let Some(file) = arg.strip_prefix('@') {
        let s = std::fs::read_to_string(file).with_context(|| format!("cannot read params file {file}"))?;
        (s, file.to_owned())
    } else {
        (arg.to_owned(), "--params".to_owned())
    };
    if let Err(e) = serde_json::from_str::<serde_json::Value>(&text) {
        bail!("invalid params JSON in {source}: {e}");
    }
    Ok(text)
}

fn sandbox(args: &ExecArgs) -> anyhow::Result<Sandbox> {
    let mut env = std::collections::BTreeMap::new();
    for e in &args.env {
        match e.split_once('=') {
            Some((k, v)) if !k.is_empty() => env.insert(k.to_owned(), v.to_owned()),
            Some(_) => bail!("invalid --env {e:?}: empty variable name"),
            None => match std::env::var(e) {
                Ok(v) => env.insert(e.clone(), v),
                Err(_) => bail!("--env {e}: no such variable in this environment"),
            },
        };
    }
    if !args.network_allow.is_empty() && !args.network && args.http.is_empty() {
        bail!("--network-allow opens internal ranges to --network or --http; give one of them");
    }
    let s = Sandbox {
        timeout: args.timeout,
        memory: args.memory.checked_mul(1 << 20).context("--memory is too large")?,
        output_cap: usize::try_from(args.output_cap << 20).context("--output-cap is too large")?,
        dirs: args.dirs.clone(),
        env,
        network: args.network,
        network_allow: args.network_allow.clone(),
        write_quota: args
            .write_quota
            .checked_mul(1 << 20)
            .context("--write-quota is too large")?,
        file_quota: args.file_quota,
        http: args.http.clone(),
        http_max_requests: args.http_max_requests,
        http_max_body: args
            .http_max_body
            .checked_mul(1 << 20)
            .context("--http-max-body is too large")?,
        submit: args.submit.clone(),
        submit_max: args.submit_max,
        ..Sandbox::default()
    };
    s.validate().map_err(anyhow::Error::msg)?;
    let cache = engine_options(args.no_cache, args.max_instances).cache_dir;
    let protected = disbatch::runner::protected_paths(cache.as_deref());
    s.check_grants(&protected).map_err(anyhow::Error::msg)?;
    Ok(s)
}

fn engine_options(no_cache: bool, max_instances: u32) -> EngineOptions {
    EngineOptions {
        cache_dir: if no_cache {
            None
        } else {
            disbatch::runner::default_cache_dir()
        },
        // Exactly the DEN's engine: same pool sizing, same limits.
        max_instances,
    }
}

fn exec(args: ExecArgs) -> anyhow::Result<u8> {
    let params = read_params(&args.params)?;
    let sandbox = sandbox(&args)?;
    if !args.plugin.is_file() {
        bail!("plugin file {} does not exist", args.plugin.display());
    }
    let runner = Runner::new(&engine_options(args.no_cache, args.max_instances))?;
    let plugin = runner.load(&args.plugin)?;
    let printer = Arc::new(ProgressPrinter::default());
    let sink: Option<ProgressSink> = if args.json {
        None
    } else {
        let printer = printer.clone();
        Some(Arc::new(move |p: &Progress| printer.print(p)))
    };
    let outcome = run_bounded(runner, plugin, params, sandbox, sink);
    printer.finish();
    if args.json {
        print_json(&outcome)?;
    } else {
        print_streams(&outcome)?;
    }
    Ok(exit_code(&outcome))
}

/// How long `exec` waits, past the plugin's timeout, for a host call that does not return.
const HOST_CALL_GRACE: Duration = Duration::from_secs(1);

/// Runs the plugin on its own thread and waits at most its timeout plus
/// [`HOST_CALL_GRACE`]: a plugin stuck in a blocking host call is reported as timed out
/// (and the process exits without waiting for its thread).
fn run_bounded(
    runner: Runner,
    plugin: Arc<disbatch::runner::Plugin>,
    params: String,
    sandbox: Sandbox,
    sink: Option<ProgressSink>,
) -> Outcome {
    let timeout = sandbox.timeout;
    let (tx, rx) = std::sync::mpsc::channel();
    let started = std::time::Instant::now();
    std::thread::spawn(move || {
        let _ = tx.send(runner.run(&plugin, &params, &sandbox, sink));
    });
    match rx.recv_timeout(timeout + HOST_CALL_GRACE) {
        Ok(outcome) => outcome,
        Err(_) => {
            eprintln!("runner: the plugin is blocked in a host call past its timeout; abandoning it");
            let mut o = Outcome::not_run(Failure::Timeout(timeout));
            o.duration = started.elapsed();
            o
        }
    }
}

/// Least time between two printed progress reports.
const PROGRESS_EVERY: Duration = Duration::from_millis(100);

/// Prints progress reports to stderr, one line each with control characters escaped, at
/// most one per [`PROGRESS_EVERY`]: a plugin reporting in a tight loop cannot flood the
/// terminal. A printed line says how many reports were not shown since the last one, and
/// the last report is always printed (by [`ProgressPrinter::finish`] if it was held back).
#[derive(Default)]
struct ProgressPrinter {
    state: std::sync::Mutex<PrinterState>,
}

#[derive(Default)]
struct PrinterState {
    last: Option<std::time::Instant>,
    /// Reports not shown since the last printed one.
    skipped: u64,
    /// The latest report not shown.
    held: Option<Progress>,
}

impl PrinterState {
    /// Prints `p`, saying that `not_shown` reports before it were not printed.
    fn emit(&mut self, p: &Progress, not_shown: u64) {
        let line = disbatch::runner::escape_controls(&p.to_string()).replace('\n', "\\n");
        if not_shown > 0 {
            eprintln!("{line} ({not_shown} reports not shown)");
        } else {
            eprintln!("{line}");
        }
        self.last = Some(std::time::Instant::now());
        self.skipped = 0;
        self.held = None;
    }
}

impl ProgressPrinter {
    fn print(&self, p: &Progress) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.last.is_some_and(|t| t.elapsed() < PROGRESS_EVERY) {
            state.skipped += 1;
            state.held = Some(p.clone());
            return;
        }
        let not_shown = state.skipped;
        state.emit(p, not_shown);
    }

    /// Prints the last report if it was held back.
    fn finish(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = state.held.take() {
            let not_shown = state.skipped - 1;
            state.emit(&p, not_shown);
        }
    }
}

/// Writes a plugin's bytes: as they are to a file or pipe, with control characters
/// escaped to a terminal (a plugin must not drive the user's terminal).
fn write_plugin_bytes(w: &mut impl Write, bytes: &[u8], terminal: bool) -> std::io::Result<()> {
    if terminal {
        w.write_all(disbatch::runner::escape_controls(&String::from_utf8_lossy(bytes)).as_bytes())
    } else {
        w.write_all(bytes)
    }
}

fn print_streams(outcome: &Outcome) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    let mut out = std::io::stdout().lock();
    let out_tty = out.is_terminal();
    write_plugin_bytes(&mut out, &outcome.stdout.bytes, out_tty)?;
    out.flush()?;
    let mut err = std::io::stderr().lock();
    let err_tty = err.is_terminal();
    write_plugin_bytes(&mut err, &outcome.stderr.bytes, err_tty)?;
    for (name, c) in [("stdout", &outcome.stdout), ("stderr", &outcome.stderr)] {
        if c.truncated() {
            write!(
                err,
                "runner: {name} {}",
                disbatch::runner::truncation_marker(c.cap, c.dropped)
            )?;
        }
    }
    for s in &outcome.submitted {
        let line = format!(
            "runner: submitted to {}: {}",
            s.queue,
            serde_json::Value::Object(s.params.clone())
        );
        writeln!(
            err,
            "{}",
            if err_tty {
                disbatch::runner::escape_controls(&line)
            } else {
                line
            }
        )?;
    }
    for note in &outcome.sandbox_notes {
        let note = if err_tty {
            disbatch::runner::escape_controls(note)
        } else {
            note.clone()
        };
        writeln!(err, "runner: {note}")?;
    }
    if let Some(f) = &outcome.failure {
        let f = f.to_string();
        let f = if err_tty {
            disbatch::runner::escape_controls(&f)
        } else {
            f
        };
        writeln!(err, "runner: {f}")?;
    } else if outcome.status != disbatch::runner::SUCCEEDED {
        writeln!(err, "runner: plugin finished with status {}", outcome.status)?;
    }
    Ok(())
}

fn print_json(outcome: &Outcome) -> anyhow::Result<()> {
    let (stdout, stderr) = outcome.output_texts();
    let progress: Vec<_> = outcome
        .progress
        .iter()
        .map(|p| serde_json::json!({"at_ms": p.at.as_millis() as u64, "percent": p.percent, "info": p.info}))
        .collect();
    let doc = serde_json::json!({
        "status": outcome.status,
        "stdout": stdout,
        "stderr": stderr,
        "duration_ms": outcome.duration.as_secs_f64() * 1000.0,
        "error": outcome.failure.as_ref().map(|f| f.to_string()),
        "notes": outcome.notes(),
        "failure": outcome.failure.as_ref().map(|f| f.kind()),
        "stdout_truncated": outcome.stdout.truncated(),
        "stderr_truncated": outcome.stderr.truncated(),
        "progress": progress,
        "submitted": outcome
            .submitted
            .iter()
            .map(|s| serde_json::json!({"queue": s.queue, "params": s.params}))
            .collect::<Vec<_>>(),
    });
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, &doc)?;
    writeln!(out)?;
    Ok(())
}

fn exit_code(outcome: &Outcome) -> u8 {
    match &outcome.failure {
        None if outcome.status == disbatch::runner::SUCCEEDED => exit::SUCCEEDED,
        None | Some(Failure::Plugin(_)) => exit::TASK_FAILED,
        Some(Failure::Timeout(_)) => exit::TIMEOUT,
        Some(Failure::Memory { .. }) => exit::MEMORY,
        Some(Failure::Trap(_)) => exit::TRAP,
        Some(Failure::NonPositiveStatus(_)) => exit::NON_POSITIVE,
        Some(_) => exit::USAGE,
    }
}

/// Prints what the component imports and exports, whether this host links each import,
/// and the verdict of loading it as a DEN would: 0 when this host can run it, 2 when not.
fn check(path: &std::path::Path) -> anyhow::Result<u8> {
    use disbatch::runner::inspect::{host_provides, inspect};
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let found = inspect(&bytes).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    println!("{}", path.display());
    println!("  size     {} bytes", bytes.len());
    println!(
        "  declares {} core modules, {} instantiations of them, {} memories, {} tables",
        found.modules, found.instantiations, found.memories, found.tables
    );
    // Over a limit, the verdict of loading it below says which.
    if let Ok(shape) = disbatch::runner::check_shape(&bytes) {
        use disbatch::runner::{MAX_FUNCTION_COST, MAX_TOTAL_COST, MAX_TOTAL_OPS};
        let f = shape.costliest;
        println!(
            "  compiles {} functions, {} operators (limit {MAX_TOTAL_OPS}), cost {} (limit {MAX_TOTAL_COST})",
            shape.functions, shape.ops, shape.cost
        );
        println!(
            "  costliest function {} of core module {}: {} values x {} blocks and branches = {} (limit {MAX_FUNCTION_COST})",
            f.index,
            f.module,
            f.values(),
            f.control,
            f.cost()
        );
    }
    println!("  exports");
    for e in &found.exports {
        println!("    {} ({})", e.name, e.kind);
    }
    println!("  imports");
    for i in &found.imports {
        let linked = if host_provides(&i.name) {
            "provided"
        } else {
            "NOT PROVIDED by this host"
        };
        println!("    {:<44} {linked}", format!("{} ({})", i.name, i.kind));
    }
    // Whether a task stays within the per-task caps of core instances, memories and tables
    // is the verdict of loading it: loading counts what a task instantiates, as the task's
    // store then does, and refuses a component over a cap.
    let runner = Runner::new(&engine_options(false, disbatch::config::DEFAULT_MAX_INSTANCES))?;
    match runner.load(path) {
        Ok(plugin) => {
            let wit = plugin.wit_version().unwrap_or("none imported");
            println!(
                "ok (sha256 {}; disbatch:plugin {wit}): this host can run it",
                plugin.hash()
            );
            Ok(exit::SUCCEEDED)
        }
        Err(e) => {
            println!("this host cannot run it: {e}");
            Ok(exit::USAGE)
        }
    }
}

//! The DCI (Disbatch Command Interface): the JSON REST API, the web UI and the OpenAPI
//! document, all served by one axum [`Router`] built by [`router`].
//!
//! Routes and JSON shapes follow the Perl Disbatch 4 DCI so existing scripts keep working
//! (see `docs/api.md`): `GET /info`, `GET /nodes`, `GET|POST /nodes/{node}`, `GET|POST /plugins`,
//! `GET|DELETE /plugins/{name}`,
//! `GET|POST /queues`, `GET|POST|DELETE /queues/{queue}`, `GET|POST /tasks`,
//! `GET /tasks/{id}`, `POST /tasks/search` (deprecated), `GET /monitoring`,
//! `GET|POST /balance`, plus `GET /metrics` (Prometheus text),
//! `GET /stats` (per-minute series),
//! `GET /openapi.json` and the web UI at `/`.
//!
//! Bodies are JSON, or forms where Disbatch 4 read forms (`form`: refused with 403 when a
//! browser posts one from another site). Where Disbatch 4's answer shapes and ours
//! conflict, a request gets Disbatch 4's unless it asks for ours (`Disbatch-Shape: native`).
//!
//! Every error is a JSON object `{"error": "…"}`: 400 naming the offending field for bad
//! input, 401 for a write without the bearer token when one is configured, 403 for a form
//! from another site, a `Host` the DCI does not answer to or a write from a browser on
//! another site (`hosts`), 404 for an unknown id or name, 413 for a body over the limit, 415
//! for a body neither JSON nor (where taken) a form, 408 for a body that stalls
//! (`timed_body`), 503 when the database is unreachable.
//!
//! Parts: `error` ([`ApiError`] → HTTP), `auth` (bearer token on writes), `hosts` (the
//! `Host` allowlist and the `Origin` check of writes), `body` (the JSON body, form and
//! path extractors), `timed_body` (bodies that must keep coming), `form` (forms, the
//! same-site check, answer shapes),
//! `json` (documents → JSON), `nodes`, `plugins`, `queues` (with `queue_fields`), `schedules`, `tasks`
//! (with `search`, the parameters of `GET /tasks`, and `legacy_search`, Disbatch 4's
//! deprecated `POST /tasks/search`), `create` (`POST /tasks`),
//! `status` (info, monitoring, metrics), `counts` (task counts per queue without walking
//! the finished tasks), `stats` (`GET /stats`), `source` ([`DocumentSource`] for `POST /tasks` from
//! a collection), `ui` (embedded HTML/JS/CSS) and `openapi`.

mod after;
mod auth;
mod balance;
mod batches;
mod body;
mod counts;
mod create;
mod entries;
mod error;
mod form;
mod hosts;
mod insert;
mod json;
mod keys;
mod legacy_search;
mod lifecycle;
mod nodes;
mod openapi;
mod plugins;
mod queue_fields;
mod queues;
mod retry;
mod schedules;
mod search;
mod source;
mod stats;
mod status;
mod tasks;
mod timed_body;
mod ui;
mod watch;
mod web_root;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use tower_http::cors::{AllowOrigin, CorsLayer};

use crate::runner::Runner;
use crate::store::Store;

pub use self::error::ApiError;
pub use self::form::SHAPE_HEADER;
pub use self::hosts::AllowedHosts;
pub use self::openapi::OPENAPI_JSON;
pub use self::source::DocumentSource;
pub use self::tasks::{FULL_OUTPUT_CAP, MAX_FULL_LIMIT};
pub use self::timed_body::{BodyTimeout, TimedBody, MIN_BODY_RATE};
pub use self::watch::{WaitLimits, DEFAULT_MAX_EVENT_STREAM, DEFAULT_MAX_WAITED_IDS, DEFAULT_MAX_WAITERS};

/// Default largest request body: 16 MiB.
pub const DEFAULT_BODY_LIMIT: usize = 16 << 20;
/// A node whose heartbeat is younger than this is fresh (`GET /monitoring`), as in Disbatch 4.
pub const FRESH_NODE: Duration = Duration::from_secs(60);
/// Largest `limit` of `GET /tasks`.
pub const MAX_TASK_LIMIT: u64 = 10_000;

/// What the handlers share.
#[derive(Clone)]
pub struct ApiState {
    /// The store.
    pub store: Arc<dyn Store>,
    /// The allowed plugin names (the config's `plugins`).
    pub plugins: Vec<String>,
    /// When set, every write (any method but GET/HEAD/OPTIONS) needs
    /// `Authorization: Bearer <token>`.
    pub api_token: Option<String>,
    /// Documents of other collections, for `POST /tasks` with `collection` + `filter`;
    /// `None` refuses that form with 400.
    pub documents: Option<Arc<dyn DocumentSource>>,
    /// The database name shown by `GET /info`.
    pub database: Option<String>,
    /// Whether `GET /monitoring` checks the nodes (the config's `monitoring`).
    pub monitoring: bool,
    /// The config's QueueBalance settings (`balance`), shown by `GET /balance` and
    /// checked by `GET /monitoring`.
    pub balance: crate::config::Balance,
    /// Largest request body in bytes.
    pub body_limit: usize,
    /// Origins allowed by CORS, and to write from a browser on another site; empty (the
    /// default) sends no CORS headers at all.
    pub cors_origins: Vec<String>,
    /// The `Host` names answered besides IP literals and `localhost` (the `hosts` check).
    pub allowed_hosts: AllowedHosts,
    /// Follows task changes for the waiters of `GET /tasks/wait` and `/tasks/{id}/events`.
    pub(crate) watch: Arc<watch::TaskWatch>,
    /// Caps on those waiters.
    pub wait_limits: WaitLimits,
    /// Compiles uploaded components to check them (`POST /plugins`); `None` refuses
    /// uploads with 503.
    pub checker: Option<Runner>,
    /// Taken while an upload is read and checked: one at a time.
    pub(crate) upload_turn: Arc<tokio::sync::Semaphore>,
    /// Task counts per queue: active ones live, ended ones from a snapshot (`counts`).
    pub(crate) counts: Arc<counts::CountsCache>,
    /// Directory of web documents served at their paths (the config's `web_root`).
    pub web_root: Option<std::path::PathBuf>,
}

impl ApiState {
    /// A state with the defaults: no token, no document source, monitoring on,
    /// [`DEFAULT_BODY_LIMIT`], CORS off.
    pub fn new(store: Arc<dyn Store>, plugins: Vec<String>) -> ApiState {
        ApiState {
            store,
            plugins,
            api_token: None,
            documents: None,
            database: None,
            monitoring: true,
            balance: crate::config::Balance::default(),
            body_limit: DEFAULT_BODY_LIMIT,
            cors_origins: Vec::new(),
            allowed_hosts: AllowedHosts::new([]),
            watch: Arc::default(),
            wait_limits: WaitLimits::default(),
            checker: None,
            upload_turn: Arc::new(tokio::sync::Semaphore::new(1)),
            counts: Arc::default(),
            web_root: None,
        }
    }
}

impl std::fmt::Debug for ApiState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiState")
            .field("plugins", &self.plugins)
            .field("api_token", &self.api_token.as_ref().map(|_| "<set>"))
            .field("documents", &self.documents.is_some())
            .field("database", &self.database)
            .field("monitoring", &self.monitoring)
            .field("balance", &self.balance)
            .field("body_limit", &self.body_limit)
            .field("cors_origins", &self.cors_origins)
            .field("wait_limits", &self.wait_limits)
            .field("allowed_hosts", &self.allowed_hosts)
            .field("checker", &self.checker.is_some())
            .field("web_root", &self.web_root)
            .finish()
    }
}

/// Every route of the API as `(method, path)`, in axum's path syntax; the OpenAPI
/// document lists exactly these.
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "/balance"),
    ("POST", "/balance"),
    ("GET", "/batches/{id}"),
    ("GET", "/info"),
    ("GET", "/nodes"),
    ("GET", "/nodes/{node}"),
    ("POST", "/nodes/{node}"),
    ("GET", "/plugins"),
    ("POST", "/plugins"),
    ("GET", "/plugins/{name}"),
    ("DELETE", "/plugins/{name}"),
    ("GET", "/queues"),
    ("POST", "/queues"),
    ("GET", "/queues/{queue}"),
    ("POST", "/queues/{queue}"),
    ("DELETE", "/queues/{queue}"),
    ("GET", "/schedules"),
    ("POST", "/schedules"),
    ("GET", "/schedules/{name}"),
    ("POST", "/schedules/{name}"),
    ("DELETE", "/schedules/{name}"),
    ("GET", "/tasks"),
    ("POST", "/tasks"),
    ("POST", "/tasks/cancel"),
    ("POST", "/tasks/kill"),
    ("POST", "/tasks/search"),
    ("GET", "/tasks/{id}"),
    ("POST", "/tasks/{id}/cancel"),
    ("POST", "/tasks/{id}/kill"),
    ("POST", "/tasks/{id}/retry"),
    ("GET", "/tasks/wait"),
    ("GET", "/tasks/{id}/events"),
    ("GET", "/tasks/{id}/stdout"),
    ("GET", "/tasks/{id}/stderr"),
    ("GET", "/monitoring"),
    ("GET", "/metrics"),
    ("GET", "/stats"),
    ("GET", "/openapi.json"),
];

/// The DCI: API routes, the web UI and `/openapi.json`, with the bearer-token check on
/// writes, the body limit and (when origins are configured) CORS.
pub fn router(state: ApiState) -> Router {
    let body_limit = state.body_limit;
    let cors = cors_layer(&state.cors_origins);
    let shared = Arc::new(state);
    let api = Router::new()
        .route("/balance", get(balance::show).post(balance::update))
        .route("/batches/{id}", get(batches::show))
        .route("/info", get(status::info))
        .route("/nodes", get(nodes::list))
        .route("/nodes/{node}", get(nodes::one).post(nodes::set_maxthreads))
        .route("/plugins", get(plugins::list).post(plugins::upload))
        .route("/plugins/{name}", get(plugins::one).delete(plugins::delete))
        .route("/queues", get(queues::list).post(queues::create))
        .route(
            "/queues/{queue}",
            get(queues::one).post(queues::update).delete(queues::delete),
        )
        .route("/schedules", get(schedules::list).post(schedules::put))
        .route(
            "/schedules/{name}",
            get(schedules::one).post(schedules::update).delete(schedules::delete),
        )
        .route("/tasks", get(tasks::search).post(create::create))
        .route("/tasks/cancel", post(lifecycle::cancel_queue))
        .route("/tasks/kill", post(lifecycle::kill_queue))
        .route("/tasks/search", post(legacy_search::search))
        .route("/tasks/wait", get(watch::wait))
        .route("/tasks/{id}", get(tasks::one))
        .route("/tasks/{id}/cancel", post(lifecycle::cancel))
        .route("/tasks/{id}/kill", post(lifecycle::kill))
        .route("/tasks/{id}/retry", post(retry::retry))
        .route("/tasks/{id}/events", get(watch::events))
        .route("/tasks/{id}/stdout", get(tasks::stdout))
        .route("/tasks/{id}/stderr", get(tasks::stderr))
        .route("/monitoring", get(status::monitoring))
        .route("/metrics", get(status::metrics))
        .route("/stats", get(stats::series))
        .route("/openapi.json", get(openapi::document))
        .merge(ui::routes())
        .fallback(web_root::fallback)
        .method_not_allowed_fallback(error::method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            shared.clone(),
            auth::require_token,
        ))
        .layer(axum::middleware::from_fn_with_state(
            shared.clone(),
            hosts::check_host_and_origin,
        ))
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(shared);
    match cors {
        Some(layer) => api.layer(layer),
        None => api,
    }
}

fn cors_layer(origins: &[String]) -> Option<CorsLayer> {
    if origins.is_empty() {
        return None;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(origins.iter().filter_map(|o| o.parse().ok()))
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods(tower_http::cors::Any)
            .allow_headers(tower_http::cors::Any),
    )
}

/// The shared state as handlers see it.
type Shared = Arc<ApiState>;

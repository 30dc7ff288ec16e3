//! The integration tests, one binary: each module is one file of tests/ (its name the
//! file's), and `common` is what they share (servers, DENs, plugins, the web process).
//! Run one file's tests with `scripts/test --test suite -- <module>::`.

mod common;

#[path = "api.rs"]
mod api;
#[path = "api_actions.rs"]
mod api_actions;
#[path = "api_batches.rs"]
mod api_batches;
#[path = "api_contract.rs"]
mod api_contract;
#[path = "api_create.rs"]
mod api_create;
#[path = "api_dag.rs"]
mod api_dag;
#[path = "api_follow.rs"]
mod api_follow;
#[path = "api_lifecycle.rs"]
mod api_lifecycle;
#[path = "api_perl_cli.rs"]
mod api_perl_cli;
#[path = "api_plugins.rs"]
mod api_plugins;
#[path = "api_props.rs"]
mod api_props;
#[path = "api_reads.rs"]
mod api_reads;
#[path = "api_stats.rs"]
mod api_stats;
#[path = "api_wait.rs"]
mod api_wait;
#[path = "api_waiters.rs"]
mod api_waiters;
#[path = "balance.rs"]
mod balance;
#[path = "browser.rs"]
mod browser;
#[path = "chaos.rs"]
mod chaos;
#[path = "chaos_dag.rs"]
mod chaos_dag;
#[path = "cli.rs"]
mod cli;
#[path = "cli_users.rs"]
mod cli_users;
#[path = "config.rs"]
mod config;
#[path = "den.rs"]
mod den;
#[path = "den_process.rs"]
mod den_process;
#[path = "den_results.rs"]
mod den_results;
#[path = "dev.rs"]
mod dev;
#[path = "disbatch4.rs"]
mod disbatch4;
#[path = "disbatch4_takeover.rs"]
mod disbatch4_takeover;
#[path = "embedded_process.rs"]
mod embedded_process;
#[path = "faults.rs"]
mod faults;
#[path = "hostile.rs"]
mod hostile;
#[path = "hostile_api.rs"]
mod hostile_api;
#[path = "hostile_compile.rs"]
mod hostile_compile;
#[path = "hostile_dci.rs"]
mod hostile_dci;
#[path = "hostile_grants.rs"]
mod hostile_grants;
#[path = "hostile_limits.rs"]
mod hostile_limits;
#[path = "hostile_runner.rs"]
mod hostile_runner;
#[path = "hostile_sandbox.rs"]
mod hostile_sandbox;
#[path = "leader.rs"]
mod leader;
#[path = "net_faults.rs"]
mod net_faults;
#[path = "perl_documents.rs"]
mod perl_documents;
#[path = "plugin_store.rs"]
mod plugin_store;
#[path = "plugins_py_js.rs"]
mod plugins_py_js;
#[path = "properties.rs"]
mod properties;
#[path = "rate_dens.rs"]
mod rate_dens;
#[path = "retention.rs"]
mod retention;
#[path = "runner.rs"]
mod runner;
#[path = "runner_cli.rs"]
mod runner_cli;
#[path = "sandbox_http.rs"]
mod sandbox_http;
#[path = "sandbox_http_limits.rs"]
mod sandbox_http_limits;
#[path = "scaffold.rs"]
mod scaffold;
#[path = "schedules.rs"]
mod schedules;
#[path = "store_mongo.rs"]
mod store_mongo;
#[path = "store_mongo_ahead.rs"]
mod store_mongo_ahead;
#[path = "store_mongo_counts.rs"]
mod store_mongo_counts;
#[path = "store_mongo_groups.rs"]
mod store_mongo_groups;
#[path = "store_mongo_starts.rs"]
mod store_mongo_starts;
#[path = "store_shared.rs"]
mod store_shared;
#[path = "submit.rs"]
mod submit;

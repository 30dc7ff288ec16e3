//! The task state machine, written once above the [`Store`](crate::store::Store) trait.
//!
//! Every rule that decides a task's status, a slot's availability, a node name, the
//! leader or whether an action is allowed lives here; each function takes the store as an
//! argument and applies its decision through the store's fenced writes
//! (`store::change`). The stores translate those writes into MongoDB updates or
//! SQL and decide nothing themselves, so both behave alike by construction, and the shared
//! store suite (`tests/store_shared/`) checks the mechanics each one supplies.
//!
//! - [`machine`]: the status sets and the constructors of each transition's change.
//! - [`run`]: claim, start, finish or rerun, progress, requeue at shutdown.
//! - [`retry`]: retries after a failure, retry by hand, resubmission, reruns.
//! - [`recovery`]: orphaned tasks of stale nodes and the slots they held.
//! - [`slots`]: the in-use and free rules, the renew decision, the fair-share rotation.
//! - [`rate`]: queue rate limits: grants, each row at most once per window.
//! - [`nodes`]: node names held by one live process, `maxthreads`.
//! - [`leader`]: the leader lease.
//! - [`batches`]: batch documents (the first size given wins).
//! - [`deps`]: `after` dependencies: waiting, release, cancellation.
//! - [`keys`]: unique task keys and resubmission.
//! - [`schedules`]: periodic tasks: which occurrences are due, created exactly once.
//! - [`retention`]: which ended tasks are deleted, and when.
pub mod batches;
pub mod deps;
pub mod files;
pub mod keys;
pub mod leader;
pub mod machine;
pub mod nodes;
pub mod rate;
pub mod recovery;
pub mod retention;
pub mod retry;
pub mod run;
pub mod schedules;
pub mod slots;

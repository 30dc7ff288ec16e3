//! Connections to the store's file: WAL, `synchronous=NORMAL`, checkpoints left to the
//! writer thread, reads through `mmap`, and a busy handler that waits in short steps for
//! another connection's write lock.

use std::path::Path;
use std::time::Duration;

use rusqlite::Connection;

use super::records::db_err;
use crate::store::StoreResult;

/// How long a connection waits for another's write lock before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// Bytes of the file each connection reads through a memory mapping.
const MMAP_SIZE: i64 = 1 << 30;

/// Pages in the log from which a commit on a pooled connection checkpoints.
const POOLED_CHECKPOINT: i64 = 10_000;

/// Prepared statements each connection keeps: enough for every statement of a task's
/// claim, start and finish, and the writer's savepoints, with room to spare.
const STATEMENT_CACHE: usize = 64;

/// The first wait for another connection's lock; each next one doubles, up to
/// [`BUSY_SLEEP_MAX`]. A write transaction of a DEN holds the lock for tens of
/// microseconds, so SQLite's own schedule (1 ms, 2 ms, 5 ms, …) would mostly wait idle.
const BUSY_SLEEP_FIRST: Duration = Duration::from_micros(20);

/// The longest single wait for another connection's lock.
const BUSY_SLEEP_MAX: Duration = Duration::from_millis(2);

/// Opens the file at `path` with the store's settings.
pub(super) fn connect(path: &Path) -> StoreResult<Connection> {
    let open = db_err("open database");
    let conn = Connection::open(path).map_err(&open)?;
    conn.busy_handler(Some(busy_wait)).map_err(&open)?;
    conn.pragma_update(None, "journal_mode", "WAL").map_err(&open)?;
    conn.pragma_update(None, "synchronous", "NORMAL").map_err(&open)?;
    // The writer thread checkpoints at its own pace (see `writer`); the rare writes of
    // pooled connections checkpoint on commit only once the log is far past the writer's
    // threshold, as a safety net.
    conn.pragma_update(None, "wal_autocheckpoint", POOLED_CHECKPOINT)
        .map_err(&open)?;
    // Pages read through a shared mapping, not a read call each: every commit of
    // another connection empties a connection's page cache.
    conn.pragma_update(None, "mmap_size", MMAP_SIZE).map_err(&open)?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    super::change::register(&conn).map_err(&open)?;
    Ok(conn)
}

/// SQLite's busy handler of every connection: whether to try again after the `attempt`-th
/// failure to get another connection's lock: another process's, or the writer thread's
/// for the few writes of this process that do not go through it (see `docs/guarantees.md`). Sleeps [`BUSY_SLEEP_FIRST`], doubling
/// up to [`BUSY_SLEEP_MAX`], and gives up once the sleeps add up to [`BUSY_TIMEOUT`].
fn busy_wait(attempt: i32) -> bool {
    let attempt = u32::try_from(attempt).unwrap_or(0);
    if slept_before(attempt) >= BUSY_TIMEOUT {
        return false;
    }
    std::thread::sleep(busy_sleep(attempt));
    true
}

/// The sleep after the `attempt`-th failure (0-based).
fn busy_sleep(attempt: u32) -> Duration {
    BUSY_SLEEP_FIRST
        .saturating_mul(1 << attempt.min(16))
        .min(BUSY_SLEEP_MAX)
}

/// The sleeps before the `attempt`-th, added up: doubling ones, then ones of
/// [`BUSY_SLEEP_MAX`].
fn slept_before(attempt: u32) -> Duration {
    let doubling = (0..attempt).take_while(|&a| busy_sleep(a) < BUSY_SLEEP_MAX).count() as u32;
    (0..doubling).map(busy_sleep).sum::<Duration>() + BUSY_SLEEP_MAX.saturating_mul(attempt - doubling)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_waits_start_short_and_end_after_the_timeout() {
        assert_eq!(busy_sleep(0), Duration::from_micros(20));
        assert_eq!(busy_sleep(1), Duration::from_micros(40));
        assert_eq!(busy_sleep(7), BUSY_SLEEP_MAX);
        assert_eq!(busy_sleep(1000), BUSY_SLEEP_MAX);
        assert_eq!(slept_before(0), Duration::ZERO);
        assert_eq!(slept_before(2), Duration::from_micros(60));
        // Gives up after 30 s of sleeps, not before.
        let last = (0..100_000).find(|&a| slept_before(a) >= BUSY_TIMEOUT).unwrap();
        assert!(slept_before(last - 1) < BUSY_TIMEOUT);
        assert!(slept_before(last) < BUSY_TIMEOUT + BUSY_SLEEP_MAX);
    }
}

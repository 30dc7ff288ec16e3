//! Queue slot leases in the embedded store: `slots(queue, n, holder, expires)` with the
//! asks of [`Store::want_slot`](crate::store::Store::want_slot) (`want`, `want_until`) and the
//! reservations they leave (`reserved`, `reserved_until`), by the same rules as MongoDB's
//! `slots` collection, each operation one transaction.

use std::time::Duration;

use bson::DateTime;
use rusqlite::{params, Connection, OptionalExtension};

use super::rows::{add_columns, db_err, lease_end, queue_from};
use super::{queue_doc, SqliteStore};
use crate::model::{status, Queue};
use crate::store::{fair_share_donor, Slot, SlotRenewal, StoreResult};

/// Columns added to `slots` after its first release.
const ADDED_COLUMNS: &[(&str, &str)] = &[
    ("want", "TEXT"),
    ("want_until", "INTEGER"),
    ("reserved", "TEXT"),
    ("reserved_until", "INTEGER"),
    ("taken", "TEXT"),
];

/// Adds the columns a database file created by an earlier release lacks.
pub(super) fn migrate(conn: &Connection) -> StoreResult<()> {
    add_columns(conn, "slots", ADDED_COLUMNS)
}

impl SqliteStore {
    /// [`Store::acquire_slot`](crate::store::Store::acquire_slot): refuses while a slot at
    /// or above the queue's limit is held and unexpired, else takes the lowest free slot
    /// below it. The limit is read in the same transaction (not taken from `queue`, which
    /// may be older), so a lowered `threads` or `maxthreads` holds at once.
    pub(super) async fn take_slot(&self, queue: &Queue, node: &str, lease: Duration) -> StoreResult<Option<Slot>> {
        if queue.limit() <= 0 {
            return Ok(None);
        }
        let queue_id = queue.id;
        let node = node.to_string();
        self.write_quiet("acquire slot", move |tx| {
            let err = db_err("acquire slot");
            let q = queue_id.to_hex();
            let threads = stored_limit(tx, &q)?;
            if threads <= 0 {
                return Ok(None);
            }
            let now = DateTime::now();
            let millis = now.timestamp_millis();
            let take = bson::oid::ObjectId::new();
            let mut insert = tx
                .prepare_cached("INSERT OR IGNORE INTO slots (queue, n, holder, expires) VALUES (?1, ?2, NULL, 0)")
                .map_err(&err)?;
            for n in 0..threads {
                insert.execute(params![q, n]).map_err(&err)?;
            }
            if used_from(tx, &q, threads)? > 0 {
                return Ok(None);
            }
            let n: Option<i64> = tx
                .query_row(
                    "UPDATE slots SET holder = ?1, expires = ?2, taken = ?8, reserved = NULL, want = NULL,
                         want_until = NULL
                     WHERE queue = ?3 AND n = (SELECT n FROM slots
                         WHERE queue = ?3 AND n < ?4
                           AND ((holder IS NULL
                                 AND (reserved IS NULL OR reserved = ?1 OR reserved_until < ?5))
                                OR (holder IS NOT NULL AND expires < ?5 AND NOT EXISTS (SELECT 1 FROM tasks
                                    WHERE tasks.queue = ?3 AND tasks.node = slots.holder
                                      AND tasks.status IN (?6, ?7))))
                         ORDER BY holder IS NOT NULL, n LIMIT 1)
                     RETURNING n",
                    params![
                        node,
                        lease_end(now, lease),
                        q,
                        threads,
                        millis,
                        status::CLAIMED,
                        status::RUNNING,
                        take.to_hex()
                    ],
                    |r| r.get(0),
                )
                .optional()
                .map_err(&err)?;
            Ok(n.map(|n| Slot {
                queue: queue_id,
                n,
                taken: take,
            }))
        })
        .await
    }

    /// [`Store::release_slot`](crate::store::Store::release_slot), fenced on the holder.
    pub(super) async fn give_back_slot(&self, slot: &Slot, node: &str) -> StoreResult<()> {
        let (q, n, node, taken) = (slot.queue.to_hex(), slot.n, node.to_string(), slot.taken.to_hex());
        // On the writer thread, so that it never waits behind it for the write lock.
        self.writer
            .write("release slot", move |tx| {
                tx.execute(
                    "UPDATE slots SET holder = NULL, want = NULL, want_until = NULL
                 WHERE queue = ?1 AND n = ?2 AND holder = ?3 AND taken = ?4",
                    params![q, n, node, taken],
                )
                .map_err(db_err("release slot"))?;
                Ok(())
            })
            .await
    }

    /// [`Store::renew_slot`](crate::store::Store::renew_slot): renews the lease when `node`
    /// still holds the slot and nobody asked for it; gives it up to an asker.
    pub(super) async fn renew_one_slot(&self, slot: &Slot, node: &str, lease: Duration) -> StoreResult<SlotRenewal> {
        let (slot, node) = (slot.clone(), node.to_string());
        self.write_liveness("renew slot lease", move |tx| renew_in(tx, &slot, &node, lease))
            .await
    }

    /// [`Store::want_slot`](crate::store::Store::want_slot), by the rules of MongoDB's
    /// (not while over the limit; one live ask per node and queue, moved to the donor's
    /// next slot at each ask).
    pub(super) async fn ask_for_slot(&self, queue: &Queue, node: &str, ask: Duration) -> StoreResult<Option<String>> {
        let threads = queue.limit();
        if threads <= 0 {
            return Ok(None);
        }
        let (q, node) = (queue.id.to_hex(), node.to_string());
        self.write_quiet("ask for a slot", move |tx| {
            let err = db_err("ask for a slot");
            let now = DateTime::now();
            let millis = now.timestamp_millis();
            let mut stmt = tx
                .prepare_cached(
                    "SELECT n, holder, want IS NOT NULL AND want <> ?3 AND want_until >= ?2, want IS ?3
                     FROM slots WHERE queue = ?1 AND holder IS NOT NULL AND expires > ?2 ORDER BY n",
                )
                .map_err(&err)?;
            let live: Vec<(i64, String, bool, bool)> = stmt
                .query_map(params![q, millis, node], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
                })
                .map_err(&err)?
                .collect::<Result<_, _>>()
                .map_err(&err)?;
            if live.iter().any(|(n, ..)| *n >= threads) {
                return Ok(None);
            }
            let Some(most) = fair_share_donor(live.iter().map(|(_, h, ..)| h.as_str()), &node) else {
                return Ok(None);
            };
            let theirs: Vec<(i64, bool)> = live
                .iter()
                .filter(|(_, h, others, _)| *h == most && !others)
                .map(|(n, _, _, mine)| (*n, *mine))
                .collect();
            if theirs.is_empty() {
                return Ok(None);
            }
            let last = theirs.iter().position(|(_, mine)| *mine);
            let (n, _) = theirs[last.map_or(0, |i| (i + 1) % theirs.len())];
            tx.execute(
                "UPDATE slots SET want = NULL, want_until = NULL WHERE queue = ?1 AND want = ?2 AND n <> ?3",
                params![q, node, n],
            )
            .map_err(&err)?;
            let asked = tx
                .execute(
                    "UPDATE slots SET want = ?1, want_until = ?2 WHERE queue = ?3 AND n = ?4 AND holder = ?5",
                    params![node, lease_end(now, ask), q, n, most],
                )
                .map_err(&err)?;
            Ok((asked == 1).then_some(most))
        })
        .await
    }
}

/// The limit of the queue `q` (hex id) as stored: 0 when it is gone or cannot be read.
fn stored_limit(conn: &Connection, q: &str) -> StoreResult<i64> {
    let bytes: Option<Vec<u8>> = conn
        .query_row("SELECT doc FROM queues WHERE id = ?1", params![q], |r| r.get(0))
        .optional()
        .map_err(db_err("read the queue's limit"))?;
    Ok(bytes
        .and_then(|b| queue_doc("queues", q, &b).ok())
        .and_then(|d| queue_from(&d).ok())
        .map_or(0, |(queue, _)| queue.limit()))
}

/// Slots of the queue `q` (hex id) in use: held and unexpired, or expired while their
/// holder still has a claimed or running task of the queue (such a slot is freed only
/// with the recovery of that task).
pub(super) fn occupied(conn: &Connection, q: &str) -> StoreResult<i64> {
    used_from(conn, q, 0)
}

/// Slots of the queue `q` numbered `from` or above in use (see [`occupied`]).
fn used_from(conn: &Connection, q: &str, from: i64) -> StoreResult<i64> {
    conn.query_row(
        "SELECT COUNT(*) FROM slots WHERE queue = ?1 AND n >= ?2 AND holder IS NOT NULL
           AND (expires > ?3 OR EXISTS (SELECT 1 FROM tasks
                WHERE tasks.queue = ?1 AND tasks.node = slots.holder AND tasks.status IN (?4, ?5)))",
        params![
            q,
            from,
            DateTime::now().timestamp_millis(),
            status::CLAIMED,
            status::RUNNING
        ],
        |r| r.get(0),
    )
    .map_err(db_err("count the queue's slots in use"))
}

/// [`Store::renew_slot`](crate::store::Store::renew_slot) in `tx`.
pub(super) fn renew_in(tx: &Connection, slot: &Slot, node: &str, lease: Duration) -> StoreResult<SlotRenewal> {
    let (q, n, taken) = (slot.queue.to_hex(), slot.n, slot.taken.to_hex());
    let err = db_err("renew slot lease");
    let now = DateTime::now();
    let renewed = tx
        .prepare_cached(
            "UPDATE slots SET expires = ?1 WHERE queue = ?2 AND n = ?3 AND holder = ?4 AND taken = ?6
               AND expires > ?5 AND (want IS NULL OR want_until < ?5)",
        )
        .and_then(|mut s| {
            s.execute(params![
                lease_end(now, lease),
                q,
                n,
                node,
                now.timestamp_millis(),
                taken
            ])
        })
        .map_err(&err)?;
    if renewed == 1 {
        return Ok(SlotRenewal::Held);
    }
    // Asked for: given up to the asker. An expired lease nobody asked for is lost but
    // stays with its holder, free only once the holder has no claimed or running task in
    // the queue (a slot is freed only with or after the recovery of its tasks).
    let to: Option<String> = tx
        .query_row(
            "UPDATE slots SET holder = NULL, reserved = want, reserved_until = want_until,
                 want = NULL, want_until = NULL
             WHERE queue = ?1 AND n = ?2 AND holder = ?3 AND taken = ?4 AND want IS NOT NULL
             RETURNING reserved",
            params![q, n, node, taken],
            |r| r.get::<_, Option<String>>(0),
        )
        .optional()
        .map_err(&err)?
        .flatten();
    Ok(match to {
        Some(to) => SlotRenewal::Yielded { to },
        None => SlotRenewal::Lost,
    })
}

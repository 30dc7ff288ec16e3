//! Queue slot leases in the embedded store: `slots(queue, n, holder, expires, taken, want,
//! want_until, reserved, reserved_until)`, read as [`SlotRow`]s and written with one
//! conditional UPDATE per [`SlotChange`] under its [`SlotFence`], as MongoDB's `slots`
//! collection. The rules are in `lifecycle::slots`.

use async_trait::async_trait;
use bson::oid::ObjectId;
use bson::DateTime;
use rusqlite::types::Value;
use rusqlite::{params, params_from_iter, Connection, OptionalExtension, Row, Transaction};
use std::time::Duration;

use super::records::{add_columns, db_err, lease_end};
use super::{claims, SqliteStore, Touched};
use crate::model::{status, Queue, Task};
use crate::store::{
    BusyNode, BusyOf, Holder, Lease, Mark, RenewRule, Slot, SlotChange, SlotFence, SlotRenewal, SlotRow, SlotStore,
    StoreResult,
};

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

/// The columns of a [`SlotRow`], in [`row_from`]'s order.
const ROW: &str = "n, holder, expires, want, want_until, reserved, reserved_until, taken";

/// A row of [`ROW`] as a [`SlotRow`].
fn row_from(r: &Row<'_>) -> rusqlite::Result<SlotRow> {
    let date = |i| r.get::<_, Option<i64>>(i).map(|t| t.map(DateTime::from_millis));
    Ok(SlotRow {
        n: r.get(0)?,
        holder: r.get(1)?,
        expires: DateTime::from_millis(r.get::<_, Option<i64>>(2)?.unwrap_or(0)),
        want: r.get(3)?,
        want_until: date(4)?,
        reserved: r.get(5)?,
        reserved_until: date(6)?,
        taken: r
            .get::<_, Option<String>>(7)?
            .and_then(|t| bson::oid::ObjectId::parse_str(t).ok()),
    })
}

/// The row of `slot`, if any.
fn row_in(conn: &Connection, slot: &Slot) -> StoreResult<Option<SlotRow>> {
    conn.prepare_cached(&format!("SELECT {ROW} FROM slots WHERE queue = ?1 AND n = ?2"))
        .and_then(|mut s| s.query_row(params![slot.queue.to_hex(), slot.n], row_from).optional())
        .map_err(db_err("read a slot"))
}

/// The condition on one mark's columns (`col`, `{col}_until`), adding its values.
fn mark_sql(col: &str, mark: &Mark, values: &mut Vec<Value>) -> Option<String> {
    match mark {
        Mark::Any => None,
        Mark::By(node) => {
            values.push(Value::Text(node.clone()));
            Some(format!("{col} = ?{}", values.len()))
        }
        Mark::OpenTo { node, at } => {
            values.push(Value::Integer(at.timestamp_millis()));
            let mut open = format!("({col} IS NULL OR {col}_until < ?{}", values.len());
            if let Some(node) = node {
                values.push(Value::Text(node.clone()));
                open.push_str(&format!(" OR {col} = ?{}", values.len()));
            }
            open.push(')');
            Some(open)
        }
    }
}

/// The WHERE clause matching the row of `slot` under `fence`, with its values.
fn fence_sql(slot: &Slot, fence: &SlotFence) -> (String, Vec<Value>) {
    let mut values = vec![Value::Text(slot.queue.to_hex()), Value::Integer(slot.n)];
    let mut terms = vec!["queue = ?1".to_string(), "n = ?2".to_string()];
    match &fence.holder {
        Holder::Any => {}
        Holder::Unheld => terms.push("holder IS NULL".to_string()),
        Holder::By(node) => {
            values.push(Value::Text(node.clone()));
            terms.push(format!("holder = ?{}", values.len()));
        }
    }
    let (op, at) = match fence.lease {
        Lease::Any => ("", None),
        Lease::LiveAt(t) => (">", Some(t)),
        Lease::EndedAt(t) => ("<", Some(t)),
    };
    if let Some(t) = at {
        values.push(Value::Integer(t.timestamp_millis()));
        terms.push(format!("expires {op} ?{}", values.len()));
    }
    terms.extend(mark_sql("want", &fence.want, &mut values));
    terms.extend(mark_sql("reserved", &fence.reserved, &mut values));
    if let Some(taken) = fence.taken {
        values.push(Value::Text(taken.to_hex()));
        terms.push(format!("taken = ?{}", values.len()));
    }
    (terms.join(" AND "), values)
}

/// The SET clause making `change`, with its values (numbered from `first`).
fn change_sql(change: &SlotChange, first: usize) -> (String, Vec<Value>) {
    let text = |s: &String| Value::Text(s.clone());
    let date = |t: &DateTime| Value::Integer(t.timestamp_millis());
    let (set, values): (&str, Vec<Value>) = match change {
        SlotChange::Take { holder, until, taken } => (
            "holder = ?A, expires = ?B, taken = ?C, reserved = NULL, want = NULL, want_until = NULL",
            vec![text(holder), date(until), Value::Text(taken.to_hex())],
        ),
        SlotChange::Renew { until } => ("expires = ?A", vec![date(until)]),
        SlotChange::Release => ("holder = NULL, want = NULL, want_until = NULL", vec![]),
        SlotChange::Yield { to, until } => (
            "holder = NULL, reserved = ?A, reserved_until = ?B, want = NULL, want_until = NULL",
            vec![text(to), date(until)],
        ),
        SlotChange::Ask { by, until } => ("want = ?A, want_until = ?B", vec![text(by), date(until)]),
        SlotChange::Unask => ("want = NULL, want_until = NULL", vec![]),
    };
    let set = set
        .replace("?A", &format!("?{first}"))
        .replace("?B", &format!("?{}", first + 1))
        .replace("?C", &format!("?{}", first + 2));
    (set, values)
}

/// [`SlotStore::change_slot`] in `tx`.
pub(super) fn change_in(tx: &Connection, slot: &Slot, fence: &SlotFence, change: &SlotChange) -> StoreResult<bool> {
    let (filter, mut values) = fence_sql(slot, fence);
    let (set, more) = change_sql(change, values.len() + 1);
    values.extend(more);
    let changed = tx
        .prepare_cached(&format!("UPDATE slots SET {set} WHERE {filter}"))
        .and_then(|mut s| s.execute(params_from_iter(values)))
        .map_err(db_err("change a slot"))?;
    Ok(changed == 1)
}

/// [`Store::renew_and_claim`](crate::store::Store::renew_and_claim) in `tx`: the slot's
/// row read, the step `rule` decides written, and the queue's next task claimed and
/// started when that step's outcome is Held. None when the step's write did not apply.
#[allow(clippy::type_complexity)]
pub(super) fn renew_and_claim_in(
    tx: &Transaction<'_>,
    slot: &Slot,
    queue: &Queue,
    node: &str,
    lease: Duration,
    rule: RenewRule,
) -> StoreResult<Option<(SlotRenewal, StoreResult<Option<Task>>)>> {
    let now = DateTime::now();
    let row = row_in(tx, slot)?.unwrap_or_else(|| SlotRow::unheld(slot.n));
    let step = rule(&row, slot, node, now, DateTime::from_millis(lease_end(now, lease)));
    if let Some((fence, change)) = &step.write {
        if !change_in(tx, slot, fence, change)? {
            return Ok(None);
        }
    }
    let claimed = match step.renewal {
        SlotRenewal::Held => claims::claim_in(tx, queue, node, status::RUNNING)?,
        _ => Ok(None),
    };
    Ok(Some((step.renewal, claimed)))
}

impl SqliteStore {
    /// [`Store::renew_and_claim`](crate::store::Store::renew_and_claim) ([`renew_and_claim_in`]),
    /// one write.
    pub(super) async fn renew_and_claim(
        &self,
        slot: &Slot,
        queue: &Queue,
        node: &str,
        lease: Duration,
        rule: RenewRule,
    ) -> StoreResult<Option<(SlotRenewal, Option<Task>)>> {
        let (slot, queue, node) = (slot.clone(), queue.clone(), node.to_string());
        let done = self
            .write_touching(
                "renew slot lease and claim",
                move |tx| renew_and_claim_in(tx, &slot, &queue, &node, lease, rule),
                |done| {
                    done.as_ref()
                        .map_or(Touched::Nothing, |(_, c)| claims::claimed_touched(c))
                },
            )
            .await?;
        done.map(|(renewal, claimed)| Ok((renewal, claimed?))).transpose()
    }
}

/// Renews the leases of every slot `node` holds, but not one that expired: it may have
/// been counted free since.
pub(super) fn renew_slots(tx: &Transaction<'_>, node: &str, until: i64) -> StoreResult<()> {
    tx.execute(
        "UPDATE slots SET expires = ?1 WHERE holder = ?2 AND expires > ?3",
        params![until, node, DateTime::now().timestamp_millis()],
    )
    .map_err(db_err("renew slot leases"))?;
    Ok(())
}

#[async_trait]
impl SlotStore for SqliteStore {
    async fn slots(&self, queue: ObjectId) -> StoreResult<Vec<SlotRow>> {
        self.with(move |conn| {
            let err = db_err("read the queue's slots");
            let mut stmt = conn
                .prepare_cached(&format!("SELECT {ROW} FROM slots WHERE queue = ?1 ORDER BY n"))
                .map_err(&err)?;
            let rows = stmt
                .query_map(params![queue.to_hex()], row_from)
                .map_err(&err)?
                .collect::<Result<_, _>>()
                .map_err(&err);
            rows
        })
        .await
    }

    async fn ensure_slots(&self, queue: ObjectId, threads: i64) -> StoreResult<()> {
        let known = self.with(move |conn| {
            conn.query_row(
                "SELECT COUNT(*) FROM slots WHERE queue = ?1 AND n < ?2",
                params![queue.to_hex(), threads],
                |r| r.get::<_, i64>(0),
            )
            .map_err(db_err("count the queue's slots"))
        });
        if known.await? >= threads {
            return Ok(());
        }
        self.write_quiet("create slots", move |tx| {
            let err = db_err("create slots");
            let mut insert = tx
                .prepare_cached("INSERT OR IGNORE INTO slots (queue, n, holder, expires) VALUES (?1, ?2, NULL, 0)")
                .map_err(&err)?;
            for n in 0..threads {
                insert.execute(params![queue.to_hex(), n]).map_err(&err)?;
            }
            Ok(())
        })
        .await
    }

    /// A renewal goes before the ordinary writes waiting (a lease kept alive); the others
    /// take their turn.
    async fn change_slot(&self, slot: &Slot, fence: &SlotFence, change: &SlotChange) -> StoreResult<bool> {
        let (s, f, c) = (slot.clone(), fence.clone(), change.clone());
        let write = move |tx: &rusqlite::Transaction<'_>| change_in(tx, &s, &f, &c);
        match change {
            SlotChange::Renew { .. } => self.write_liveness("renew slot lease", write).await,
            _ => self.write_quiet("change a slot", write).await,
        }
    }

    async fn slots_held_by(&self, holders: &[String]) -> StoreResult<Vec<(ObjectId, SlotRow)>> {
        if holders.is_empty() {
            return Ok(Vec::new());
        }
        let names: Vec<Value> = holders.iter().map(|h| Value::Text(h.clone())).collect();
        self.with(move |conn| {
            let err = db_err("read the slots of nodes");
            let marks = vec!["?"; names.len()].join(", ");
            let mut stmt = conn
                .prepare(&format!("SELECT {ROW}, queue FROM slots WHERE holder IN ({marks})"))
                .map_err(&err)?;
            let rows = stmt
                .query_map(params_from_iter(names), |r| {
                    Ok((r.get::<_, String>(ROW.split(',').count())?, row_from(r)?))
                })
                .map_err(&err)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(&err)?;
            Ok(rows
                .into_iter()
                .filter_map(|(q, row)| ObjectId::parse_str(q).ok().map(|q| (q, row)))
                .collect())
        })
        .await
    }

    /// No Disbatch 4 DEN shares an embedded database: [`BusyOf::Foreign`] is empty.
    async fn busy_nodes(&self, queue: Option<ObjectId>, of: BusyOf) -> StoreResult<Vec<BusyNode>> {
        if of == BusyOf::Foreign {
            return Ok(Vec::new());
        }
        self.with(move |conn| {
            let err = db_err("count the claimed and running tasks by node");
            let of_queue = if queue.is_some() { "AND queue = ?3" } else { "" };
            let mut stmt = conn
                .prepare_cached(&format!(
                    "SELECT node, COUNT(*) FROM tasks WHERE status IN (?1, ?2) AND node IS NOT NULL {of_queue}
                     GROUP BY node"
                ))
                .map_err(&err)?;
            let mut values = vec![
                Value::Integer(status::CLAIMED.into()),
                Value::Integer(status::RUNNING.into()),
            ];
            values.extend(queue.map(|q| Value::Text(q.to_hex())));
            let busy = stmt
                .query_map(params_from_iter(values), |r| {
                    Ok(BusyNode {
                        node: r.get(0)?,
                        tasks: r.get(1)?,
                        foreign: false,
                    })
                })
                .map_err(&err)?
                .collect::<Result<_, _>>()
                .map_err(&err);
            busy
        })
        .await
    }
}

//! Asks for a fair share of a queue's slots: a node that finds none free marks one slot of
//! the node holding the most ([`fair_share_donor`]), moving its ask along that node's slots
//! ([`ask_rotation`]); the holder gives the slot up at its next renewal
//! ([`super::renew_step`]).

use std::collections::BTreeMap;
use std::time::Duration;

use bson::DateTime;

use super::{foreign_running, lease_end, open_to};
use crate::model::Queue;
use crate::store::{Holder, Mark, Slot, SlotChange, SlotFence, SlotRow, Store, StoreResult};

/// The node a slot should be asked from ([`want_slot`]): of the holders of a queue's live
/// slots (one name per slot), the one holding the most, when that is at least two more
/// than `node` holds (so a slot moving never leaves the asker holding more than the giver,
/// and two nodes never pass a slot back and forth). Ties go to the first name in order.
pub fn fair_share_donor<'a>(holders: impl Iterator<Item = &'a str>, node: &str) -> Option<String> {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for h in holders {
        *counts.entry(h).or_default() += 1;
    }
    let mine = counts.remove(node).unwrap_or(0);
    let (most, held) = counts
        .into_iter()
        .fold(None, |best: Option<(&str, usize)>, (h, n)| match best {
            Some((_, m)) if m >= n => best,
            _ => Some((h, n)),
        })?;
    (held >= mine + 2).then(|| most.to_string())
}

/// The slot of `donor` that `node` asks for next among the `live` rows: the donor's slot
/// after the one `node` asked for last (in slot order, round), skipping those another node
/// asks for; None when every slot of the donor is asked for by others. Moving the ask at
/// each attempt keeps a slot busy with a long task from holding the asker up.
pub fn ask_rotation(live: &[SlotRow], donor: &str, node: &str, now: DateTime) -> Option<i64> {
    let mut theirs: Vec<(i64, bool)> = live
        .iter()
        .filter(|r| r.holder.as_deref() == Some(donor) && open_to(&r.want, r.want_until, Some(node), now))
        .map(|r| (r.n, r.want.as_deref() == Some(node)))
        .collect();
    if theirs.is_empty() {
        return None;
    }
    theirs.sort_unstable();
    let last = theirs.iter().position(|(_, mine)| *mine);
    Some(theirs[last.map_or(0, |i| (i + 1) % theirs.len())].0)
}

/// Asks for a fair share of `queue`'s slots when `node` found none free: marks, for
/// `ask`, one slot of the node holding the most of them ([`fair_share_donor`]), the next in
/// [`ask_rotation`]; one live ask per node and queue. Not while the queue is over its
/// limit (a slot given up then could not be taken). Its holder gives the slot up before its
/// next claim ([`renew_step`]) and only `node` may take it until the ask ends. Without this
/// a DEN that joins a busy queue late (or comes back from a pause) would wait for as long
/// as the others keep finding tasks. Answers the node asked, if any.
pub async fn want_slot(
    store: &(impl Store + ?Sized),
    queue: &Queue,
    node: &str,
    ask: Duration,
) -> StoreResult<Option<String>> {
    let threads = queue.limit() - foreign_running(store, queue.id).await?;
    if threads <= 0 {
        return Ok(None);
    }
    let now = DateTime::now();
    let rows = store.slots(queue.id).await?;
    let live: Vec<SlotRow> = rows
        .iter()
        .filter(|r| r.holder.is_some() && r.expires > now)
        .cloned()
        .collect();
    if live.iter().any(|r| r.n >= threads) {
        return Ok(None);
    }
    let Some(donor) = fair_share_donor(live.iter().filter_map(|r| r.holder.as_deref()), node) else {
        return Ok(None);
    };
    let Some(n) = ask_rotation(&live, &donor, node, now) else {
        return Ok(None);
    };
    let mine = SlotFence {
        want: Mark::By(node.to_string()),
        ..SlotFence::default()
    };
    for r in rows.iter().filter(|r| r.n != n && r.want.as_deref() == Some(node)) {
        let earlier = Slot::numbered(queue.id, r.n);
        store.change_slot(&earlier, &mine, &SlotChange::Unask).await?;
    }
    let fence = SlotFence {
        holder: Holder::By(donor.clone()),
        want: Mark::OpenTo {
            node: Some(node.to_string()),
            at: now,
        },
        ..SlotFence::default()
    };
    let change = SlotChange::Ask {
        by: node.to_string(),
        until: lease_end(now, ask),
    };
    let asked = store.change_slot(&Slot::numbered(queue.id, n), &fence, &change).await?;
    Ok(asked.then_some(donor))
}

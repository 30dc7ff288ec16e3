//! Which updates may join others ([`shape`]), the parts they join by ([`Shape`]), and the
//! aggregation expressions that give each task of an update of many its own conditions and
//! values.

use bson::{doc, Bson, Document};

use super::super::FencedUpdate;
use super::MOST_ONE;

/// An update that may join others, in parts.
#[derive(Debug, Clone)]
pub(in crate::store::mongo::bulk) struct Shape {
    /// Its task's `_id`.
    pub id: Bson,
    /// Its equalities with plain values on top-level fields: in an update of many, those
    /// alike for every task stay in the filter, the others become each task's own.
    pub conds: Document,
    /// Its other conditions (an operator, a dotted path), each on a field it writes: the
    /// same for every update joined.
    pub fixed: Document,
    /// A condition on the whole document beside the others (`{$and: [filter, {$expr: …}]}`,
    /// a deadline by the server's clock): each task's own.
    pub expr: Option<Bson>,
    /// The fields it sets, `mtime` among them.
    pub set: Document,
    /// The fields it unsets.
    pub unset: Vec<String>,
    /// The size of what it sets and of its conditions.
    pub bytes: usize,
}

impl Shape {
    /// Whether an update of shape `other` may go in one update with this one: the same
    /// conditions (but for their plain values) and the same fields written.
    pub fn joins(&self, other: &Shape) -> bool {
        self.conds.keys().eq(other.conds.keys())
            && self.fixed == other.fixed
            && self.expr.is_some() == other.expr.is_some()
            && self.set.keys().eq(other.set.keys())
            && self.unset == other.unset
    }

    /// Whether the update writes (sets or unsets) the top-level field of `path`.
    pub fn writes(&self, path: &str) -> bool {
        let field = path.split('.').next().unwrap_or(path);
        self.set.contains_key(field) || self.unset.iter().any(|u| u == field)
    }
}

fn plain(v: &Bson) -> bool {
    !matches!(v, Bson::Document(_) | Bson::Array(_))
}

fn top_level(k: &str) -> bool {
    !k.starts_with('$') && !k.contains('.')
}

/// `u` in parts, when it may join others: an update by its task's `_id` (its filter, or the
/// first clause of `{$and: [filter, {$expr: …}]}`), whose other conditions are equalities
/// with plain values on top-level fields or conditions on fields it writes, and which sets
/// top-level fields and `mtime` (and may unset top-level fields), with values and
/// conditions of at most [`MOST_ONE`] bytes.
pub(in crate::store::mongo::bulk) fn shape(u: &FencedUpdate) -> Option<Shape> {
    let FencedUpdate { filter, update } = u;
    let (base, expr) = match filter.get("$and") {
        None => (filter, None),
        Some(Bson::Array(clauses)) if filter.len() == 1 => match clauses.as_slice() {
            [Bson::Document(base), Bson::Document(e)] if e.len() == 1 => (base, Some(e.get("$expr")?.clone())),
            _ => return None,
        },
        Some(_) => return None,
    };
    let id = base.get("_id").filter(|id| plain(id))?;
    if update.keys().any(|k| k != "$set" && k != "$unset") {
        return None;
    }
    let set = update.get_document("$set").ok()?.clone();
    set.get("mtime")?;
    let unset: Vec<String> = match update.get("$unset") {
        None => Vec::new(),
        Some(Bson::Document(d)) => d.keys().cloned().collect(),
        Some(_) => return None,
    };
    if !set.keys().chain(&unset).all(|k| top_level(k)) {
        return None;
    }
    let bytes = bson::to_vec(&set).ok()?.len() + bson::to_vec(base).ok()?.len();
    let mut shape = Shape {
        id: id.clone(),
        conds: Document::new(),
        fixed: Document::new(),
        expr,
        set,
        unset,
        bytes,
    };
    for (k, v) in base.iter().filter(|(k, _)| *k != "_id") {
        if top_level(k) && plain(v) {
            shape.conds.insert(k, v.clone());
        } else if !k.starts_with('$') && shape.writes(k) {
            shape.fixed.insert(k, v.clone());
        } else {
            return None;
        }
    }
    if let Some(e) = &shape.expr {
        shape.bytes += bson::to_vec(&doc! { "e": e.clone() }).ok()?.len();
    }
    (shape.bytes <= MOST_ONE).then_some(shape)
}

/// The task `u` changes: the `_id` of its filter (or of the first clause of its `$and`).
pub(in crate::store::mongo::bulk) fn task_of(u: &FencedUpdate) -> Option<Bson> {
    match u.filter.get("$and") {
        Some(Bson::Array(clauses)) => match clauses.first() {
            Some(Bson::Document(base)) => base.get("_id").cloned(),
            _ => None,
        },
        _ => u.filter.get("_id").cloned(),
    }
}

/// `{$literal: v}`: `v` as a value, never read as a field path or an expression.
pub(super) fn literal(v: &Bson) -> Bson {
    Bson::Document(doc! { "$literal": v.clone() })
}

/// Whether the top-level field `k` holds `v`, as an expression: an equality of the query
/// language on a plain value (a missing field equals null; numbers of any type compare by
/// value).
pub(super) fn holds(k: &str, v: &Bson) -> Bson {
    Bson::Document(doc! { "$eq": [{ "$ifNull": [format!("${k}"), Bson::Null] }, literal(v)] })
}

/// An expression that is, for each task of `ids`, its own `value` (`default` for any other).
pub(super) fn by_task(ids: &[Bson], value: impl Fn(usize) -> Bson, default: Bson) -> Bson {
    let branches: Vec<Bson> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| Bson::Document(doc! { "case": { "$eq": ["$_id", literal(id)] }, "then": value(i) }))
        .collect();
    Bson::Document(doc! { "$switch": { "branches": branches, "default": default } })
}

//! The order in which a request's entries are inserted: each after those it waits for,
//! found by a depth-first walk that names a cycle when there is one.

use std::collections::BTreeSet;

use crate::api::ApiError;

/// The entries in an order where each comes after those it waits for, or the error naming
/// a cycle.
pub(super) fn parents_first(edges: &[BTreeSet<usize>]) -> Result<Vec<usize>, ApiError> {
    // 0 = not seen, 1 = on the current path, 2 = placed.
    let mut mark = vec![0u8; edges.len()];
    let mut order = Vec::with_capacity(edges.len());
    for start in 0..edges.len() {
        if mark[start] != 0 {
            continue;
        }
        // An explicit stack of (entry, its parents still to visit), so a long chain cannot
        // overflow the thread's stack.
        let mut stack: Vec<(usize, Vec<usize>)> = vec![(start, edges[start].iter().copied().collect())];
        mark[start] = 1;
        while let Some((node, rest)) = stack.last_mut() {
            let node = *node;
            match rest.pop() {
                Some(p) if mark[p] == 1 => {
                    let path: Vec<usize> = stack.iter().map(|(e, _)| *e).collect();
                    let from = path.iter().position(|e| *e == p).unwrap_or(0);
                    let cycle: Vec<String> = path[from..]
                        .iter()
                        .chain(std::iter::once(&p))
                        .map(|e| format!("tasks[{e}]"))
                        .collect();
                    return Err(ApiError::bad(format!(
                        "field \"tasks\" has a cycle of dependencies: {} (each waits for the next)",
                        cycle.join(" → ")
                    )));
                }
                Some(p) if mark[p] == 0 => {
                    mark[p] = 1;
                    stack.push((p, edges[p].iter().copied().collect()));
                }
                Some(_) => {}
                None => {
                    mark[node] = 2;
                    order.push(node);
                    stack.pop();
                }
            }
        }
    }
    Ok(order)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edges(list: &[&[usize]]) -> Vec<BTreeSet<usize>> {
        list.iter().map(|l| l.iter().copied().collect()).collect()
    }

    #[test]
    fn entries_are_ordered_parents_first() {
        let order = parents_first(&edges(&[&[1, 2], &[2], &[], &[0]])).unwrap();
        let at = |e| order.iter().position(|x| *x == e).unwrap();
        assert!(at(2) < at(1) && at(1) < at(0) && at(0) < at(3), "{order:?}");
    }

    #[test]
    fn a_cycle_is_named() {
        let e = parents_first(&edges(&[&[1], &[2], &[0]])).unwrap_err().to_string();
        assert!(
            e.contains("cycle") && e.contains("tasks[0] → tasks[1] → tasks[2] → tasks[0]"),
            "{e}"
        );
        let e = parents_first(&edges(&[&[0]])).unwrap_err().to_string();
        assert!(e.contains("tasks[0] → tasks[0]"), "{e}");
    }

    #[test]
    fn a_long_chain_does_not_overflow() {
        let chain: Vec<BTreeSet<usize>> = (0..200_000usize)
            .map(|i| if i == 0 { BTreeSet::new() } else { [i - 1].into() })
            .collect();
        let order = parents_first(&chain).unwrap();
        assert_eq!(order.first(), Some(&0));
    }
}

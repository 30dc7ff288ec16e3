//! Hostile components against the per-task limits: the memory budget is summed over every
//! memory of the task, and the per-task instance caps stop a hog without starving others.

use crate::common;

use std::path::Path;
use std::sync::Arc;

use disbatch::runner::{EngineOptions, Failure, Runner, Sandbox};

/// A component that instantiates `growers` core modules each holding `pages` 64 KiB pages,
/// then exports a `run` that returns ok(1).
fn component(growers: usize, pages: u32) -> Vec<u8> {
    let instances: String = (0..growers)
        .map(|i| format!("(core instance $g{i} (instantiate $grow))\n"))
        .collect();
    common::components::component_with(
        &format!("(core module $grow (memory {pages}))\n{instances}"),
        common::components::RETURNS_OK,
    )
}

fn runner(max_instances: u32) -> Runner {
    Runner::new(&EngineOptions {
        cache_dir: None,
        max_instances,
    })
    .unwrap()
}

fn sandbox(memory_mib: u64) -> Sandbox {
    Sandbox {
        memory: memory_mib << 20,
        ..Sandbox::default()
    }
}

#[test]
fn memory_limit_is_the_sum_over_all_memories() {
    let r = runner(2);
    // Three memories of 32 MiB: each fits 64 MiB alone, together they do not.
    let hog = r.load_bytes(&component(3, 512), Path::new("hog.wasm")).unwrap();
    let o = r.run(&hog, "{}", &sandbox(64), None);
    assert!(matches!(o.failure, Some(Failure::Memory { .. })), "{:?}", o.failure);
    // One of 32 MiB fits.
    let ok = r.load_bytes(&component(1, 512), Path::new("ok.wasm")).unwrap();
    let o = r.run(&ok, "{}", &sandbox(64), None);
    assert_eq!(o.failure, None);
    assert_eq!(o.status, 1);
}

#[test]
fn a_hog_of_core_instances_fails_while_others_run() {
    let r = Arc::new(runner(1));
    // A component needing more than the per-task cap is refused when it is loaded, with
    // the limit named, and never takes anything from the pool.
    let refused = r
        .load_bytes(&component(40, 0), Path::new("hog.wasm"))
        .unwrap_err()
        .to_string();
    assert!(refused.contains("maximum of 32"), "{refused}");
    let ok = Arc::new(r.load_bytes(&component(3, 0), Path::new("ok.wasm")).unwrap());
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (r, ok) = (r.clone(), ok.clone());
            std::thread::spawn(move || r.run(&ok, "{}", &sandbox(64), None))
        })
        .collect();
    for w in workers {
        let o = w.join().unwrap();
        assert_eq!(o.failure, None);
        assert_eq!(o.status, 1);
    }
}

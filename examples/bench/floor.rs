//! The sandbox's floor: bare wasmtime running a plugin on the engine settings the runner
//! uses ([`build_engine`]), with nothing of Disbatch's per-task path — an `InstancePre`,
//! a fresh `Store` with a default WASI preview-2 context per task, instantiate, call `run`.

use std::path::Path;

use disbatch::runner::{build_engine, EngineOptions};
use wasmtime::component::{Component, ComponentExportIndex, InstancePre, Linker, ResourceTable};
use wasmtime::{Engine, Store};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

/// A component of the `disbatch:plugin/plugin` world that imports nothing and whose `run`
/// returns `ok(1)` without reading its params: instantiation and one call, no guest work.
const TRIVIAL: &str = r#"
(component
  (core module $m
    (memory (export "memory") 1)
    (global $next (mut i32) (i32.const 1024))
    ;; cabi_realloc: a bump allocator (the host lowers `params` into it).
    (func (export "realloc") (param i32 i32 i32 i32) (result i32)
      (local $p i32)
      (local.set $p (i32.and (i32.add (global.get $next) (i32.sub (local.get 2) (i32.const 1)))
                             (i32.sub (i32.const 0) (local.get 2))))
      (global.set $next (i32.add (local.get $p) (local.get 3)))
      (if (i32.gt_u (global.get $next) (i32.mul (memory.size) (i32.const 65536)))
        (then (drop (memory.grow (i32.const 1)))))
      (local.get $p))
    ;; result<u32, string> at 16: discriminant 0 (ok), payload 1 at 20.
    (func (export "run") (param i32 i32) (result i32)
      (i32.store8 (i32.const 16) (i32.const 0))
      (i32.store (i32.const 20) (i32.const 1))
      (i32.const 16)))
  (core instance $i (instantiate $m))
  (func (export "run") (param "params" string) (result (result u32 (error string)))
    (canon lift (core func $i "run") (memory (core memory $i "memory"))
      (realloc (core func $i "realloc")))))
"#;

/// The trivial component's bytes.
pub(super) fn trivial_component() -> Vec<u8> {
    wat::parse_str(TRIVIAL).expect("the trivial component parses")
}

/// Per-task state: the WASI context and its resource table, nothing else.
struct State {
    wasi: WasiCtx,
    table: ResourceTable,
}

impl WasiView for State {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// One plugin ready to run on bare wasmtime.
pub(super) struct Floor {
    engine: Engine,
    pre: InstancePre<State>,
    run: ComponentExportIndex,
}

impl Floor {
    /// An engine built by the runner's own [`build_engine`] with a pool of `max_instances`
    /// (no epoch ticker: nothing here runs long enough to be interrupted), WASI preview 2
    /// (sync, as the runner links it) and no-op `disbatch:plugin/host` functions, and
    /// `bytes` compiled and pre-instantiated.
    pub(super) fn new(bytes: &[u8], max_instances: u32) -> Floor {
        let engine = build_engine(&EngineOptions {
            cache_dir: None,
            max_instances,
        })
        .unwrap();
        let mut linker = Linker::<State>::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker).unwrap();
        let mut host = linker.instance("disbatch:plugin/host@0.2.0").unwrap();
        host.func_wrap("progress", |_, _: (Option<f32>, Option<String>)| Ok(()))
            .unwrap();
        host.func_wrap("submit", |_, _: (String, String)| {
            Ok((Err::<(), String>("no queue is granted".into()),))
        })
        .unwrap();
        let component = Component::new(&engine, bytes).unwrap();
        let run = component
            .get_export_index(None, "run")
            .expect("the component exports run");
        let pre = linker.instantiate_pre(&component).unwrap();
        Floor { engine, pre, run }
    }

    /// [`Floor::new`] on the component file at `path`.
    pub(super) fn from_file(path: &Path, max_instances: u32) -> Floor {
        Floor::new(&std::fs::read(path).unwrap(), max_instances)
    }

    /// One task: a fresh store, instantiate, call `run(params)`; the status it returned.
    pub(super) fn run(&self, params: &str) -> u32 {
        let state = State {
            wasi: WasiCtxBuilder::new().build(),
            table: ResourceTable::new(),
        };
        let mut store = Store::new(&self.engine, state);
        store.set_epoch_deadline(1);
        let instance = self.pre.instantiate(&mut store).unwrap();
        let run = instance
            .get_typed_func::<(&str,), (Result<u32, String>,)>(&mut store, &self.run)
            .unwrap();
        let (result,) = run.call(&mut store, (params,)).unwrap();
        result.expect("the plugin returned ok")
    }
}

//! The single `bindgen!` site: host bindings of the `disbatch:plugin` world in `wit/`.

wasmtime::component::bindgen!({
    path: "wit",
    world: "disbatch:plugin/plugin",
});

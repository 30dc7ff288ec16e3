//! Raw components written in WAT for the sandbox's tests: a `run` export of the plugin
//! world around core modules a test chooses.

/// A component whose `prelude` (core modules and instances) comes first, then a main
/// module whose `run` executes `run_body` and returns the address of its result at 16:
/// the body stores the result's tag at 16 and its payload from 20.
pub fn component_with(prelude: &str, run_body: &str) -> Vec<u8> {
    wat::parse_str(format!(
        r#"(component
  {prelude}
  (core module $main
    (memory (export "memory") 1)
    (func (export "realloc") (param i32 i32 i32 i32) (result i32) i32.const 1024)
    (func (export "run") (param i32 i32) (result i32)
      {run_body}
      i32.const 16))
  (core instance $m (instantiate $main))
  (func (export "run") (param "params" string) (result (result u32 (error string)))
    (canon lift (core func $m "run") (memory (core memory $m "memory")) (realloc (core func $m "realloc")))))"#
    ))
    .unwrap()
}

/// The body of a `run` that returns ok(1).
pub const RETURNS_OK: &str = "(i32.store8 (i32.const 16) (i32.const 0)) (i32.store (i32.const 20) (i32.const 1))";

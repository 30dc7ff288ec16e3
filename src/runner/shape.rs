//! Bounds on what the host agrees to compile.
//!
//! Compiling is the one step no deadline reaches: wasmtime cannot interrupt Cranelift, and
//! a small component with pathological function bodies costs minutes of CPU and gigabytes
//! of memory before the task's timeout even starts. What Cranelift pays grows with the
//! values a function keeps (its parameters and locals, and the operand stack) times the
//! control flow they cross: SSA construction gives every merge block a parameter per
//! live value, and register allocation handles each of them at every block. So before
//! compiling, the component is validated and walked once (every nested module and
//! component included), and each function is measured:
//!
//! - **values**: parameters plus declared locals, plus the deepest operand stack;
//! - **control**: blocks, loops, ifs, elses, branches and `br_table` targets;
//! - **operators**: instructions in its body;
//! - **cost**: values × control.
//!
//! It is refused, with the function, the measure and the limit named, when one function is
//! over [`MAX_FUNCTION_COST`] or [`MAX_FUNCTION_OPS`], or when its functions together are
//! over [`MAX_TOTAL_COST`], [`MAX_TOTAL_OPS`] or [`MAX_TOTAL_LOCALS`], or the file over
//! [`MAX_COMPONENT_BYTES`]. Real plugins are far inside every limit (a componentize-py
//! component, a whole CPython in 18 MB, included); the numbers are in docs/security.md.
//! The shape is a heuristic, so compilation also runs in a child process under limits
//! where the binary allows it (see [`super::compile`]).

use wasmparser::{FuncValidatorAllocations, Operator, Parser, ValidPayload, Validator, WasmFeatures};

/// Largest component file the host compiles (256 MiB).
pub const MAX_COMPONENT_BYTES: usize = 256 << 20;
/// Most locals (parameters included) all the functions of a component may have together.
pub const MAX_TOTAL_LOCALS: u64 = 4_000_000;
/// Largest cost (values × control) of one function.
pub const MAX_FUNCTION_COST: u64 = 10_000_000;
/// Largest cost (values × control) of all the functions of a component together.
pub const MAX_TOTAL_COST: u64 = 200_000_000;
/// Most operators in one function body.
pub const MAX_FUNCTION_OPS: u64 = 1_000_000;
/// Most operators in all the function bodies of a component together.
pub const MAX_TOTAL_OPS: u64 = 30_000_000;

/// What one function asks the compiler to do.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FunctionShape {
    /// Which core module it is in: 1 for the first in the file (nested ones included).
    pub module: u64,
    /// Its index in that module's function index space (imported functions come first).
    pub index: u32,
    /// Parameters plus declared locals.
    pub locals: u64,
    /// The deepest its operand stack gets.
    pub stack: u64,
    /// Blocks, loops, ifs, elses, branches and `br_table` targets.
    pub control: u64,
    /// Operators in its body.
    pub ops: u64,
}

impl FunctionShape {
    /// Values the function keeps: locals and the deepest operand stack.
    pub fn values(&self) -> u64 {
        self.locals + self.stack
    }

    /// What compiling it costs: values × control.
    pub fn cost(&self) -> u64 {
        self.values().saturating_mul(self.control)
    }

    fn name(&self) -> String {
        format!("function {} of core module {}", self.index, self.module)
    }
}

/// What a component asks the compiler to do.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Function bodies, over every nested core module.
    pub functions: u64,
    /// Locals (parameters included) of those functions.
    pub locals: u64,
    /// Operators of those functions.
    pub ops: u64,
    /// Their summed cost.
    pub cost: u64,
    /// The function of the highest cost.
    pub costliest: FunctionShape,
    /// The function of the most operators.
    pub longest: FunctionShape,
}

/// Refuses a component file of `len` bytes when it is over [`MAX_COMPONENT_BYTES`].
pub(crate) fn check_size(len: u64) -> Result<(), String> {
    if len > MAX_COMPONENT_BYTES as u64 {
        return Err(format!(
            "the component is {len} bytes, over the limit of {MAX_COMPONENT_BYTES} bytes (256 MiB) the host compiles (retrying cannot help)"
        ));
    }
    Ok(())
}

fn refuse(what: String) -> String {
    format!("{what}, too costly to compile (retrying cannot help)")
}

/// Measures `bytes` (validating it) and refuses it when it exceeds a bound; the message
/// names the function, the measure and the bound, and says that retrying cannot help.
pub fn check(bytes: &[u8]) -> Result<Shape, String> {
    check_size(bytes.len() as u64)?;
    let invalid = |e: wasmparser::BinaryReaderError| format!("not a valid component: {e}");
    let mut shape = Shape::default();
    let mut validator = Validator::new_with_features(WasmFeatures::all());
    let mut allocs = FuncValidatorAllocations::default();
    let mut modules = 0u64;
    for payload in Parser::new(0).parse_all(bytes) {
        let payload = payload.map_err(invalid)?;
        if let wasmparser::Payload::Version {
            encoding: wasmparser::Encoding::Module,
            ..
        } = payload
        {
            modules += 1;
        }
        let ValidPayload::Func(func, body) = validator.payload(&payload).map_err(invalid)? else {
            continue;
        };
        let mut v = func.into_validator(std::mem::take(&mut allocs));
        let mut f = FunctionShape {
            module: modules,
            index: v.index(),
            ..FunctionShape::default()
        };
        let mut reader = body.get_binary_reader();
        v.read_locals(&mut reader).map_err(invalid)?;
        f.locals = u64::from(v.len_locals());
        let mut ops = body.get_operators_reader().map_err(invalid)?;
        while !ops.eof() {
            let offset = ops.original_position();
            let op = ops.read().map_err(invalid)?;
            v.op(offset, &op).map_err(invalid)?;
            f.ops += 1;
            f.control += control(&op);
            f.stack = f.stack.max(u64::from(v.operand_stack_height()));
            // Checked as it grows, so a huge body is refused without walking all of it.
            if f.ops > MAX_FUNCTION_OPS {
                return Err(refuse(format!(
                    "{} has more than {MAX_FUNCTION_OPS} operators (the limit for one function)",
                    f.name()
                )));
            }
            if f.cost() > MAX_FUNCTION_COST {
                return Err(refuse(format!(
                    "{} costs more than {MAX_FUNCTION_COST} (values × control: {} locals and parameters plus \
                     {} deep operand stack, times {} blocks and branches so far; the limit for one function)",
                    f.name(),
                    f.locals,
                    f.stack,
                    f.control
                )));
            }
        }
        ops.finish().map_err(invalid)?;
        allocs = v.into_allocations();
        shape.functions += 1;
        shape.locals += f.locals;
        shape.ops += f.ops;
        shape.cost += f.cost();
        if f.cost() >= shape.costliest.cost() {
            shape.costliest = f;
        }
        if f.ops >= shape.longest.ops {
            shape.longest = f;
        }
        let totals = [
            (shape.locals, MAX_TOTAL_LOCALS, "locals (parameters included)"),
            (shape.cost, MAX_TOTAL_COST, "cost (values × control)"),
            (shape.ops, MAX_TOTAL_OPS, "operators"),
        ];
        if let Some((_, max, what)) = totals.into_iter().find(|(n, max, _)| n > max) {
            return Err(refuse(format!(
                "its functions have more than {max} {what} in all (the limit reached at {})",
                f.name()
            )));
        }
    }
    Ok(shape)
}

/// How many blocks and control-flow edges `op` gives the compiler.
fn control(op: &Operator<'_>) -> u64 {
    match op {
        Operator::Block { .. }
        | Operator::Loop { .. }
        | Operator::If { .. }
        | Operator::Else
        | Operator::Try { .. }
        | Operator::Catch { .. }
        | Operator::CatchAll
        | Operator::Delegate { .. }
        | Operator::Br { .. }
        | Operator::BrIf { .. }
        | Operator::BrOnNull { .. }
        | Operator::BrOnNonNull { .. }
        | Operator::BrOnCast { .. }
        | Operator::BrOnCastFail { .. } => 1,
        Operator::BrTable { targets } => u64::from(targets.len()) + 1,
        Operator::TryTable { try_table } => try_table.catches.len() as u64 + 1,
        _ => 0,
    }
}

/// Rejects files that are not WebAssembly components before handing them to the compiler,
/// so the error says what the file is.
pub(crate) fn check_header(bytes: &[u8]) -> Result<(), String> {
    const MAGIC: &[u8] = b"\0asm";
    if bytes.len() < 8 || &bytes[..4] != MAGIC {
        return Err("not a WebAssembly file (no \\0asm header)".into());
    }
    match bytes[6..8] {
        [0, 0] => {
            Err("is a core WebAssembly module, not a component; build plugins with --target wasm32-wasip2".into())
        }
        [1, 0] => Ok(()),
        _ => Err("unsupported WebAssembly layer (not a component)".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_is_a_parse_error_not_a_panic() {
        assert!(check(b"\0asm\x0d\0\x01\0\xff\xff")
            .unwrap_err()
            .contains("not a valid component"));
    }

    fn module(wat: &str) -> Vec<u8> {
        wat::parse_str(wat).unwrap()
    }

    #[test]
    fn measures_parameters_locals_stack_and_control() {
        let shape = check(&module(
            r#"(module (func (param i32 i32) (local i64 i64 i64)
                 (block (br_if 0 (local.get 0)) (br_table 0 0 0 (local.get 1)))
                 (loop (i32.const 1) (i32.const 2) (i32.const 3) (drop) (drop) (drop))))"#,
        ))
        .unwrap();
        assert_eq!(shape.functions, 1);
        let f = shape.costliest;
        // block, br_if, br_table of two targets and a default, loop.
        assert_eq!((f.locals, f.stack, f.control), (5, 3, 6), "{f:?}");
        assert_eq!(shape.cost, 8 * 6);
    }

    #[test]
    fn parameters_count_like_locals() {
        let params = "i32 ".repeat(999);
        let body = "(block (br_if 0 (local.get 0)))".repeat(6_000);
        let err = check(&module(&format!("(module (func (param {params}) {body}))"))).unwrap_err();
        assert!(err.contains("function 0 of core module 1 costs more than"), "{err}");
        assert!(err.contains("999 locals and parameters"), "{err}");
        assert!(err.contains("retrying cannot help"), "{err}");
    }

    #[test]
    fn headers_are_told_apart() {
        assert!(check_header(b"hello world")
            .unwrap_err()
            .contains("not a WebAssembly file"));
        assert!(check_header(b"\0asm\x01\0\0\0")
            .unwrap_err()
            .contains("core WebAssembly module"));
        assert!(check_header(b"\0asm\x0d\0\x01\0").is_ok());
    }
}

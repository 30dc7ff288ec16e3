//! Bounds on what the host agrees to compile.
//!
//! Compiling is the one step no deadline reaches: wasmtime cannot interrupt Cranelift, and
//! a small component with pathological function bodies (thousands of functions declaring
//! tens of thousands of locals each) costs minutes of CPU before the task's timeout even
//! starts. Before compiling, the component is walked once (every nested module and
//! component included) and refused, with the limit named, when it is larger than
//! [`MAX_COMPONENT_BYTES`] or its functions together declare more than
//! [`MAX_TOTAL_LOCALS`] locals. Real plugins are far inside both: a componentize-py
//! component (a whole CPython) is about 18 MB.

use wasmparser::{Parser, Payload};

/// Largest component file the host compiles (256 MiB).
pub const MAX_COMPONENT_BYTES: usize = 256 << 20;
/// Most locals all the functions of a component may declare together.
pub const MAX_TOTAL_LOCALS: u64 = 4_000_000;

/// What a component asks the compiler to do.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Function bodies, over every nested core module.
    pub functions: u64,
    /// Locals those functions declare.
    pub locals: u64,
}

/// Measures `bytes` and refuses it when it exceeds a bound; the message names the bound
/// and says that retrying cannot help.
pub(crate) fn check(bytes: &[u8]) -> Result<Shape, String> {
    if bytes.len() > MAX_COMPONENT_BYTES {
        return Err(format!(
            "the component is {} bytes, over the limit of {MAX_COMPONENT_BYTES} bytes (256 MiB) the host compiles (retrying cannot help)",
            bytes.len()
        ));
    }
    let mut shape = Shape::default();
    for payload in Parser::new(0).parse_all(bytes) {
        let payload = payload.map_err(|e| format!("not a valid component: {e}"))?;
        if let Payload::CodeSectionEntry(body) = payload {
            shape.functions += 1;
            let locals = body
                .get_locals_reader()
                .map_err(|e| format!("failed to parse function {}: {e}", shape.functions))?;
            for local in locals {
                let (count, _) = local.map_err(|e| format!("failed to parse function {}: {e}", shape.functions))?;
                shape.locals += u64::from(count);
            }
            if shape.locals > MAX_TOTAL_LOCALS {
                return Err(format!(
                    "its functions declare more than {MAX_TOTAL_LOCALS} locals in all (the limit reached at function {}), \
                     too costly to compile (retrying cannot help)",
                    shape.functions
                ));
            }
        }
    }
    Ok(shape)
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
}

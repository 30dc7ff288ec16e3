//! What a component is made of, read without compiling it: its top-level imports and
//! exports, and the core modules, instantiations, memories and tables it declares (every
//! nested module and component included). `runner check` prints it next to the verdict
//! of actually loading the component, which alone says whether a task stays within the
//! per-task caps: loading counts, as wasmtime instantiates them, the module instances,
//! memories and tables a task creates, and refuses a component over a cap.

use wasmparser::{Instance, Parser, Payload};

/// The interfaces of WASI 0.2 this host links (`wasmtime-wasi` preview 2).
const WASI_INTERFACES: [&str; 31] = [
    "wasi:cli/environment",
    "wasi:cli/exit",
    "wasi:cli/stdin",
    "wasi:cli/stdout",
    "wasi:cli/stderr",
    "wasi:cli/terminal-input",
    "wasi:cli/terminal-output",
    "wasi:cli/terminal-stdin",
    "wasi:cli/terminal-stdout",
    "wasi:cli/terminal-stderr",
    "wasi:clocks/monotonic-clock",
    "wasi:clocks/wall-clock",
    "wasi:filesystem/types",
    "wasi:filesystem/preopens",
    "wasi:io/error",
    "wasi:io/poll",
    "wasi:io/streams",
    "wasi:random/random",
    "wasi:random/insecure",
    "wasi:random/insecure-seed",
    "wasi:sockets/network",
    "wasi:sockets/instance-network",
    "wasi:sockets/tcp",
    "wasi:sockets/tcp-create-socket",
    "wasi:sockets/udp",
    "wasi:sockets/udp-create-socket",
    "wasi:sockets/ip-name-lookup",
    "wasi:http/types",
    "wasi:http/outgoing-handler",
    "disbatch:plugin/host",
    "wasi:cli/run",
];

/// One top-level import or export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    /// Its name, e.g. `wasi:io/streams@0.2.3` or `run`.
    pub name: String,
    /// `instance`, `func`, `type`, …
    pub kind: &'static str,
}

/// What [`inspect`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inspection {
    /// Top-level imports, in order.
    pub imports: Vec<Item>,
    /// Top-level exports, in order.
    pub exports: Vec<Item>,
    /// Core modules, nested ones included.
    pub modules: u64,
    /// Core module instantiations declared. Core instances made of exports (a bundle of
    /// functions passed to an instantiation) are not counted: a task creates no instance
    /// for them, and they are not counted against its cap of core instances.
    pub instantiations: u64,
    /// Linear memories the modules define.
    pub memories: u64,
    /// Tables the modules define.
    pub tables: u64,
}

/// Whether this host links import `name` (`wasi:io/streams@0.2.3`): the WASI 0.2
/// interfaces and `disbatch:plugin/host` 0.1.
pub fn host_provides(name: &str) -> bool {
    let (interface, version) = name.split_once('@').unwrap_or((name, ""));
    let version_ok = if interface.starts_with("disbatch:") {
        version.starts_with("0.1.") || version.starts_with("0.2.")
    } else {
        version.starts_with("0.2.")
    };
    version_ok && WASI_INTERFACES.contains(&interface)
}

/// Reads `bytes` as a component.
pub fn inspect(bytes: &[u8]) -> Result<Inspection, String> {
    let mut found = Inspection::default();
    let mut depth = 0u32;
    for payload in Parser::new(0).parse_all(bytes) {
        let payload = payload.map_err(|e| format!("not a valid component: {e}"))?;
        match payload {
            Payload::Version { encoding, .. } => {
                if depth == 0 && encoding != wasmparser::Encoding::Component {
                    return Err("a core module, not a component: build it for wasm32-wasip2".into());
                }
                if encoding == wasmparser::Encoding::Module {
                    found.modules += 1;
                }
                depth += 1;
            }
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(reader) if depth == 1 => {
                for import in reader {
                    let import = import.map_err(|e| format!("not a valid component: {e}"))?;
                    found.imports.push(Item {
                        name: import.name.name.to_owned(),
                        kind: import.ty.kind().desc(),
                    });
                }
            }
            Payload::ComponentExportSection(reader) if depth == 1 => {
                for export in reader {
                    let export = export.map_err(|e| format!("not a valid component: {e}"))?;
                    found.exports.push(Item {
                        name: export.name.name.to_owned(),
                        kind: export.kind.desc(),
                    });
                }
            }
            Payload::InstanceSection(reader) => {
                for instance in reader {
                    let instance = instance.map_err(|e| format!("not a valid component: {e}"))?;
                    if matches!(instance, Instance::Instantiate { .. }) {
                        found.instantiations += 1;
                    }
                }
            }
            Payload::MemorySection(reader) => found.memories += u64::from(reader.count()),
            Payload::TableSection(reader) => found.tables += u64::from(reader.count()),
            _ => {}
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knows_what_the_host_links() {
        assert!(host_provides("wasi:io/streams@0.2.3"));
        assert!(host_provides("disbatch:plugin/host@0.1.0"));
        assert!(host_provides("disbatch:plugin/host@0.2.0"));
        assert!(!host_provides("wasi:io/streams@0.3.0"));
        assert!(host_provides("wasi:http/outgoing-handler@0.2.3"));
        assert!(!host_provides("wasi:http/incoming-handler@0.2.3"));
        assert!(!host_provides("example:needy/missing@0.1.0"));
        assert!(!host_provides("disbatch:plugin/host@1.0.0"));
    }

    #[test]
    fn a_core_module_is_not_a_component() {
        let core = b"\0asm\x01\0\0\0";
        assert!(inspect(core).unwrap_err().contains("not a component"));
    }
}

//! Per-task resource limits: one memory budget summed over every linear memory and table
//! of the task's store, caps on core instances, memories and tables, on the handles the
//! host holds for the task, and the task slots that keep concurrent tasks inside the
//! engine's instance pool.

use std::sync::{Condvar, Mutex};

use wasmtime::component::ResourceTableError;
use wasmtime::ResourceLimiter;

/// Most core module instances one task may create (a componentize-py component needs 14).
pub const MAX_CORE_INSTANCES_PER_TASK: usize = 32;
/// Most linear memories one task may create.
pub const MAX_MEMORIES_PER_TASK: usize = 4;
/// Most tables one task may create.
pub const MAX_TABLES_PER_TASK: usize = 8;
/// Bytes one table element counts against the memory budget (a pointer-sized funcref).
pub const TABLE_ELEMENT_BYTES: u64 = 8;
/// The most host-side bytes one handle holds: a set of headers or a request body's buffer
/// (see `http`). Open handles are capped at the memory limit over this, so what the host
/// holds for a task stays within the task's own memory limit.
pub const HANDLE_BYTES: u64 = 128 * 1024;
/// Open handles a task may always hold, whatever its memory limit.
pub const MIN_HANDLES: usize = 256;

/// Open handles (files, streams, sockets, pollables, HTTP headers, requests and bodies)
/// one task may hold at once with a memory limit of `memory` bytes.
pub fn max_handles(memory: u64) -> usize {
    usize::try_from(memory / HANDLE_BYTES)
        .unwrap_or(usize::MAX)
        .max(MIN_HANDLES)
}

/// The message of a task stopped by a limit on what the host holds for it (its open
/// handles, the size of a set of HTTP headers), if `e` is that.
pub(crate) fn host_limit_message(e: &wasmtime::Error, memory: u64) -> Option<String> {
    use wasmtime_wasi_http::FieldMapError;
    e.chain().find_map(|c| {
        if matches!(c.downcast_ref::<ResourceTableError>(), Some(ResourceTableError::Full)) {
            return Some(format!(
                "the plugin held {} open handles (files, streams, sockets, HTTP headers and bodies), \
                 the most a task with a memory limit of {} may hold (retrying cannot help); \
                 close what it no longer uses, or raise sandbox.memory",
                max_handles(memory),
                super::human_bytes(memory)
            ));
        }
        if c.to_string() == "write exceeded budget" {
            return Some(format!(
                "the plugin wrote more into an HTTP request body at once than the stream permitted \
                 (check-write; at most {} per write) (retrying cannot help)",
                super::human_bytes(super::http::BODY_CHUNK as u64)
            ));
        }
        match c.downcast_ref::<FieldMapError>() {
            Some(FieldMapError::TotalSizeTooBig | FieldMapError::TooManyFields) => Some(format!(
                "the plugin built a set of HTTP headers larger than {} in memory, the most one set may hold \
                 (retrying cannot help)",
                super::human_bytes(super::http::FIELD_SIZE_LIMIT as u64)
            )),
            _ => None,
        }
    })
}

/// Sums the growth of every memory and table of a task's store against one budget, and
/// remembers whether it refused a growth.
pub(crate) struct TaskLimiter {
    limit: u64,
    used: u64,
    /// The bytes of the last growth allowed, returned if that growth then failed.
    last_grant: u64,
    pub(crate) refused: bool,
}

impl TaskLimiter {
    pub(crate) fn new(limit: u64) -> Self {
        TaskLimiter {
            limit,
            used: 0,
            last_grant: 0,
            refused: false,
        }
    }

    fn grow(&mut self, bytes: u64) -> bool {
        match self.used.checked_add(bytes) {
            Some(total) if total <= self.limit => {
                self.used = total;
                self.last_grant = bytes;
                true
            }
            _ => {
                self.refused = true;
                false
            }
        }
    }

    fn give_back(&mut self) {
        self.used = self.used.saturating_sub(self.last_grant);
        self.last_grant = 0;
    }
}

impl ResourceLimiter for TaskLimiter {
    fn memory_growing(&mut self, current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(self.grow(desired.saturating_sub(current) as u64))
    }

    fn memory_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        self.give_back();
        Ok(())
    }

    fn table_growing(&mut self, current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        let elements = desired.saturating_sub(current) as u64;
        Ok(self.grow(elements.saturating_mul(TABLE_ELEMENT_BYTES)))
    }

    fn table_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        self.give_back();
        Ok(())
    }

    fn instances(&self) -> usize {
        MAX_CORE_INSTANCES_PER_TASK
    }

    fn memories(&self) -> usize {
        MAX_MEMORIES_PER_TASK
    }

    fn tables(&self) -> usize {
        MAX_TABLES_PER_TASK
    }
}

/// The message of an instantiation refused by a per-task cap, if `e` is one.
pub(crate) fn cap_message(e: &wasmtime::Error) -> Option<String> {
    let text = format!("{e:#}");
    let (what, n) = if text.contains("instance count too high")
        || text.contains("core instances")
        || text.contains("core module instances")
    {
        ("core instances", MAX_CORE_INSTANCES_PER_TASK)
    } else if text.contains("memory count too high") || text.contains("memories") && text.contains("exceed") {
        ("memories", MAX_MEMORIES_PER_TASK)
    } else if text.contains("table count too high") || text.contains("tables") && text.contains("exceed") {
        ("tables", MAX_TABLES_PER_TASK)
    } else {
        return None;
    };
    Some(format!(
        "the plugin exceeds the limit of {n} {what} per task (retrying cannot help): {}",
        text.lines().next().unwrap_or_default()
    ))
}

/// Counting semaphore of task slots: at most `max_instances` tasks hold one, so the
/// instance pool (sized for that many tasks at their caps) is never full.
pub(crate) struct Slots {
    free: Mutex<u32>,
    freed: Condvar,
}

impl Slots {
    pub(crate) fn new(n: u32) -> Self {
        Slots {
            free: Mutex::new(n.max(1)),
            freed: Condvar::new(),
        }
    }

    /// Waits for a free slot.
    pub(crate) fn take(&self) -> SlotGuard<'_> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        while *free == 0 {
            free = self.freed.wait(free).unwrap_or_else(|e| e.into_inner());
        }
        *free -= 1;
        SlotGuard(self)
    }
}

/// A task slot, given back when dropped.
pub(crate) struct SlotGuard<'a>(&'a Slots);

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        *self.0.free.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.0.freed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growth_is_summed_over_memories_and_tables() {
        let mut l = TaskLimiter::new(100 << 20);
        assert!(l.memory_growing(0, 64 << 20, None).unwrap());
        assert!(!l.memory_growing(0, 64 << 20, None).unwrap());
        assert!(l.refused);
        assert!(l.table_growing(0, 1000, None).unwrap());
        assert_eq!(l.used, (64 << 20) + 8000);
        l.memory_grow_failed(wasmtime::Error::msg("x")).unwrap();
        assert_eq!(l.used, 64 << 20);
    }
}

//! Where a finished task's stdout and stderr go: inline in the task document or GridFS
//! files, per the `gfs` setting, never exceeding MongoDB's 16 MB document limit.

use bson::oid::ObjectId;

use crate::config::Gfs;
use crate::store::{OutputValue, Store, StoreResult};

/// Most bytes of stdout + stderr (plus params) kept inline in a task document: 15 MiB,
/// leaving room under the 16 MB BSON limit for the rest of the document.
pub const INLINE_BUDGET: usize = 15 * 1024 * 1024;

/// Where each stream goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placement {
    /// Both inline.
    Inline,
    /// stdout in a file, stderr inline.
    StdoutFile,
    /// stderr in a file, stdout inline.
    StderrFile,
    /// Both in files.
    Files,
}

/// Decides where the streams go. `budget` is what the document may hold of output.
pub(crate) fn placement(gfs: Gfs, stdout: usize, stderr: usize, budget: usize) -> Placement {
    match gfs {
        Gfs::Always => Placement::Files,
        Gfs::Never => Placement::Inline,
        Gfs::Auto if stdout + stderr <= budget => Placement::Inline,
        Gfs::Auto if stdout >= stderr && stderr <= budget => Placement::StdoutFile,
        Gfs::Auto if stderr > stdout && stdout <= budget => Placement::StderrFile,
        Gfs::Auto => Placement::Files,
    }
}

/// A plugin's u32 status as the task's 32-bit status: a value above `i32::MAX` is
/// clamped to `i32::MAX` (never wrapped to a negative, which the spec reserves for
/// queued, claimed, running and orphaned) and logged.
pub(crate) fn stored_status(status: u32) -> i32 {
    i32::try_from(status).unwrap_or_else(|_| {
        tracing::warn!(status, "plugin status above 2147483647; stored as 2147483647");
        i32::MAX
    })
}

/// Cuts `text` to at most `max` bytes on a character boundary, appending a marker saying
/// how much was dropped. Returns the text unchanged when it fits. The result never exceeds
/// `max` bytes: when even the marker does not fit, the marker itself is cut.
pub(crate) fn truncate_inline(text: String, max: usize, stream: &str) -> String {
    if text.len() <= max {
        return text;
    }
    let marker = |dropped: usize| {
        format!(
            "\n[disbatch: {stream} truncated to fit the task document (gfs is false); {dropped} of {} bytes dropped]\n",
            text.len()
        )
    };
    // The dropped count has at most as many digits as the whole length, so this marker
    // is at least as long as the final one.
    let mut end = max.saturating_sub(marker(text.len()).len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut tail = marker(text.len() - end);
    if tail.len() > max {
        let mut keep = max;
        while !tail.is_char_boundary(keep) {
            keep -= 1;
        }
        tail.truncate(keep);
    }
    let mut cut = text;
    cut.truncate(end);
    cut.push_str(&tail);
    cut
}

/// The ids of the files a task's stdout and stderr go to when they go to files. Chosen
/// once per result, before the first attempt, so that every retry of
/// [`store_outputs`] rewrites the same files instead of leaving the earlier attempt's
/// behind, and so that the files can be discarded when the result cannot be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OutputFiles {
    /// The stdout file's id.
    pub stdout: ObjectId,
    /// The stderr file's id.
    pub stderr: ObjectId,
}

impl OutputFiles {
    /// Two new ids.
    pub(crate) fn new() -> OutputFiles {
        OutputFiles {
            stdout: ObjectId::new(),
            stderr: ObjectId::new(),
        }
    }

    /// Both ids.
    pub(crate) fn ids(&self) -> [ObjectId; 2] {
        [self.stdout, self.stderr]
    }
}

/// Stores the streams as decided by `gfs`: files (as `files`) are written first, so the
/// task never points at a missing file. `params_len` is the size of the task's params,
/// which shares the document with inline output. Idempotent for the same `files`.
pub(crate) async fn store_outputs(
    store: &dyn Store,
    gfs: Gfs,
    task: ObjectId,
    files: OutputFiles,
    params_len: usize,
    stdout: String,
    stderr: String,
) -> StoreResult<(OutputValue, OutputValue)> {
    let budget = INLINE_BUDGET.saturating_sub(params_len);
    let place = placement(gfs, stdout.len(), stderr.len(), budget);
    let (out_file, err_file) = match place {
        Placement::Inline => (false, false),
        Placement::StdoutFile => (true, false),
        Placement::StderrFile => (false, true),
        Placement::Files => (true, true),
    };
    if place == Placement::Inline && gfs == Gfs::Never && stdout.len() + stderr.len() > budget {
        // Share the budget: the smaller stream keeps what it has when it fits in half.
        let half = budget / 2;
        let (out_max, err_max) = if stdout.len() <= half {
            (stdout.len(), budget - stdout.len())
        } else if stderr.len() <= half {
            (budget - stderr.len(), stderr.len())
        } else {
            (half, budget - half)
        };
        return Ok((
            OutputValue::Inline(truncate_inline(stdout, out_max, "stdout")),
            OutputValue::Inline(truncate_inline(stderr, err_max, "stderr")),
        ));
    }
    let stdout = if out_file {
        store.put_output_file(files.stdout, task, "stdout", &stdout).await?;
        OutputValue::File(files.stdout)
    } else {
        OutputValue::Inline(stdout)
    };
    let stderr = if err_file {
        store.put_output_file(files.stderr, task, "stderr", &stderr).await?;
        OutputValue::File(files.stderr)
    } else {
        OutputValue::Inline(stderr)
    };
    Ok((stdout, stderr))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_puts_only_what_must_go_into_files() {
        assert_eq!(placement(Gfs::Auto, 10, 10, 100), Placement::Inline);
        assert_eq!(placement(Gfs::Auto, 95, 10, 100), Placement::StdoutFile);
        assert_eq!(placement(Gfs::Auto, 10, 95, 100), Placement::StderrFile);
        assert_eq!(placement(Gfs::Auto, 150, 150, 100), Placement::Files);
        assert_eq!(placement(Gfs::Always, 0, 0, 100), Placement::Files);
        assert_eq!(placement(Gfs::Never, 500, 500, 100), Placement::Inline);
    }

    #[test]
    fn large_plugin_statuses_are_clamped_not_wrapped() {
        assert_eq!(stored_status(1), 1);
        assert_eq!(stored_status(i32::MAX as u32), i32::MAX);
        assert_eq!(stored_status(u32::MAX), i32::MAX);
        assert_eq!(stored_status(1 << 31), i32::MAX);
    }

    #[test]
    fn truncation_respects_char_boundaries_and_says_so() {
        let text = "é".repeat(1000); // 2000 bytes
        let cut = truncate_inline(text, 500, "stdout");
        assert!(cut.len() <= 500, "{}", cut.len());
        assert!(cut.contains("stdout truncated to fit the task document"));
        assert!(cut.contains("of 2000 bytes dropped"));
        assert_eq!(truncate_inline("short".into(), 500, "stdout"), "short");
        assert!(truncate_inline("x".repeat(100), 10, "stdout").len() <= 10);
        assert_eq!(truncate_inline("x".repeat(100), 0, "stdout"), "");
    }

    proptest::proptest! {
        #[test]
        fn truncation_never_exceeds_its_bound(text in "\\PC{0,400}", max in 0usize..600, stream in "\\PC{0,20}") {
            let fits = text.len() <= max;
            let cut = truncate_inline(text.clone(), max, &stream);
            proptest::prop_assert!(cut.len() <= max, "{} > {max}", cut.len());
            if fits {
                proptest::prop_assert_eq!(cut, text);
            }
        }
    }
}

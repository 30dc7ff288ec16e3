//! Captured plugin output: a WASI output stream that keeps the first `cap` bytes.
//!
//! A plugin must never be able to exhaust host memory through stdout/stderr, and it must
//! never be killed just because it printed a lot. [`CappedOutput`] therefore accepts every
//! write, keeps the first `cap` bytes, counts the rest and reports the truncation, so the
//! task's record can say "output truncated at N bytes" instead of silently losing data.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};

/// The most bytes a guest may hand over in one `write` (the usual WASI permit size).
const WRITE_PERMIT: usize = 64 * 1024;

#[derive(Debug, Default)]
struct Buffer {
    kept: Vec<u8>,
    dropped: u64,
}

/// One captured stream. Clones share the same buffer.
#[derive(Debug, Clone)]
pub struct CappedOutput {
    cap: usize,
    buffer: Arc<Mutex<Buffer>>,
}

/// What one captured stream (stdout or stderr) held when the plugin finished.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Captured {
    /// The first `cap` bytes the plugin wrote.
    pub bytes: Vec<u8>,
    /// How many bytes were written after the cap was reached and not kept.
    pub dropped: u64,
    /// The cap in bytes that was in force.
    pub cap: usize,
}

impl Captured {
    /// Whether any output was dropped.
    pub fn truncated(&self) -> bool {
        self.dropped > 0
    }

    /// The captured bytes as text, as stored and shown: invalid UTF-8 is replaced by U+FFFD,
    /// a plugin line that starts like a host note (`[disbatch`) is prefixed with
    /// [`PLUGIN_LINE_PREFIX`] so no plugin text can pass for one, the text is cut to `cap`
    /// bytes again (replacements and prefixes can grow it), and a truncation is stated on a
    /// line of its own at the end. The flag tells whether anything was replaced.
    pub fn to_text(&self) -> (String, bool) {
        let (text, replaced) = match String::from_utf8_lossy(&self.bytes) {
            std::borrow::Cow::Borrowed(s) => (s.to_owned(), false),
            std::borrow::Cow::Owned(s) => (s, true),
        };
        let mut text = neutralize_host_markers(text);
        let mut dropped = self.dropped;
        if text.len() > self.cap {
            let mut end = self.cap;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            dropped += (text.len() - end) as u64;
            text.truncate(end);
        }
        if dropped > 0 {
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&truncation_marker(self.cap, dropped));
        }
        (text, replaced)
    }
}

/// What a plugin line that looks like a host note is prefixed with.
pub const PLUGIN_LINE_PREFIX: &str = "[plugin] ";

/// Prefixes every line of `text` that starts with `[disbatch` with [`PLUGIN_LINE_PREFIX`]:
/// only the host writes lines that start that way. Characters that show nothing (controls,
/// zero-width and other format characters) are looked through, so a line cannot pass for
/// a note behind an invisible first character.
fn neutralize_host_markers(text: String) -> String {
    const MARK: &str = "[disbatch";
    if !text.contains(MARK) {
        return text;
    }
    let mut out = String::with_capacity(text.len() + 64);
    for line in text.split_inclusive('\n') {
        if line.trim_start_matches(invisible).starts_with(MARK) {
            out.push_str(PLUGIN_LINE_PREFIX);
        }
        out.push_str(line);
    }
    out
}

/// Whether `c` shows nothing where it stands: a control character other than tab, or a
/// zero-width, joiner, direction or other format character.
fn invisible(c: char) -> bool {
    (c.is_control() && c != '\t')
        || matches!(c,
            '\u{00AD}' | '\u{034F}' | '\u{061C}' | '\u{115F}' | '\u{1160}' | '\u{17B4}' | '\u{17B5}'
            | '\u{180B}'..='\u{180F}' | '\u{200B}'..='\u{200F}' | '\u{2028}'..='\u{202E}'
            | '\u{2060}'..='\u{206F}' | '\u{3164}' | '\u{FE00}'..='\u{FE0F}' | '\u{FEFF}' | '\u{FFA0}')
}

/// The line appended to an output stream that exceeded its cap.
pub fn truncation_marker(cap: usize, dropped: u64) -> String {
    format!(
        "[disbatch: output truncated at {} ({cap} bytes); {dropped} more bytes were dropped]\n",
        human_bytes(cap as u64)
    )
}

/// `text` made safe for a terminal: every control character but newline and tab (escape
/// sequences, carriage returns, backspaces, C1 controls) is shown as `\u{..}` instead of
/// acting on the terminal.
pub fn escape_controls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() && c != '\n' && c != '\t' {
            out.push_str(&c.escape_unicode().to_string());
        } else {
            out.push(c);
        }
    }
    out
}

/// Formats a byte count as MiB/KiB/B for messages.
pub fn human_bytes(n: u64) -> String {
    const MIB: u64 = 1024 * 1024;
    if n >= MIB && n.is_multiple_of(MIB) {
        format!("{} MiB", n / MIB)
    } else if n >= MIB {
        format!("{:.1} MiB", n as f64 / MIB as f64)
    } else if n >= 1024 && n.is_multiple_of(1024) {
        format!("{} KiB", n / 1024)
    } else {
        format!("{n} bytes")
    }
}

impl CappedOutput {
    /// A stream keeping at most `cap` bytes.
    pub fn new(cap: usize) -> Self {
        CappedOutput {
            cap,
            buffer: Arc::new(Mutex::new(Buffer::default())),
        }
    }

    fn push(&self, bytes: &[u8]) {
        let mut buf = self.buffer.lock().unwrap_or_else(|e| e.into_inner());
        let room = self.cap.saturating_sub(buf.kept.len());
        let keep = room.min(bytes.len());
        buf.kept.extend_from_slice(&bytes[..keep]);
        buf.dropped += (bytes.len() - keep) as u64;
    }

    /// Takes what was captured so far, leaving the stream empty.
    pub fn take(&self) -> Captured {
        let mut buf = self.buffer.lock().unwrap_or_else(|e| e.into_inner());
        let taken = std::mem::take(&mut *buf);
        Captured {
            bytes: taken.kept,
            dropped: taken.dropped,
            cap: self.cap,
        }
    }
}

impl OutputStream for CappedOutput {
    fn write(&mut self, bytes: Bytes) -> Result<(), StreamError> {
        self.push(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }

    fn check_write(&mut self) -> Result<usize, StreamError> {
        Ok(WRITE_PERMIT)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for CappedOutput {
    async fn ready(&mut self) {}
}

impl AsyncWrite for CappedOutput {
    fn poll_write(self: Pin<&mut Self>, _cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.push(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl IsTerminal for CappedOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CappedOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_first_cap_bytes_and_counts_the_rest() {
        let out = CappedOutput::new(5);
        out.push(b"abc");
        out.push(b"defgh");
        let got = out.take();
        assert_eq!(got.bytes, b"abcde");
        assert_eq!(got.dropped, 3);
        let (text, replaced) = got.to_text();
        assert!(!replaced);
        assert!(text.starts_with("abcde\n[disbatch: output truncated at 5 bytes"));
        assert!(text.contains("3 more bytes were dropped"));
    }

    #[test]
    fn stored_text_never_exceeds_the_cap_and_host_notes_cannot_be_forged() {
        // Every invalid byte becomes a 3-byte U+FFFD: the text is cut back to the cap.
        let out = CappedOutput::new(100);
        out.push(&[0xff; 100]);
        let got = out.take();
        let (text, replaced) = got.to_text();
        assert!(replaced);
        let kept = text.split('\n').next().unwrap();
        assert!(kept.len() <= 100, "{}", kept.len());
        assert!(text.contains("[disbatch: output truncated at 100 bytes"), "{text}");
        // A plugin line shaped like a host note is marked as the plugin's.
        let out = CappedOutput::new(1000);
        out.push(b"ok\n[disbatch: task succeeded]\n  [disbatch: indented]\n");
        let (text, _) = out.take().to_text();
        assert_eq!(
            text,
            "ok\n[plugin] [disbatch: task succeeded]\n  [disbatch: indented]\n"
        );
        // An invisible first character does not hide the mark.
        for lead in ["\u{200b}", "\r", "\u{2028}", "\u{feff}", "\u{202e}"] {
            let out = CappedOutput::new(1000);
            out.push(format!("{lead}[disbatch: forged]\n").as_bytes());
            let (text, _) = out.take().to_text();
            assert_eq!(text, format!("[plugin] {lead}[disbatch: forged]\n"), "{lead:?}");
        }
    }

    #[test]
    fn terminal_escapes_are_shown_not_acted_on() {
        assert_eq!(
            escape_controls("a\x1b[2Jb\r\n\tc\u{9b}"),
            "a\\u{1b}[2Jb\\u{d}\n\tc\\u{9b}"
        );
    }

    #[test]
    fn invalid_utf8_is_replaced_and_flagged() {
        let out = CappedOutput::new(100);
        out.push(b"ok \xff\xfe end");
        let (text, replaced) = out.take().to_text();
        assert!(replaced);
        assert_eq!(text, "ok \u{fffd}\u{fffd} end");
    }
}

//! The bounded log of one call: the world's `log` import plus the guest's stdout and stderr.
//!
//! Every line is escaped and bounded ([`crate::text::bounded`], at most
//! [`crate::text::MAX_LOG_LINE_BYTES`]) and also goes to `tracing` with the plugin name as the
//! `plugin` field. Once the
//! call's budget ([`crate::HostConfig::log_limit_bytes`]) is spent, further output is dropped
//! (from the log and from `tracing`) and the log is marked truncated; the guest never sees an
//! error for it.

use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};
use wasmtime_wasi_io::bytes::Bytes;

/// Where a captured line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogSource {
    /// `log(debug, …)`.
    Debug,
    /// `log(info, …)`.
    Info,
    /// `log(warn, …)`.
    Warn,
    /// A line the guest wrote to stdout.
    Stdout,
    /// A line the guest wrote to stderr (panic messages land here).
    Stderr,
}

/// One captured line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// Where it came from.
    pub source: LogSource,
    /// The text, without the trailing newline.
    pub message: String,
}

/// The captured log of one call, in the order the guest produced it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PluginLog {
    /// The lines kept.
    pub lines: Vec<LogLine>,
    /// Whether output was dropped because the budget was spent.
    pub truncated: bool,
}

impl PluginLog {
    /// The messages of the lines from `source`, for tests and diagnostics.
    pub fn messages(&self, source: LogSource) -> Vec<&str> {
        self.lines
            .iter()
            .filter(|l| l.source == source)
            .map(|l| l.message.as_str())
            .collect()
    }
}

#[derive(Debug)]
struct LogState {
    log: PluginLog,
    used: usize,
    limit: usize,
    partial_stdout: Vec<u8>,
    partial_stderr: Vec<u8>,
}

/// The shared sink of one call; cloned into the stdout and stderr streams.
#[derive(Debug, Clone)]
pub(crate) struct LogCollector {
    plugin: Arc<str>,
    state: Arc<Mutex<LogState>>,
}

impl LogCollector {
    /// A collector for one call of `plugin`, keeping at most `limit` bytes.
    pub(crate) fn new(plugin: Arc<str>, limit: usize) -> Self {
        let state = LogState {
            log: PluginLog::default(),
            used: 0,
            limit,
            partial_stdout: Vec::new(),
            partial_stderr: Vec::new(),
        };
        LogCollector {
            plugin,
            state: Arc::new(Mutex::new(state)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, LogState> {
        // A panic while holding the lock cannot leave the state inconsistent; keep going.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records one line from the `log` import.
    pub(crate) fn push(&self, source: LogSource, message: String) {
        let mut st = self.lock();
        self.push_locked(&mut st, source, message);
    }

    fn push_locked(&self, st: &mut LogState, source: LogSource, message: String) {
        if st.log.truncated {
            return;
        }
        // Each line escaped (no ANSI escapes, CR or forged lines reach a terminal or a log)
        // and bounded to MAX_LOG_LINE_BYTES, then charged against the call's budget.
        let mut message = crate::text::bounded_owned(message, crate::text::MAX_LOG_LINE_BYTES);
        let room = st.limit - st.used;
        if message.len() > room {
            let mut cut = room;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
            st.log.truncated = true;
            tracing::warn!(plugin = %self.plugin, limit_bytes = st.limit, "plugin log truncated");
        }
        st.used += message.len();
        emit(&self.plugin, source, &message);
        st.log.lines.push(LogLine { source, message });
    }

    /// Appends raw bytes the guest wrote to stdout or stderr, splitting them into lines.
    fn write_stream(&self, source: LogSource, bytes: &[u8]) {
        let mut st = self.lock();
        let limit = st.limit;
        let partial = match source {
            LogSource::Stdout => &mut st.partial_stdout,
            _ => &mut st.partial_stderr,
        };
        partial.extend_from_slice(bytes);
        let mut lines = Vec::new();
        while let Some(pos) = partial.iter().position(|b| *b == b'\n') {
            let rest = partial.split_off(pos + 1);
            let mut line = std::mem::replace(partial, rest);
            line.pop();
            lines.push(line);
        }
        // An unterminated line longer than the whole budget is cut here, so it stays bounded.
        let overflowed = (partial.len() > limit).then(|| std::mem::take(partial));
        for line in lines.into_iter().chain(overflowed) {
            self.push_locked(&mut st, source, String::from_utf8_lossy(&line).into_owned());
        }
    }

    /// Flushes unterminated stdout/stderr text and returns the log.
    pub(crate) fn finish(&self) -> PluginLog {
        let mut st = self.lock();
        for source in [LogSource::Stdout, LogSource::Stderr] {
            let partial = match source {
                LogSource::Stdout => std::mem::take(&mut st.partial_stdout),
                _ => std::mem::take(&mut st.partial_stderr),
            };
            if !partial.is_empty() {
                self.push_locked(
                    &mut st,
                    source,
                    String::from_utf8_lossy(&partial).into_owned(),
                );
            }
        }
        std::mem::take(&mut st.log)
    }

    /// A WASI stdout or stderr that writes into this collector.
    pub(crate) fn stream(&self, source: LogSource) -> CapturedStream {
        CapturedStream {
            collector: self.clone(),
            source,
        }
    }
}

fn emit(plugin: &str, source: LogSource, message: &str) {
    match source {
        LogSource::Debug => tracing::debug!(plugin, "{message}"),
        LogSource::Info => tracing::info!(plugin, "{message}"),
        LogSource::Warn => tracing::warn!(plugin, "{message}"),
        LogSource::Stdout => tracing::debug!(plugin, stream = "stdout", "{message}"),
        LogSource::Stderr => tracing::info!(plugin, stream = "stderr", "{message}"),
    }
}

/// The guest's stdout or stderr: always writable, never an error, bounded by the collector.
#[derive(Debug, Clone)]
pub(crate) struct CapturedStream {
    collector: LogCollector,
    source: LogSource,
}

impl IsTerminal for CapturedStream {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CapturedStream {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

/// Most bytes accepted per write; WASI asks again for the rest.
const WRITE_PERMIT: usize = 64 << 10;

impl OutputStream for CapturedStream {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.collector.write_stream(self.source, &bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(WRITE_PERMIT)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for CapturedStream {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for CapturedStream {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.collector.write_stream(self.source, buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_lines_and_truncates_at_the_budget() {
        let c = LogCollector::new("t".into(), 10);
        c.push(LogSource::Info, "abc".into());
        c.write_stream(LogSource::Stdout, b"de\nfg");
        c.write_stream(LogSource::Stderr, b"xy\n");
        assert!(!c.lock().log.truncated);
        c.push(LogSource::Warn, "toolong".into());
        c.push(LogSource::Info, "dropped".into());
        let log = c.finish();
        assert!(log.truncated);
        assert_eq!(log.messages(LogSource::Info), ["abc"]);
        assert_eq!(log.messages(LogSource::Stdout), ["de"]);
        assert_eq!(log.messages(LogSource::Stderr), ["xy"]);
        assert_eq!(log.messages(LogSource::Warn), ["too"]);
    }
}

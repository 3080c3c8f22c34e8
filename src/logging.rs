//! Process logging: a tracing subscriber whose writes never block the caller and never fail it.
//!
//! Every formatted line goes into a bounded queue that one dedicated thread drains into stderr.
//! When stderr is slow or stuck (a pipe nobody reads), the queue fills and further lines are
//! dropped and counted instead of blocking the thread that logged; when stderr is gone (a
//! closed pipe), write errors are ignored. The human format escapes control characters in
//! messages and field values, so logged text cannot forge lines or drive a terminal.

use std::error::Error;
use std::fmt::{self, Write as _};
use std::io::{self, IsTerminal, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tracing::field::{Field, Visit};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::field::{MakeVisitor, VisitFmt, VisitOutput};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::reload;
use tracing_subscriber::util::SubscriberInitExt;

/// How many formatted lines may wait for the writer thread before new ones are dropped.
pub const QUEUE_LINES: usize = 8192;

/// How long [`LogGuard::flush`] waits for queued lines to reach stderr.
const FLUSH_WAIT: Duration = Duration::from_secs(1);

/// Why logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    /// The writer thread could not be started.
    #[error("cannot start the log writer thread: {0}")]
    Spawn(#[source] io::Error),
    /// A global subscriber was already installed.
    #[error("cannot install the log subscriber: {0}")]
    Install(#[source] Box<dyn Error + Send + Sync + 'static>),
}

/// How logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Readable lines.
    Human,
    /// One JSON object per line.
    Json,
}

/// Changes the installed subscriber's filter (set once, by [`init`]).
type SetFilter = Box<dyn Fn(EnvFilter) -> Result<(), String> + Send + Sync>;

/// How [`set_level`] reaches the subscriber [`init`] installed; unset while `RUST_LOG` rules.
static SET_FILTER: OnceLock<SetFilter> = OnceLock::new();

/// Installs the global subscriber writing `format` to stderr through a [`LogWriter`]; the
/// level comes from `RUST_LOG`, else `info` until [`set_level`] applies the configured one.
///
/// Keep the guard alive until exit: dropping it flushes queued lines (with a bounded wait).
pub fn init(format: LogFormat) -> Result<LogGuard, LoggingError> {
    let (writer, guard) =
        LogWriter::spawn(io::stderr(), QUEUE_LINES).map_err(LoggingError::Spawn)?;
    // An empty `RUST_LOG` counts as unset, as it does for most programs.
    let from_env = std::env::var(EnvFilter::DEFAULT_ENV)
        .ok()
        .filter(|value| !value.trim().is_empty())
        .and_then(|value| EnvFilter::builder().parse(tidy(&value)).ok());
    let env_rules = from_env.is_some();
    let filter = from_env.unwrap_or_else(|| EnvFilter::new("info"));
    let installed = match format {
        LogFormat::Human => {
            let (subscriber, set_filter) = human_subscriber(writer, colours_wanted(), filter);
            subscriber.try_init().map(|()| set_filter)
        }
        LogFormat::Json => {
            let (subscriber, set_filter) = json_subscriber(writer, filter);
            subscriber.try_init().map(|()| set_filter)
        }
    };
    let set_filter = installed.map_err(|e| LoggingError::Install(e.into()))?;
    if !env_rules {
        // Only the first installation succeeds, so the handle is set at most once too.
        let _ = SET_FILTER.set(set_filter);
    }
    Ok(guard)
}

/// `directives` with each comma-separated directive trimmed: tracing-subscriber 0.3 slices a
/// directive at offsets into its trimmed copy, so a space after a comma shifts them (a target
/// cut short, or a panic inside a multi-byte character).
fn tidy(directives: &str) -> String {
    directives
        .split(',')
        .map(str::trim)
        .filter(|directive| !directive.is_empty())
        .collect::<Vec<_>>()
        .join(",")
}

/// Reads `server.log_level`: `RUST_LOG` syntax, directives separated by commas.
pub(crate) fn parse_level(directives: &str) -> Result<EnvFilter, String> {
    EnvFilter::builder()
        .parse(tidy(directives))
        .map_err(|e| format!("not a log filter ({e}); e.g. `info` or `antler=debug,warn`"))
}

/// Applies `server.log_level` to the running subscriber. Returns `false` when it does not
/// apply: `RUST_LOG` chose the level, or logging is off.
pub fn set_level(directives: &str) -> Result<bool, String> {
    let Some(set_filter) = SET_FILTER.get() else {
        return Ok(false);
    };
    set_filter(parse_level(directives)?)?;
    Ok(true)
}

/// Whether the human format may use colour: only on a terminal, and not under `NO_COLOR`.
fn colours_wanted() -> bool {
    io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// The human-readable subscriber: control characters escaped, colour only when `ansi`.
fn human_subscriber<W>(
    writer: W,
    ansi: bool,
    filter: EnvFilter,
) -> (impl tracing::Subscriber + Send + Sync + 'static, SetFilter)
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let (filter, handle) = reload::Layer::new(filter);
    let lines = tracing_subscriber::fmt::layer()
        .with_writer(writer)
        .with_ansi(ansi)
        // The default reports its own write failures with `eprintln!`, which panics on a
        // closed stderr; the writer below never fails anyway.
        .log_internal_errors(false)
        .fmt_fields(EscapedFields);
    let subscriber = tracing_subscriber::registry()
        .with(filter)
        .with(lines)
        .with(crate::telemetry::layer());
    (
        subscriber,
        Box::new(move |f| handle.reload(f).map_err(|e| e.to_string())),
    )
}

/// The JSON subscriber: one object per line, strings escaped by serde.
fn json_subscriber<W>(
    writer: W,
    filter: EnvFilter,
) -> (impl tracing::Subscriber + Send + Sync + 'static, SetFilter)
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let (filter, handle) = reload::Layer::new(filter);
    let lines = tracing_subscriber::fmt::layer()
        .with_writer(writer)
        .with_ansi(false)
        .log_internal_errors(false)
        .json();
    let subscriber = tracing_subscriber::registry()
        .with(filter)
        .with(lines)
        .with(crate::telemetry::layer());
    (
        subscriber,
        Box::new(move |f| handle.reload(f).map_err(|e| e.to_string())),
    )
}

// ---------------------------------------------------------------------------------------------
// The non-blocking writer
// ---------------------------------------------------------------------------------------------

enum Msg {
    Line(Vec<u8>),
    /// Answered once every line queued before it was written.
    Flush(SyncSender<()>),
}

/// A lossy, non-blocking writer: each write queues the bytes for the writer thread, or drops
/// them (counted) when the queue is full. Writes never block and never fail.
#[derive(Debug, Clone)]
pub struct LogWriter {
    queue: SyncSender<Msg>,
    dropped: Arc<AtomicU64>,
}

impl LogWriter {
    /// Starts the thread that writes queued lines to `sink` (errors ignored); at most
    /// `capacity` lines wait.
    pub fn spawn<S>(sink: S, capacity: usize) -> io::Result<(Self, LogGuard)>
    where
        S: Write + Send + 'static,
    {
        let (queue, lines) = mpsc::sync_channel(capacity.max(1));
        let dropped = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&dropped);
        std::thread::Builder::new()
            .name("antler-log-writer".to_owned())
            .spawn(move || drain(&lines, sink, &counter))?;
        let writer = Self {
            queue: queue.clone(),
            dropped: Arc::clone(&dropped),
        };
        Ok((writer, LogGuard { queue, dropped }))
    }

    /// Lines dropped so far (and not yet reported in the log).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    fn enqueue(&self, bytes: &[u8]) {
        match self.queue.try_send(Msg::Line(bytes.to_vec())) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl Write for &LogWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // The fmt layer hands over one whole formatted event per write, so one write is one
        // line: it is queued (or dropped) whole, never split.
        self.enqueue(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for LogWriter {
    type Writer = &'a LogWriter;

    fn make_writer(&'a self) -> Self::Writer {
        self
    }
}

/// Writes queued lines to `sink` until every sender is gone. Write errors are ignored: a log
/// line that cannot be written is lost, and the process goes on.
fn drain<S: Write>(lines: &Receiver<Msg>, mut sink: S, dropped: &AtomicU64) {
    loop {
        let msg = match lines.try_recv() {
            Ok(msg) => msg,
            Err(TryRecvError::Empty) => {
                // Caught up: a good moment to say what was lost, since this line fits.
                let lost = dropped.swap(0, Ordering::Relaxed);
                if lost > 0 {
                    tracing::warn!(
                        dropped_lines = lost,
                        "stderr did not keep up; log lines were dropped"
                    );
                }
                match lines.recv() {
                    Ok(msg) => msg,
                    Err(_) => return,
                }
            }
            Err(TryRecvError::Disconnected) => return,
        };
        match msg {
            Msg::Line(bytes) => {
                let _ = sink.write_all(&bytes);
            }
            Msg::Flush(done) => {
                let _ = sink.flush();
                let _ = done.try_send(());
            }
        }
    }
}

/// Keeps the log writer's queue reachable for flushing; flushes (bounded) when dropped.
#[derive(Debug)]
pub struct LogGuard {
    queue: SyncSender<Msg>,
    dropped: Arc<AtomicU64>,
}

impl LogGuard {
    /// Waits (at most a second) until the lines queued so far are written; returns whether
    /// they were. It never blocks longer, even when stderr is stuck.
    pub fn flush(&self) -> bool {
        self.flush_within(FLUSH_WAIT)
    }

    /// [`LogGuard::flush`] with a chosen wait.
    pub fn flush_within(&self, wait: Duration) -> bool {
        let (done, flushed) = mpsc::sync_channel(1);
        if self.queue.try_send(Msg::Flush(done)).is_err() {
            return false;
        }
        match flushed.recv_timeout(wait) {
            Ok(()) => true,
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => false,
        }
    }

    /// Lines dropped so far (and not yet reported in the log).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

impl Drop for LogGuard {
    fn drop(&mut self) {
        self.flush();
    }
}

// ---------------------------------------------------------------------------------------------
// Escaping
// ---------------------------------------------------------------------------------------------

/// Appends `c` to `out`, spelled out (`\n`, `\x1b`, `\u{202e}`) when it could break a line,
/// drive a terminal or reorder text; other characters as they are.
pub fn push_escaped(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        // C0 controls (ESC, BEL, BS, ...) and DEL.
        '\0'..='\x1f' | '\x7f' => {
            let _ = write!(out, "\\x{:02x}", u32::from(c));
        }
        // C1 controls (a one-character CSI among them), Unicode line and paragraph
        // separators, and bidirectional overrides.
        '\u{80}'..='\u{9f}'
        | '\u{2028}'
        | '\u{2029}'
        | '\u{202a}'..='\u{202e}'
        | '\u{2066}'..='\u{2069}' => {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        }
        c => out.push(c),
    }
}

/// `text` with every control character escaped (see [`push_escaped`]): always one line.
pub fn escape_line(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        push_escaped(&mut out, c);
    }
    out
}

/// `text` made safe to print on a terminal: control characters and escape sequences are
/// escaped (see [`push_escaped`]), newlines and tabs kept. Character by character, so a
/// sequence split across two pieces is neutralised as well.
pub fn sanitize_for_terminal(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\n' | '\t' => out.push(c),
            c => push_escaped(&mut out, c),
        }
    }
    out
}

/// An error and its causes as one message, `outer: cause: root`, leaving out every cause
/// whose text the message already holds (many errors repeat their source in `Display`).
pub fn error_message(error: &(dyn Error + 'static)) -> String {
    let mut message = error.to_string();
    let mut cause = error.source();
    while let Some(current) = cause {
        let text = current.to_string();
        if !text.is_empty() && !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        cause = current.source();
    }
    message
}

/// The human format's field formatter: like the default (`message` bare, others
/// `name=value`), with control characters in every value escaped.
#[derive(Debug, Clone, Copy, Default)]
pub struct EscapedFields;

impl<'w> MakeVisitor<Writer<'w>> for EscapedFields {
    type Visitor = EscapedVisitor<'w>;

    fn make_visitor(&self, target: Writer<'w>) -> Self::Visitor {
        EscapedVisitor {
            writer: target,
            empty: true,
            result: Ok(()),
        }
    }
}

/// Writes visited fields for [`EscapedFields`].
#[derive(Debug)]
pub struct EscapedVisitor<'w> {
    writer: Writer<'w>,
    empty: bool,
    result: fmt::Result,
}

impl EscapedVisitor<'_> {
    fn write_field(&mut self, field: &Field, value: &str) {
        let name = field.name();
        // `log.*` fields are metadata of events bridged from the `log` crate, shown elsewhere.
        if self.result.is_err() || name.starts_with("log.") {
            return;
        }
        let value = escape_line(value);
        let separator = if self.empty { "" } else { " " };
        self.empty = false;
        self.result = if name == "message" {
            write!(self.writer, "{separator}{value}")
        } else {
            let name = name.strip_prefix("r#").unwrap_or(name);
            write!(self.writer, "{separator}{name}={value}")
        };
    }
}

impl Visit for EscapedVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.write_field(field, value);
        } else {
            self.write_field(field, &format!("{value:?}"));
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn Error + 'static)) {
        self.write_field(field, &error_message(value));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.write_field(field, &format!("{value:?}"));
    }
}

impl VisitOutput<fmt::Result> for EscapedVisitor<'_> {
    fn finish(self) -> fmt::Result {
        self.result
    }
}

impl VisitFmt for EscapedVisitor<'_> {
    fn writer(&mut self) -> &mut dyn fmt::Write {
        &mut self.writer
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use super::*;

    /// A sink collecting everything written, shared with the test.
    #[derive(Clone, Default)]
    struct Collect(Arc<Mutex<Vec<u8>>>);

    impl Collect {
        fn text(&self) -> String {
            String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
        }
    }

    impl Write for Collect {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Collect {
        type Writer = Collect;

        fn make_writer(&'a self) -> Self::Writer {
            self.clone()
        }
    }

    /// A sink that blocks every write until the test drops the other end.
    struct Stuck(mpsc::Receiver<()>);

    impl Write for Stuck {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let _ = self.0.recv();
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// A sink whose every write fails like a closed pipe, counting the attempts.
    #[derive(Clone, Default)]
    struct Broken(Arc<Mutex<usize>>);

    impl Write for Broken {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            *self.0.lock().unwrap() += 1;
            Err(io::Error::from(io::ErrorKind::BrokenPipe))
        }

        fn flush(&mut self) -> io::Result<()> {
            Err(io::Error::from(io::ErrorKind::BrokenPipe))
        }
    }

    fn human_line(event: impl FnOnce()) -> String {
        let out = Collect::default();
        let (subscriber, _) = human_subscriber(out.clone(), false, EnvFilter::new("trace"));
        tracing::subscriber::with_default(subscriber, event);
        out.text()
    }

    #[test]
    fn a_new_level_applies_to_the_running_subscriber() {
        let out = Collect::default();
        let (subscriber, set_filter) = json_subscriber(out.clone(), EnvFilter::new("info"));
        tracing::subscriber::with_default(subscriber, || {
            tracing::debug!("hidden at info");
            set_filter(parse_level("warn,antler=debug").unwrap()).unwrap();
            tracing::debug!(target: "antler::ingress", "shown at debug");
            tracing::info!(target: "sled", "hidden at warn");
        });
        let text = out.text();
        assert!(!text.contains("hidden"), "{text}");
        assert!(text.contains("shown at debug"), "{text}");
    }

    #[test]
    fn a_bad_level_is_refused_with_an_example() {
        let problem = parse_level("antler=loud").unwrap_err();
        assert!(problem.contains("e.g. `info`"), "{problem}");
        assert!(parse_level("info").is_ok());
    }

    /// Found by the `config` fuzz target: tracing-subscriber sliced ` e◐=info` (after a comma)
    /// at offsets into its trimmed copy and panicked inside the `◐`.
    #[test]
    fn spaces_after_commas_neither_cut_a_target_nor_panic() {
        let filter = parse_level("warn, antler=debug").unwrap();
        assert_eq!(filter.to_string(), "antler=debug,warn");
        assert!(parse_level("info, e_:-◐=warn").is_ok());
    }

    #[test]
    fn field_values_and_messages_cannot_forge_lines_or_drive_the_terminal() {
        let evil = "a\nFAKE line \x1b[2J";
        let text = human_line(|| {
            tracing::warn!(reason = %evil, quoted = evil, "got {}", evil);
        });
        assert_eq!(text.matches('\n').count(), 1, "one line: {text:?}");
        assert!(text.ends_with('\n'), "{text:?}");
        assert!(!text.contains('\x1b'), "{text:?}");
        assert!(!text.contains('\r'), "{text:?}");
        // The message, a Display field and a string field, each escaped visibly.
        assert!(text.contains("got a\\nFAKE line \\x1b[2J"), "{text:?}");
        assert!(text.contains("reason=a\\nFAKE line \\x1b[2J"), "{text:?}");
        assert!(
            text.contains("quoted=\"a\\nFAKE line \\u{1b}[2J\""),
            "{text:?}"
        );
    }

    #[test]
    fn span_fields_are_escaped_too() {
        let text = human_line(|| {
            let span = tracing::info_span!("turn", user = %"eve\r\nINFO forged");
            let _entered = span.enter();
            tracing::info!("inside");
        });
        assert_eq!(text.matches('\n').count(), 1, "{text:?}");
        assert!(text.contains("user=eve\\r\\nINFO forged"), "{text:?}");
    }

    #[test]
    fn errors_show_their_causes_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("cannot read config: {0}")]
        struct Outer(#[source] io::Error);
        #[derive(Debug, thiserror::Error)]
        #[error("starting failed")]
        struct Top(#[source] Outer);

        let error = Top(Outer(io::Error::other("no such file")));
        assert_eq!(
            error_message(&error),
            "starting failed: cannot read config: no such file"
        );
        let text = human_line(|| {
            let error: &(dyn Error + 'static) = &error;
            tracing::error!(error, "boom");
        });
        assert_eq!(text.matches("no such file").count(), 1, "{text:?}");
    }

    #[test]
    fn terminal_text_keeps_newlines_and_tabs_and_nothing_else() {
        let text = "line\n\tindented \x1b[2J\x07 bell \u{9b}31m csi \r over \u{202e}rev";
        let clean = sanitize_for_terminal(text);
        assert_eq!(
            clean,
            "line\n\tindented \\x1b[2J\\x07 bell \\u{9b}31m csi \\r over \\u{202e}rev"
        );
        // A sequence split across two pieces stays neutral: ESC is escaped on its own.
        let joined = sanitize_for_terminal("red \x1b") + &sanitize_for_terminal("[31m!");
        assert!(!joined.contains('\x1b'), "{joined:?}");
        assert_eq!(joined, "red \\x1b[31m!");
        assert_eq!(sanitize_for_terminal("plain ünïcode ✓"), "plain ünïcode ✓");
    }

    #[test]
    fn lines_reach_the_sink_in_order_and_flush_waits_for_them() {
        let out = Collect::default();
        let (writer, guard) = LogWriter::spawn(out.clone(), 64).unwrap();
        for i in 0..10 {
            (&writer)
                .write_all(format!("line {i}\n").as_bytes())
                .unwrap();
        }
        assert!(guard.flush_within(Duration::from_secs(30)), "flushed");
        let expected: String = (0..10).map(|i| format!("line {i}\n")).collect();
        assert_eq!(out.text(), expected);
        assert_eq!(guard.dropped(), 0);
    }

    #[test]
    fn a_stuck_sink_never_blocks_the_caller_and_drops_are_counted() {
        let (release, wait) = mpsc::channel::<()>();
        let (writer, guard) = LogWriter::spawn(Stuck(wait), 4).unwrap();
        // The writer thread takes at most one line and blocks on it; four more fill the
        // queue; every other write must return at once, dropped and counted.
        let writes = std::thread::spawn(move || {
            for i in 0..100 {
                (&writer)
                    .write_all(format!("line {i}\n").as_bytes())
                    .unwrap();
            }
            writer
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        while !writes.is_finished() {
            assert!(Instant::now() < deadline, "writes blocked on a stuck sink");
            std::thread::sleep(Duration::from_millis(10));
        }
        let writer = writes.join().unwrap();
        assert!(writer.dropped() >= 95, "dropped {}", writer.dropped());
        // Flushing gives up rather than hang on the stuck sink.
        assert!(!guard.flush_within(Duration::from_millis(50)));
        drop(release);
    }

    #[test]
    fn write_errors_are_ignored_and_the_writer_thread_goes_on() {
        let sink = Broken::default();
        let (writer, guard) = LogWriter::spawn(sink.clone(), 64).unwrap();
        for i in 0..5 {
            (&writer)
                .write_all(format!("line {i}\n").as_bytes())
                .unwrap();
        }
        assert!(guard.flush_within(Duration::from_secs(30)), "still alive");
        assert_eq!(*sink.0.lock().unwrap(), 5, "every line was attempted");
        (&writer).write_all(b"later\n").unwrap();
        assert!(guard.flush_within(Duration::from_secs(30)), "still alive");
        assert_eq!(*sink.0.lock().unwrap(), 6);
    }
}

//! Logging through `tracing`: readable text in a terminal, JSON for log shippers. The filter
//! comes from `RUST_LOG` (default `info`).
//!
//! Logged values come from outside too (an event's type, an endpoint's answer, a request's
//! path): in the text format every field is written with its control characters escaped, so a
//! value holding `\n2026-… ERROR …` cannot start a forged line of its own. The JSON format
//! escapes them as JSON does.
//!
//! Traces ([`traces`]) are OpenTelemetry spans exported over OTLP/HTTP ([`export`]), made
//! apart from the logs.

pub mod export;
pub mod traces;

pub use traces::Traces;

use std::fmt::{self, Write as _};
use std::io::IsTerminal as _;

use tracing::field::{Field, Visit};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::format::{FmtSpan, Writer};

use crate::config::LogFormat;

/// Install the global subscriber once; later calls (tests) are no-ops.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,actix_server=warn,actix_web=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_span_events(FmtSpan::NONE)
        // Colour codes only for a terminal: log files and shippers get plain text.
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().with_current_span(true).try_init(),
        LogFormat::Text => builder.fmt_fields(EscapedFields).try_init(),
    };
}

/// The text format's fields (`message name=value …`, as the default writes them) with every
/// control character escaped, Rust style (`\n`, `\r`, `\u{1b}`).
pub struct EscapedFields;

impl<'w> FormatFields<'w> for EscapedFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'w>, fields: R) -> fmt::Result {
        let mut visitor = Fields {
            out: Escaping(writer),
            first: true,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct Fields<'w> {
    out: Escaping<'w>,
    first: bool,
    result: fmt::Result,
}

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if self.result.is_err() {
            return;
        }
        let name = field.name();
        // Records bridged from the `log` crate carry their origin as `log.*` fields, which
        // the default formatter leaves out as well.
        if name.starts_with("log.") {
            return;
        }
        let gap = if self.first { "" } else { " " };
        self.first = false;
        self.result = if name == "message" {
            write!(self.out, "{gap}{value:?}")
        } else {
            write!(self.out, "{gap}{name}={value:?}")
        };
    }
}

/// A writer that escapes control characters as they pass.
struct Escaping<'w>(Writer<'w>);

impl fmt::Write for Escaping<'_> {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        let mut rest = text;
        while let Some(at) = rest.find(char::is_control) {
            self.0.write_str(&rest[..at])?;
            let c = rest[at..].chars().next().expect("found at a char boundary");
            write!(self.0, "{}", c.escape_default())?;
            rest = &rest[at + c.len_utf8()..];
        }
        self.0.write_str(rest)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::fmt::MakeWriter;

    use super::EscapedFields;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Buffer {
        type Writer = Buffer;
        fn make_writer(&'a self) -> Buffer {
            self.clone()
        }
    }

    const FORGED: &str = "a.b\n2026-12-05T23:00:00Z ERROR webhook_inbox::auth: forged\r\n\u{1b}[2K";

    /// Each kind of field (Display, Debug, a plain string, the message itself, a span's
    /// field) keeps an outside value on its event's line.
    #[test]
    fn text_fields_escape_control_characters_wherever_they_are() {
        let buffer = Buffer::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(buffer.clone())
            .with_ansi(false)
            .fmt_fields(EscapedFields)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("request", path = %FORGED);
            let _entered = span.enter();
            tracing::info!(event_type = %FORGED, answer = ?FORGED, raw = FORGED, n = 3, "event received");
            tracing::warn!("answered {FORGED}");
        });
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(!text.contains('\u{1b}') && !text.contains('\r'), "{text:?}");
        let first = text.lines().next().unwrap();
        assert!(
            first.contains(r"event_type=a.b\n2026-12-05T23:00:00Z ERROR"),
            "{first}"
        );
        assert!(first.contains(r#"answer="a.b\n2026"#), "{first}");
        assert!(first.contains(r"request{path=a.b\n2026"), "{first}");
        assert!(
            first.contains("n=3") && first.contains("event received"),
            "{first}"
        );
        assert!(text.contains(r"answered a.b\n2026"), "{text}");
        assert!(text.contains(r"\u{1b}[2K"), "{text}");
    }
}

//! A global tracing subscriber for tests that check what the library logs: every span (with its
//! fields and parent) and every event (with its fields and the spans entered on its thread) is
//! kept as one text line. Install it once per test binary with [`install`].

use std::cell::RefCell;
use std::fmt::{self, Write as _};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

static LINES: Mutex<Vec<String>> = Mutex::new(Vec::new());

thread_local! {
    /// The spans entered on this thread, innermost last.
    static ENTERED: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

struct Capture {
    next: AtomicU64,
}

struct Fields<'a>(&'a mut String);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn fmt::Debug) {
        let _ = write!(self.0, " {}={value:?}", field.name());
    }
}

fn push(line: String) {
    LINES
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(line);
}

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let parent = match span.parent() {
            Some(parent) => Some(parent.into_u64()),
            None if span.is_contextual() => ENTERED.with_borrow(|entered| entered.last().copied()),
            None => None,
        };
        let mut line = format!("span {id} {}: parent={parent:?}", span.metadata().name());
        span.record(&mut Fields(&mut line));
        push(line);
        tracing::span::Id::from_u64(id)
    }

    fn record(&self, span: &tracing::span::Id, values: &tracing::span::Record<'_>) {
        let mut line = format!("record {}:", span.into_u64());
        values.record(&mut Fields(&mut line));
        push(line);
    }

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        let meta = event.metadata();
        let mut line = format!("{} {}:", meta.level(), meta.target());
        event.record(&mut Fields(&mut line));
        let inside = ENTERED.with_borrow(|entered| entered.clone());
        let _ = write!(line, " in {inside:?}");
        push(line);
    }

    fn enter(&self, span: &tracing::span::Id) {
        ENTERED.with_borrow_mut(|entered| entered.push(span.into_u64()));
    }

    fn exit(&self, span: &tracing::span::Id) {
        ENTERED.with_borrow_mut(|entered| {
            if let Some(at) = entered.iter().rposition(|id| *id == span.into_u64()) {
                entered.remove(at);
            }
        });
    }
}

/// Installs the capturing subscriber as the process's global one (once; later calls do nothing).
///
/// # Panics
/// When another global subscriber was installed first.
pub fn install() {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        tracing::subscriber::set_global_default(Capture {
            next: AtomicU64::new(1),
        })
        .unwrap_or_else(|_| panic!("another global tracing subscriber is installed"));
    });
}

/// Every line captured so far.
pub fn lines() -> Vec<String> {
    LINES.lock().unwrap_or_else(PoisonError::into_inner).clone()
}

/// Every line captured so far, as one text.
pub fn text() -> String {
    lines().join("\n")
}

/// The line of the first span named `name` whose fields contain `needle`, and its id.
///
/// # Panics
/// When there is none.
pub fn span(name: &str, needle: &str) -> (u64, String) {
    let head = format!(" {name}: ");
    lines()
        .into_iter()
        .find(|l| l.starts_with("span ") && l.contains(&head) && l.contains(needle))
        .and_then(|l| Some((l.split(' ').nth(1)?.parse().ok()?, l)))
        .unwrap_or_else(|| panic!("no {name} span with {needle}: {:#?}", lines()))
}

/// The events recorded while span `id` was entered on their thread.
pub fn events_in(id: u64) -> Vec<String> {
    lines()
        .into_iter()
        .filter(|l| !l.starts_with("span ") && !l.starts_with("record "))
        .filter(|l| {
            l.rsplit_once(" in [").is_some_and(|(_, ids)| {
                ids.trim_end_matches(']')
                    .split(", ")
                    .any(|i| i.parse() == Ok(id))
            })
        })
        .collect()
}

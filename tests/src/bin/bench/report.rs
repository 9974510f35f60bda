//! Where results go: the tables (stdout, or stderr with `--json`), the summary line, and the
//! figures behind them by name for `--json`.

use std::fmt;

/// The output of a run, filled in by the sections.
#[derive(Debug)]
pub(crate) struct Report {
    /// Whether the tables go to stderr (`--json`).
    json: bool,
    /// Table lines written since the last [`Report::flush`].
    out: String,
    /// Parts of the summary line, in the order measured.
    summary: Vec<String>,
    /// The figures behind the tables, by name, in the order measured.
    figures: Vec<(String, f64)>,
}

impl Report {
    pub(crate) fn new(json: bool) -> Report {
        Report {
            json,
            out: String::new(),
            summary: Vec::new(),
            figures: Vec::new(),
        }
    }

    /// Records a figure for `--json`.
    pub(crate) fn figure(&mut self, name: impl Into<String>, value: f64) {
        self.figures.push((name.into(), value));
    }

    /// Adds a part to the summary line.
    pub(crate) fn summary(&mut self, part: String) {
        self.summary.push(part);
    }

    pub(crate) fn summary_line(&self) -> String {
        self.summary.join("; ")
    }

    /// Prints the table lines written so far.
    pub(crate) fn flush(&mut self) {
        if self.json {
            eprint!("{}", self.out);
        } else {
            print!("{}", self.out);
        }
        self.out.clear();
    }

    /// `{"figures": {...}}`: names are plain ASCII, numbers never use an exponent in Rust's
    /// `Display`, and a figure that was not measured (NaN) is `null`.
    pub(crate) fn figures_json(&self) -> String {
        let fields: Vec<String> = self
            .figures
            .iter()
            .map(|(name, value)| {
                if value.is_finite() {
                    format!("\"{name}\": {value}")
                } else {
                    format!("\"{name}\": null")
                }
            })
            .collect();
        format!("{{\"figures\": {{{}}}}}", fields.join(", "))
    }
}

/// Table lines: `writeln!(report, ...)`.
impl fmt::Write for Report {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.out.push_str(s);
        Ok(())
    }
}

//! Human output: durations such as `4.2s`, owners, and tables whose columns line up.

use std::time::Duration;

use lock_runtime::Owner;

/// `850ms`, `4.2s`, `2m05s`, `1h02m`; `-` for no value (not held, or no expiry).
pub(crate) fn duration(d: Option<Duration>) -> String {
    let Some(d) = d else {
        return "-".to_owned();
    };
    let (ms, s) = (d.as_millis(), d.as_secs());
    if ms < 1000 {
        format!("{ms}ms")
    } else if s < 60 {
        format!("{:.1}s", d.as_secs_f64())
    } else if s < 3600 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{}h{:02}m", s / 3600, s / 60 % 60)
    }
}

/// A number or `-`.
pub(crate) fn token(t: Option<u64>) -> String {
    t.map_or_else(|| "-".to_owned(), |t| t.to_string())
}

/// Rows under a header, each column as wide as its widest cell, two spaces apart; the last
/// column is not padded.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let header: Vec<String> = header.iter().map(|h| (*h).to_owned()).collect();
    let mut out = String::new();
    for row in std::iter::once(&header).chain(rows) {
        let last = row.len().saturating_sub(1);
        for (i, (cell, width)) in row.iter().zip(&widths).enumerate() {
            if i == last {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<width$}  "));
            }
        }
        out.push('\n');
    }
    out
}

/// Milliseconds for JSON (`null` for none).
pub(crate) fn millis(d: Option<Duration>) -> Option<u64> {
    d.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// One node's view of a lock, in `inspect`'s node table and in the JSON `nodes` lists.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NodeView<'a> {
    pub(crate) node: &'a str,
    pub(crate) held: bool,
    pub(crate) remaining: Option<Duration>,
    pub(crate) fencing_token: Option<u64>,
}

/// The columns of [`NodeView::row`].
pub(crate) const NODE_HEADER: [&str; 4] = ["NODE", "HELD", "REMAINING", "FENCE"];

impl NodeView<'_> {
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "node": self.node,
            "held": self.held,
            "remaining_ms": millis(self.remaining),
            "fencing_token": self.fencing_token,
        })
    }

    /// A table row under [`NODE_HEADER`].
    pub(crate) fn row(&self) -> Vec<String> {
        vec![
            self.node.to_owned(),
            if self.held { "yes" } else { "no" }.to_owned(),
            node_cell(self.held, self.remaining),
            token(self.fencing_token),
        ]
    }
}

/// One node's view of a lock, as a table cell: its remaining time, `held` when the key has no
/// expiry, `-` when the node does not hold it.
pub(crate) fn node_cell(held: bool, remaining: Option<Duration>) -> String {
    match (held, remaining) {
        (false, _) => "-".to_owned(),
        (true, None) => "held".to_owned(),
        (true, remaining) => duration(remaining),
    }
}

/// Who holds a lock, in one line: the owner name, then its process and since when.
pub(crate) fn owner(o: &Owner) -> String {
    let since = o.since.map_or_else(
        || "?".to_owned(),
        |t| humantime::format_rfc3339_seconds(t).to_string(),
    );
    format!(
        "{} (pid {} on {}, {}, since {since})",
        o.name, o.pid, o.host, o.program
    )
}

/// The owners of a lock as a table cell: the first one's name, and how many more.
pub(crate) fn owners_cell(owners: &[Owner]) -> String {
    match owners {
        [] => "-".to_owned(),
        [only] => only.name.clone(),
        [first, rest @ ..] => format!("{} +{}", first.name, rest.len()),
    }
}

/// The owners of a lock in JSON (`since_ms`: milliseconds since the Unix epoch).
pub(crate) fn owners_json(owners: &[Owner]) -> serde_json::Value {
    owners
        .iter()
        .map(|o| {
            serde_json::json!({
                "name": o.name,
                "host": o.host,
                "pid": o.pid,
                "program": o.program,
                "since_ms": o.since.and_then(|t| {
                    let ms = t.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis();
                    u64::try_from(ms).ok()
                }),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(duration(None), "-");
        assert_eq!(duration(Some(Duration::from_millis(850))), "850ms");
        assert_eq!(duration(Some(Duration::from_millis(4_200))), "4.2s");
        assert_eq!(duration(Some(Duration::from_secs(125))), "2m05s");
        assert_eq!(duration(Some(Duration::from_secs(3_720))), "1h02m");
    }

    #[test]
    fn columns_line_up() {
        let rows = vec![
            vec!["wallet:42".to_owned(), "4.2s".to_owned(), "7".to_owned()],
            vec!["a".to_owned(), "850ms".to_owned(), "-".to_owned()],
        ];
        let text = table(&["KEY", "REMAINING", "FENCE"], &rows);
        assert_eq!(
            text,
            "KEY        REMAINING  FENCE\nwallet:42  4.2s       7\na          850ms      -\n"
        );
    }
}

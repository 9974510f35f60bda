//! Human output: durations such as `4.2s`, and tables whose columns line up.

use std::time::Duration;

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

/// One node's view of a lock, for JSON.
pub(crate) fn node_json(
    node: &str,
    held: bool,
    remaining: Option<Duration>,
    fencing_token: Option<u64>,
) -> serde_json::Value {
    serde_json::json!({
        "node": node,
        "held": held,
        "remaining_ms": millis(remaining),
        "fencing_token": fencing_token,
    })
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

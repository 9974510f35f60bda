//! The fault table (`lock-runtime/FAULTS.md`): every row names tests as `file.rs::name`, and each
//! must exist.

#![allow(clippy::unwrap_used, clippy::expect_used)]

/// Every row of `lock-runtime/FAULTS.md` names tests as `file.rs::name`; each must exist.
#[test]
fn fault_table_names_only_existing_tests() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let table = std::fs::read_to_string(root.join("../lock-runtime/FAULTS.md"))
        .expect("lock-runtime/FAULTS.md");
    let mut rows = 0;
    let mut missing = Vec::new();
    for line in table.lines().filter(|l| l.starts_with('|')) {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        if cells.len() != 3 || cells[0] == "fault" || cells[0].starts_with("---") {
            continue;
        }
        rows += 1;
        let named: Vec<&str> = cells[2]
            .split(|c: char| c.is_whitespace() || c == ',' || c == '`')
            .filter(|s| s.contains(".rs::"))
            .collect();
        assert!(!named.is_empty(), "row without a test: {line}");
        for test in named {
            let (file, name) = test.split_once("::").unwrap();
            let source = std::fs::read_to_string(root.join("tests").join(file))
                .unwrap_or_else(|e| panic!("{test}: {file}: {e}"));
            let defined = source.lines().any(|l| {
                let l = l.trim_start();
                ["fn ", "async fn ", "pub(crate) async fn ", "pub(crate) fn "]
                    .iter()
                    .any(|p| {
                        l.strip_prefix(p)
                            .and_then(|rest| rest.strip_prefix(name))
                            .is_some_and(|rest| rest.starts_with('(') || rest.starts_with('<'))
                    })
            });
            if !defined {
                missing.push(test.to_owned());
            }
        }
    }
    assert!(rows >= 20, "only {rows} rows in the fault table");
    assert!(
        missing.is_empty(),
        "the fault table names missing tests: {missing:?}"
    );
}

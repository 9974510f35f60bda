//! Glob patterns: matching lock names (`*` and `?`, `lock_rules::name_matches`, which the test
//! faults of `lock-runtime` match too), and escaping a literal for Redis's own `MATCH` /
//! `PSUBSCRIBE` patterns.

pub(crate) use lock_rules::name_matches as matches;

/// `literal` as a Redis glob that matches only itself.
pub(crate) fn escape_redis(literal: &str) -> String {
    let mut out = String::with_capacity(literal.len());
    for c in literal.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_escape() {
        assert_eq!(escape_redis("lock:"), "lock:");
        assert_eq!(escape_redis("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}

//! Glob patterns: matching lock names (`*` and `?`), and escaping a literal for Redis's own
//! `MATCH` / `PSUBSCRIBE` patterns.

/// Whether `name` matches `pattern`, where `*` matches any run of characters (also none) and `?`
/// exactly one; every other character matches itself.
pub(crate) fn matches(pattern: &str, name: &str) -> bool {
    let (pattern, name): (Vec<char>, Vec<char>) =
        (pattern.chars().collect(), name.chars().collect());
    let (mut p, mut n) = (0, 0);
    // Where the last `*` was, and the name position it currently swallows up to.
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        match pattern.get(p) {
            Some('*') => {
                star = Some((p, n));
                p += 1;
            }
            Some(&c) if c == '?' || c == name[n] => {
                p += 1;
                n += 1;
            }
            _ => match star {
                Some((sp, sn)) => {
                    p = sp + 1;
                    n = sn + 1;
                    star = Some((sp, sn + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == '*')
}

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
    fn star_and_question_mark() {
        assert!(matches("*", ""));
        assert!(matches("*", "wallet:42"));
        assert!(matches("wallet:*", "wallet:42"));
        assert!(matches("wallet:?2", "wallet:42"));
        assert!(matches("*:42", "wallet:42"));
        assert!(matches("w*t:*2", "wallet:42"));
        assert!(matches("a*b*c", "aXbYbZc"));
        assert!(!matches("wallet:?", "wallet:42"));
        assert!(!matches("wallet:*", "order:1"));
        assert!(!matches("a*b", "aXc"));
        assert!(!matches("", "a"));
    }

    #[test]
    fn braces_and_percent_are_plain_characters() {
        assert!(matches("{user:7}*", "{user:7}=a"));
        assert!(matches("50%", "50%"));
    }

    #[test]
    fn redis_escape() {
        assert_eq!(escape_redis("lock:"), "lock:");
        assert_eq!(escape_redis("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}

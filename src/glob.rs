//! Redis's glob patterns, as `CONFIG GET` and ACL key patterns use them.

/// Redis's glob matching (`*`, `?`, `[...]` with ranges and `^`, `\` escapes).
pub fn matches(pat: &[u8], s: &[u8]) -> bool {
    match pat.split_first() {
        None => s.is_empty(),
        Some((b'*', rest)) => (0..=s.len()).any(|i| matches(rest, &s[i..])),
        Some((b'?', rest)) => !s.is_empty() && matches(rest, &s[1..]),
        Some((b'[', rest)) => {
            let Some((&c, s_rest)) = s.split_first() else {
                return false;
            };
            let (negate, mut body) = match rest.split_first() {
                Some((b'^', b)) => (true, b),
                _ => (false, rest),
            };
            let mut matched = false;
            loop {
                match body {
                    [] => return false,
                    [b']', after @ ..] => {
                        body = after;
                        break;
                    }
                    [b'\\', x, after @ ..] => {
                        matched |= *x == c;
                        body = after;
                    }
                    [lo, b'-', hi, after @ ..] if *hi != b']' => {
                        let (lo, hi) = if lo <= hi { (*lo, *hi) } else { (*hi, *lo) };
                        matched |= lo <= c && c <= hi;
                        body = after;
                    }
                    [x, after @ ..] => {
                        matched |= *x == c;
                        body = after;
                    }
                }
            }
            matched != negate && matches(body, s_rest)
        }
        Some((b'\\', [x, rest @ ..])) => s.first() == Some(x) && matches(rest, &s[1..]),
        Some((x, rest)) => s.first() == Some(x) && matches(rest, &s[1..]),
    }
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn globs() {
        assert!(matches(b"*", b"port"));
        assert!(matches(b"p?rt", b"port"));
        assert!(matches(b"max*", b"maxclients"));
        assert!(matches(b"[ps]ort", b"sort"));
        assert!(!matches(b"[^ps]ort", b"sort"));
        assert!(matches(b"[a-z]ort", b"port"));
        assert!(!matches(b"port", b"ports"));
        assert!(matches(b"a\\*", b"a*"));
        assert!(matches(b"team-a-*", b"team-a-x"));
        assert!(!matches(b"team-a-*", b"team-b-x"));
    }
}

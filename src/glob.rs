//! Redis's glob patterns, as `CONFIG GET` and ACL key patterns use them.
//!
//! Patterns come from clients (ACL `~patterns` are matched against every namespace a command
//! names), so matching must stay cheap whatever the pattern: a recursive matcher that tries
//! every split at each `*` takes exponential time on `*?*?*?...!` (Redis's CVE-2022-36021).
//! Every token but `*` matches exactly one byte, so when the tokens after a `*` fail, only the
//! last `*` needs to take one byte more: earlier ones could only shift where the later part
//! starts, and the last `*` already covers those positions. That bounds the work to
//! O(pattern × text), with no recursion.

/// Whether `s` matches `pat`: `*` (any run), `?` (any byte), `[...]` (a set, with `a-z` ranges,
/// `^` first to negate and `\` to escape), `\x` (`x` itself). Bytes compare exactly (callers
/// lowercase what is case-insensitive). A `[` with no closing `]` matches nothing.
pub fn matches(pat: &[u8], s: &[u8]) -> bool {
    let (mut p, mut i) = (0, 0);
    // Where the pattern resumes after the last `*` seen, and where in `s` that `*` ends.
    let mut star: Option<(usize, usize)> = None;
    loop {
        if pat.get(p) == Some(&b'*') {
            p += 1;
            star = Some((p, i));
            continue;
        }
        if i == s.len() {
            return p == pat.len();
        }
        match one(&pat[p..], s[i]) {
            None => return false,
            Some((true, len)) => {
                p += len;
                i += 1;
                continue;
            }
            Some((false, _)) => {}
        }
        // A mismatch: the last `*` takes one more byte, and the rest starts again after it.
        match star {
            Some((after, end)) if end < s.len() => {
                star = Some((after, end + 1));
                p = after;
                i = end + 1;
            }
            _ => return false,
        }
    }
}

/// Matches the token that starts `pat` (not `*`) against `c`: whether it matches, and the
/// token's length. An empty `pat` matches no byte; `None` for an unclosed `[`.
fn one(pat: &[u8], c: u8) -> Option<(bool, usize)> {
    match pat {
        [b'?', ..] => Some((true, 1)),
        [b'[', set @ ..] => in_set(set, c).map(|(hit, len)| (hit, len + 1)),
        [b'\\', x, ..] => Some((*x == c, 2)),
        // A `\` that ends the pattern stands for itself.
        [x, ..] => Some((*x == c, 1)),
        [] => Some((false, 0)),
    }
}

/// Matches the body of a `[...]` set (what follows the `[`) against `c`: whether `c` is in it,
/// and the body's length through its `]`. `None` when no `]` closes it.
fn in_set(set: &[u8], c: u8) -> Option<(bool, usize)> {
    let (negate, mut body) = match set.split_first() {
        Some((b'^', b)) => (true, b),
        _ => (false, set),
    };
    let mut hit = false;
    loop {
        match body {
            [] => return None,
            [b']', ..] => break,
            [b'\\', x, after @ ..] => {
                hit |= *x == c;
                body = after;
            }
            [lo, b'-', hi, after @ ..] if *hi != b']' => {
                let (lo, hi) = if lo <= hi { (*lo, *hi) } else { (*hi, *lo) };
                hit |= lo <= c && c <= hi;
                body = after;
            }
            [x, after @ ..] => {
                hit |= *x == c;
                body = after;
            }
        }
    }
    Some((hit != negate, set.len() - body.len() + 1))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::matches;

    /// The recursive matcher `matches` replaced: exponential on some patterns, but plainly
    /// right, so it stays here as the reference.
    fn reference(pat: &[u8], s: &[u8]) -> bool {
        match pat.split_first() {
            None => s.is_empty(),
            Some((b'*', rest)) => (0..=s.len()).any(|i| reference(rest, &s[i..])),
            Some((b'?', rest)) => !s.is_empty() && reference(rest, &s[1..]),
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
                matched != negate && reference(body, s_rest)
            }
            Some((b'\\', [x, rest @ ..])) => s.first() == Some(x) && reference(rest, &s[1..]),
            Some((x, rest)) => s.first() == Some(x) && reference(rest, &s[1..]),
        }
    }

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

    #[test]
    fn edge_cases_keep_their_old_meaning() {
        assert!(matches(b"", b"") && !matches(b"", b"a"));
        assert!(matches(b"**", b"") && matches(b"a*", b"a"));
        assert!(matches(b"[z-a]", b"m"), "a reversed range is swapped");
        assert!(matches(b"[a-]", b"-"), "a `-` before `]` is itself");
        assert!(matches(b"[\\]]", b"]") && matches(b"[^\\]]", b"x"));
        assert!(matches(b"a\\", b"a\\"), "a trailing `\\` is itself");
        assert!(!matches(b"*[ab", b"xa"), "an unclosed `[` matches nothing");
        assert!(!matches(b"Port", b"port"), "bytes compare exactly");
        assert!(matches(b"*a*b", b"xaybzab") && !matches(b"*a*b", b"xaybza"));
    }

    #[test]
    fn pathological_patterns_finish() {
        // Exponential for the reference matcher (this one would take it years).
        let name = [b'a'; 40];
        assert!(!matches(b"*?*?*?*?*?*?*?*?*?*?*?*?*?*?!", &name));
        assert!(!matches(&b"*a".repeat(30), &[b'a'; 29]));
        assert!(matches(&b"*a".repeat(30), &[b'a'; 30]));
        let long = [b'a'; 100_000];
        assert!(!matches(b"*a*a*a*a*a*a*a*a*b", &long));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]
        #[test]
        fn agrees_with_the_recursive_matcher(
            pat in prop::collection::vec(prop::sample::select(b"ab*?[]^-\\".to_vec()), 0..10),
            s in prop::collection::vec(prop::sample::select(b"ab-]^\\*".to_vec()), 0..10),
        ) {
            prop_assert_eq!(matches(&pat, &s), reference(&pat, &s), "{:?} {:?}",
                String::from_utf8_lossy(&pat), String::from_utf8_lossy(&s));
        }
    }
}

//! INFO's words: the sections it shows, in the order it shows them, and the words that name
//! several. A word that names no section is refused here, as a bad argument: answered with an
//! empty text, as Redis answers it, a misspelt section looks like a section with nothing in it
//! (issue 32). The server writes each section (server/info.rs).

use bytes::Bytes;

use crate::error::Error;

/// The sections in Redis 7's order, ours (`semaphores`; `raft`, in cluster mode only) before
/// `cluster` and `keyspace`.
pub const SECTIONS: &[&str] = &[
    "server",
    "clients",
    "memory",
    "persistence",
    "stats",
    "replication",
    "cpu",
    "semaphores",
    "commandstats",
    "errorstats",
    "latencystats",
    "cluster",
    "raft",
    "keyspace",
];

/// Redis's sections that have nothing here: each is empty, as in Redis when it has nothing to
/// show, not an error, since clients and exporters ask for them (prometheus-redis-exporter
/// sends `INFO MODULES`). `debug` is Redis 7.2's; `keysizes` and `threads` are Redis 8's.
const EMPTY_HERE: &[&str] = &["modules", "sentinel", "debug", "keysizes", "threads"];

/// What `INFO` and `INFO default` leave out, as Redis 7 does (they can be long); `all` and
/// `everything` include them.
const NOT_DEFAULT: &[&str] = &["commandstats", "latencystats"];

/// The sections `INFO [section ...]` asks for: its words, lowercase (none: `default`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sections(Vec<String>);

impl Sections {
    /// INFO's words after the command name; `ERR unknown INFO section` names the first that is
    /// neither a section (ours or Redis's) nor `default`, `all` or `everything`.
    pub fn parse(words: &[Bytes]) -> Result<Sections, Error> {
        if words.is_empty() {
            return Ok(Sections(vec!["default".into()]));
        }
        let mut wanted = Vec::with_capacity(words.len());
        for w in words {
            let lower = String::from_utf8_lossy(w).to_ascii_lowercase();
            let named = SECTIONS.contains(&lower.as_str()) || EMPTY_HERE.contains(&lower.as_str());
            if !named && !matches!(lower.as_str(), "default" | "all" | "everything") {
                return Err(Error::Err(format!(
                    "unknown INFO section '{}'",
                    String::from_utf8_lossy(&w[..w.len().min(128)])
                )));
            }
            wanted.push(lower);
        }
        Ok(Sections(wanted))
    }

    /// Whether INFO shows `section`.
    pub fn shows(&self, section: &str) -> bool {
        self.0.iter().any(|w| match w.as_str() {
            "all" | "everything" => true,
            "default" => !NOT_DEFAULT.contains(&section),
            w => w == section,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(words: &[&str]) -> Result<Sections, Error> {
        let words: Vec<Bytes> = words
            .iter()
            .map(|w| Bytes::copy_from_slice(w.as_bytes()))
            .collect();
        Sections::parse(&words)
    }

    #[test]
    fn groups_sections_and_redis_s_empty_ones_are_known_any_case() {
        let default = parse(&[]).unwrap();
        assert!(default.shows("server") && !default.shows("commandstats"));
        assert!(parse(&["EVERYTHING"]).unwrap().shows("latencystats"));
        let two = parse(&["Server", "commandstats"]).unwrap();
        assert!(two.shows("server") && two.shows("commandstats") && !two.shows("clients"));
        let modules = parse(&["modules"]).unwrap();
        assert!(SECTIONS.iter().all(|s| !modules.shows(s)), "empty here");
    }

    #[test]
    fn a_misspelt_section_is_refused_by_its_name() {
        let e = parse(&["server", "comandstats"]).unwrap_err();
        assert_eq!(e.to_string(), "ERR unknown INFO section 'comandstats'");
    }
}

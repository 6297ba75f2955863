//! Users and access control in the shape Redis users know from ACLs: hashed passwords, command
//! categories and commands allowed or denied in order, and namespace patterns (`~team-a-*`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use bytes::Bytes;
use sha2::{Digest, Sha256};

use crate::command::table::{self, AclCat, CommandSpec};
use crate::error::Error;

/// What an allow/deny rule names.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// `@all`: every command, whatever its categories.
    All,
    /// A category (`@read`, ...).
    Category(AclCat),
    /// A command (`sem.get`), with its subcommands, or one subcommand (`client|list`).
    Command(String),
}

/// A user: whether it may log in and with which passwords, and what it may run and touch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// What AUTH and `ACL SETUSER` name it by.
    pub name: String,
    enabled: bool,
    nopass: bool,
    /// SHA-256 of each accepted password.
    passwords: Vec<[u8; 32]>,
    /// Allow (`+`) / deny (`-`) rules in order; for a command, the last rule naming it wins.
    rules: Vec<(bool, Target)>,
    /// Namespace patterns the user may touch.
    patterns: Vec<Bytes>,
}

fn sha256(pass: &[u8]) -> [u8; 32] {
    Sha256::digest(pass).into()
}

fn hex(h: &[u8; 32]) -> String {
    h.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, slot) in out.iter_mut().enumerate() {
        *slot = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

fn ct_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl User {
    /// A new user as `ACL SETUSER` creates it: off, no password, no commands, no namespaces.
    pub fn new(name: &str) -> User {
        User {
            name: name.to_string(),
            enabled: false,
            nopass: false,
            passwords: Vec::new(),
            rules: Vec::new(),
            patterns: Vec::new(),
        }
    }

    /// The default user: everything allowed; `requirepass` sets its password.
    pub fn default_user(requirepass: Option<&str>) -> User {
        let mut u = User::new("default");
        u.enabled = true;
        match requirepass {
            Some(p) => u.passwords.push(sha256(p.as_bytes())),
            None => u.nopass = true,
        }
        u.rules.push((true, Target::All));
        u.patterns.push(Bytes::from_static(b"*"));
        u
    }

    /// Whether a connection is logged in as this user without AUTH.
    pub fn is_open(&self) -> bool {
        self.enabled && self.nopass
    }

    /// Whether `pass` logs in as this user.
    pub fn check_password(&self, pass: &[u8]) -> bool {
        if !self.enabled {
            return false;
        }
        if self.nopass {
            return true;
        }
        let h = sha256(pass);
        // Compare against every hash, so timing does not tell which one matched.
        self.passwords
            .iter()
            .fold(false, |found, p| found | ct_eq(p, &h))
    }

    /// Whether the user may run `spec` (a command or subcommand).
    pub fn can_run(&self, spec: &CommandSpec) -> bool {
        let container = spec.name.split('|').next().unwrap_or(spec.name);
        let mut allowed = false;
        for (allow, target) in &self.rules {
            let hit = match target {
                Target::All => true,
                Target::Category(c) => spec.acl.has(*c),
                Target::Command(c) => c == spec.name || c == container,
            };
            if hit {
                allowed = *allow;
            }
        }
        allowed
    }

    /// Whether the user may touch every namespace (`~*`).
    pub fn sees_all(&self) -> bool {
        self.patterns.iter().any(|p| p.as_ref() == b"*")
    }

    /// Whether the user may touch namespace `ns`.
    pub fn can_access(&self, ns: &[u8]) -> bool {
        self.patterns
            .iter()
            .any(|p| p.as_ref() == b"*" || crate::glob::matches(p, ns))
    }

    /// Applies one `ACL SETUSER` rule.
    pub fn apply(&mut self, rule: &str) -> Result<(), Error> {
        let bad = || {
            Error::Err(format!(
                "Error in ACL SETUSER modifier '{rule}': Syntax error"
            ))
        };
        let lower = rule.to_ascii_lowercase();
        match lower.as_str() {
            "on" => self.enabled = true,
            "off" => self.enabled = false,
            "nopass" => {
                self.nopass = true;
                self.passwords.clear();
            }
            "resetpass" => {
                self.nopass = false;
                self.passwords.clear();
            }
            "allkeys" => self.patterns = vec![Bytes::from_static(b"*")],
            "resetkeys" => self.patterns.clear(),
            "allcommands" => self.rules = vec![(true, Target::All)],
            "nocommands" => self.rules.clear(),
            "reset" => *self = User::new(&self.name),
            // Redis 7's ACL SAVE writes these on every user. There are no pub/sub channels and
            // no RESTORE payloads here: taken, and nothing to keep.
            "resetchannels" | "allchannels" | "sanitize-payload" | "skip-sanitize-payload" => {}
            _ => match rule.as_bytes().first().copied().unwrap_or(0) {
                b'>' => {
                    self.passwords.push(sha256(&rule.as_bytes()[1..]));
                    self.nopass = false;
                }
                b'<' => {
                    let h = sha256(&rule.as_bytes()[1..]);
                    self.passwords.retain(|p| !ct_eq(p, &h));
                }
                b'#' => {
                    self.passwords.push(unhex32(&lower[1..]).ok_or_else(bad)?);
                    self.nopass = false;
                }
                b'!' => {
                    let h = unhex32(&lower[1..]).ok_or_else(bad)?;
                    self.passwords.retain(|p| !ct_eq(p, &h));
                }
                b'~' if has_spaces(&rule.as_bytes()[1..]) => return Err(bad()),
                b'~' => self
                    .patterns
                    .push(Bytes::copy_from_slice(&rule.as_bytes()[1..])),
                // A channel pattern (`&*`, `&news.*`), as the channel rules above.
                b'&' => {}
                b'+' | b'-' => {
                    let allow = rule.starts_with('+');
                    let what = &lower[1..];
                    let target = match what.strip_prefix('@') {
                        Some("all") => Target::All,
                        Some(name) => Target::Category(category(name).ok_or_else(bad)?),
                        None if known_command(what) => Target::Command(what.to_string()),
                        None => return Err(bad()),
                    };
                    self.rules.push((allow, target));
                }
                _ => return Err(bad()),
            },
        }
        Ok(())
    }

    /// The user as an `ACL LIST` line (and an ACL file line).
    pub fn describe(&self) -> String {
        let mut s = format!(
            "user {} {}",
            self.name,
            if self.enabled { "on" } else { "off" }
        );
        if self.nopass {
            s.push_str(" nopass");
        }
        for p in &self.passwords {
            s.push_str(&format!(" #{}", hex(p)));
        }
        for p in &self.patterns {
            s.push_str(&format!(" ~{}", String::from_utf8_lossy(p)));
        }
        if self.rules.is_empty() {
            s.push_str(" -@all");
        }
        for (allow, t) in &self.rules {
            let sign = if *allow { '+' } else { '-' };
            match t {
                Target::All => s.push_str(&format!(" {sign}@all")),
                Target::Category(c) => s.push_str(&format!(" {sign}{}", c.as_str())),
                Target::Command(c) => s.push_str(&format!(" {sign}{c}")),
            }
        }
        s
    }
}

/// Whether `s` holds white space (C's `isspace`) or a NUL, which Redis refuses in user names
/// and key patterns for the same reason: the ACL file splits its lines at white space.
fn has_spaces(s: &[u8]) -> bool {
    s.iter().any(|b| b" \t\n\x0b\x0c\r\0".contains(b))
}

fn known_command(name: &str) -> bool {
    table::lookup_full(name.as_bytes()).is_some()
}

/// The categories some command is in, in name order: those `ACL CAT` lists and rules may name.
fn used_categories() -> Vec<AclCat> {
    let mut cats: Vec<AclCat> = table::all_specs().flat_map(|s| s.acl.iter()).collect();
    cats.sort_by_key(|c| c.name());
    cats.dedup();
    cats
}

/// The category `name` (without `@`), if a command is in it.
fn category(name: &str) -> Option<AclCat> {
    used_categories().into_iter().find(|c| c.name() == name)
}

/// `ACL CAT`: the names of the categories, sorted.
pub fn categories() -> Vec<String> {
    used_categories()
        .into_iter()
        .map(|c| c.name().to_string())
        .collect()
}

/// `ACL CAT category`: the commands and subcommands in it, in table order.
pub fn commands_in(name: &str) -> Vec<&'static str> {
    let Some(cat) = category(name) else {
        return Vec::new();
    };
    table::all_specs()
        .filter(|s| s.acl.has(cat))
        .map(|s| s.name)
        .collect()
}

/// All users; changes bump a version that connections check before each command.
#[derive(Debug)]
pub struct Acl {
    users: RwLock<BTreeMap<String, Arc<User>>>,
    version: AtomicU64,
    file: Option<PathBuf>,
    requirepass: Option<String>,
}

impl Acl {
    /// The users of `--aclfile` (when given) over the default user of `--requirepass`.
    pub fn new(requirepass: Option<String>, file: Option<PathBuf>) -> Result<Acl, String> {
        let acl = Acl {
            users: RwLock::new(BTreeMap::new()),
            version: AtomicU64::new(0),
            file,
            requirepass,
        };
        acl.load().map_err(|e| e.message().to_string())?;
        Ok(acl)
    }

    /// Reads the ACL file again (or resets to the default user without one).
    pub fn load(&self) -> Result<(), Error> {
        let mut users = BTreeMap::new();
        users.insert(
            "default".to_string(),
            Arc::new(User::default_user(self.requirepass.as_deref())),
        );
        if let Some(path) = &self.file {
            let text = match std::fs::read_to_string(path) {
                Ok(t) => t,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
                Err(e) => return Err(Error::Err(format!("{}: {e}", path.display()))),
            };
            for (i, line) in text.lines().enumerate() {
                let line = line.trim();
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                let mut words = line.split_whitespace();
                let (Some("user"), Some(name)) = (words.next(), words.next()) else {
                    return Err(Error::Err(format!(
                        "{}:{}: a line must start with 'user <name>'",
                        path.display(),
                        i + 1
                    )));
                };
                let mut u = User::new(name);
                for rule in words {
                    u.apply(rule).map_err(|e| {
                        Error::Err(format!("{}:{}: {}", path.display(), i + 1, e.message()))
                    })?;
                }
                users.insert(name.to_string(), Arc::new(u));
            }
        }
        *self.users.write().unwrap_or_else(PoisonError::into_inner) = users;
        self.version.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// Writes every user to the ACL file.
    pub fn save(&self) -> Result<(), Error> {
        let Some(path) = &self.file else {
            return Err(Error::Err(
                "This server is not configured with an ACL file (--aclfile)".into(),
            ));
        };
        let text: String = self.list().into_iter().map(|l| l + "\n").collect();
        crate::persist::write_file_synced(path, text.as_bytes())
            .map_err(|e| Error::Err(format!("{}: {e}", path.display())))
    }

    /// The version; it changes whenever a user changes.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// The user `name` as it is now; a later change replaces it for the connections that look
    /// it up again, as they do when [`Acl::version`] moves.
    pub fn get(&self, name: &str) -> Option<Arc<User>> {
        self.users
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .cloned()
    }

    /// `ACL SETUSER`: creates or changes a user; nothing changes if a rule is bad.
    pub fn setuser(&self, name: &str, rules: &[String]) -> Result<(), Error> {
        // The ACL file is one user a line, words split at white space: a name with a space or a
        // newline in it would not read back, or would read back as another user.
        if has_spaces(name.as_bytes()) {
            return Err(Error::Err(
                "Usernames can't contain spaces or null characters".into(),
            ));
        }
        let mut users = self.users.write().unwrap_or_else(PoisonError::into_inner);
        let mut u = users
            .get(name)
            .map(|u| (**u).clone())
            .unwrap_or_else(|| User::new(name));
        for r in rules {
            u.apply(r)?;
        }
        users.insert(name.to_string(), Arc::new(u));
        self.version.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// `ACL DELUSER`: removes users; returns how many existed.
    pub fn deluser(&self, names: &[String]) -> Result<usize, Error> {
        if names.iter().any(|n| n == "default") {
            return Err(Error::Err("The 'default' user cannot be removed".into()));
        }
        let mut users = self.users.write().unwrap_or_else(PoisonError::into_inner);
        let removed = names.iter().filter(|n| users.remove(*n).is_some()).count();
        self.version.fetch_add(1, Ordering::AcqRel);
        Ok(removed)
    }

    /// `ACL LIST`: one line per user, in name order.
    pub fn list(&self) -> Vec<String> {
        self.users
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .map(|u| u.describe())
            .collect()
    }

    /// `ACL USERS`: the user names, sorted.
    pub fn names(&self) -> Vec<String> {
        self.users
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .cloned()
            .collect()
    }

    /// The user `name` if `pass` logs in as it (AUTH's check, and the HTTP port's).
    pub fn login(&self, name: &str, pass: &[u8]) -> Option<Arc<User>> {
        self.get(name).filter(|u| u.check_password(pass))
    }

    /// Whether connections need no password (protected mode applies then).
    pub fn default_is_open(&self) -> bool {
        self.get("default").is_some_and(|u| u.is_open())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::table::lookup_full;

    fn spec(name: &str) -> &'static CommandSpec {
        lookup_full(name.as_bytes()).unwrap()
    }

    #[test]
    fn rules_apply_in_order_and_patterns_limit_namespaces() {
        let mut u = User::new("alice");
        for r in ["on", ">s3cret", "~team-a-*", "+@semaphore", "-sem.delete"] {
            u.apply(r).unwrap();
        }
        assert!(u.check_password(b"s3cret"));
        assert!(!u.check_password(b"wrong"));
        assert!(u.can_run(spec("sem.acquire")));
        assert!(!u.can_run(spec("sem.delete")));
        assert!(!u.can_run(spec("config|get")));
        assert!(u.can_access(b"team-a-x"));
        assert!(!u.can_access(b"team-b-x"));
        let line = u.describe();
        assert!(
            line.starts_with("user alice on #") && line.contains("~team-a-*"),
            "{line}"
        );
        assert!(!line.contains("s3cret"));
    }

    #[test]
    fn bad_rules_are_errors_and_default_allows_everything() {
        assert!(User::new("x").apply("+@nosuch").is_err());
        assert!(User::new("x").apply("+nosuchcommand").is_err());
        assert!(User::new("x").apply("bogus").is_err());
        let d = User::default_user(None);
        assert!(d.is_open() && d.can_run(spec("client|kill")) && d.can_access(b"anything"));
        let p = User::default_user(Some("pw"));
        assert!(!p.is_open() && p.check_password(b"pw"));
        let off = User::new("off");
        assert!(!off.check_password(b""));
    }
}

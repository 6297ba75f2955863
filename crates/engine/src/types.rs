//! Value types of the model (SPEC §1): names, lease ids, metadata, time and weights.

use std::fmt;

use bytes::Bytes;

/// Nanoseconds since the Unix epoch (UTC); also used for durations inside the engine.
pub type Nanos = i64;

/// A number of permits.
pub type Weight = i64;

/// A fencing token: strictly increasing per semaphore, across restarts and re-creation.
pub type FencingToken = i64;

/// Nanoseconds in one second.
pub const NANOS_PER_SEC: Nanos = 1_000_000_000;

/// A validated namespace or semaphore name (`[-_0-9a-zA-Z]`, length within the limit).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Name(Bytes);

impl Name {
    /// Wraps bytes that the caller has validated (see `command::args::name`).
    pub fn new_unchecked(b: Bytes) -> Name {
        Name(b)
    }

    /// Whether `b` is a well-formed name of at most `max_len` bytes.
    pub fn is_valid(b: &[u8], max_len: usize) -> bool {
        !b.is_empty()
            && b.len() <= max_len
            && b.iter()
                .all(|c| c.is_ascii_alphanumeric() || *c == b'-' || *c == b'_')
    }

    /// A copy in its own small allocation. Request arguments are slices of a connection's read
    /// buffer; a name kept in the state must not pin that whole buffer.
    pub fn detached(&self) -> Name {
        Name(Bytes::copy_from_slice(&self.0))
    }

    /// The name's bytes.
    pub fn bytes(&self) -> &Bytes {
        &self.0
    }

    /// The name as text (always ASCII).
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).unwrap_or("")
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.as_str())
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

const BASE62: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// Length of the random part of a lease id.
const LEASE_CHARS: usize = 28;

/// Bytes of a lease id packed: each base62 character is a 6-bit index, 28 x 6 = 168 bits.
const LEASE_PACKED: usize = LEASE_CHARS * 6 / 8;

// Packing goes four characters (three bytes) at a time.
const _: () = assert!(LEASE_CHARS.is_multiple_of(4));

/// A lease id: `ls_` + 28 base62 characters (about 166 random bits), a capability.
///
/// Held packed, 21 bytes instead of 28: the lease slab keeps one per lease, and a million of
/// them is 8 MB less. The characters' indexes are packed most significant first and `BASE62`
/// is in ASCII order, so packed ids order as their text does.
///
/// Its `Debug` form is redacted so that it cannot reach a log by accident; equality is computed
/// in constant time.
#[derive(Clone, Copy, Eq)]
pub struct LeaseId([u8; LEASE_PACKED]);

impl PartialEq for LeaseId {
    fn eq(&self, other: &Self) -> bool {
        // Constant time: the comparison does not stop at the first differing byte.
        self.0
            .iter()
            .zip(other.0.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }
}

impl std::hash::Hash for LeaseId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

impl PartialOrd for LeaseId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for LeaseId {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.cmp(&other.0)
    }
}

/// The 6-bit index of a base62 character (the caller checked it is alphanumeric).
fn base62_index(c: u8) -> u8 {
    debug_assert!(c.is_ascii_alphanumeric());
    match c {
        b'0'..=b'9' => c - b'0',
        b'A'..=b'Z' => c - b'A' + 10,
        _ => c - b'a' + 36,
    }
}

impl LeaseId {
    /// Packs 28 base62 characters.
    fn pack(chars: &[u8; LEASE_CHARS]) -> LeaseId {
        let mut out = [0u8; LEASE_PACKED];
        // Four characters (24 bits) fill three bytes.
        for (quad, bytes) in chars.chunks_exact(4).zip(out.chunks_exact_mut(3)) {
            let bits = quad
                .iter()
                .fold(0u32, |acc, &c| acc << 6 | u32::from(base62_index(c)));
            bytes.copy_from_slice(&bits.to_be_bytes()[1..]);
        }
        LeaseId(out)
    }

    /// The 28 base62 characters.
    fn chars(&self) -> [u8; LEASE_CHARS] {
        let mut out = [0u8; LEASE_CHARS];
        for (bytes, quad) in self.0.chunks_exact(3).zip(out.chunks_exact_mut(4)) {
            let bits = u32::from_be_bytes([0, bytes[0], bytes[1], bytes[2]]);
            for (i, c) in quad.iter_mut().enumerate() {
                *c = BASE62[(bits >> (18 - 6 * i) & 63) as usize];
            }
        }
        out
    }

    /// A new id from `random`, which fills a buffer with random bytes: the server passes the
    /// operating system's CSPRNG (`command::args::lease_id`), so that the engine does no I/O.
    pub fn from_random(mut random: impl FnMut(&mut [u8])) -> LeaseId {
        let mut out = [0u8; LEASE_CHARS];
        let mut filled = 0;
        let mut buf = [0u8; 64];
        while filled < LEASE_CHARS {
            random(&mut buf);
            // Rejection sampling keeps every character uniform over the 62 symbols.
            for &b in buf.iter().filter(|&&b| b < 248) {
                if filled == LEASE_CHARS {
                    break;
                }
                out[filled] = BASE62[(b % 62) as usize];
                filled += 1;
            }
        }
        LeaseId::pack(&out)
    }

    /// A deterministic id for tests and the reference model: `n` in base62, zero-padded.
    pub fn from_counter(mut n: u64) -> LeaseId {
        let mut out = [b'0'; LEASE_CHARS];
        for slot in out.iter_mut().rev() {
            *slot = BASE62[(n % 62) as usize];
            n /= 62;
        }
        LeaseId::pack(&out)
    }

    /// Parses the wire form; `None` when it is not shaped like a lease id (so it cannot exist).
    pub fn parse(b: &[u8]) -> Option<LeaseId> {
        let rest: &[u8; LEASE_CHARS] = b.strip_prefix(b"ls_")?.try_into().ok()?;
        if !rest.iter().all(u8::is_ascii_alphanumeric) {
            return None;
        }
        Some(LeaseId::pack(rest))
    }

    /// The wire form, `ls_...`.
    pub fn to_bytes(&self) -> Bytes {
        let mut v = Vec::with_capacity(3 + LEASE_CHARS);
        v.extend_from_slice(b"ls_");
        v.extend_from_slice(&self.chars());
        Bytes::from(v)
    }
}

impl fmt::Debug for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ls_<redacted>")
    }
}

/// An opaque string map attached to an entity; keys unique and sorted, binary-safe.
///
/// One word, null when empty: every lease and holder carries one, usually empty. (The Box
/// around the Vec is the point: a thin pointer, where a Vec or boxed slice takes 2-3 words.)
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[allow(clippy::box_collection)]
pub struct Metadata(Option<Box<Vec<(Bytes, Bytes)>>>);

impl Metadata {
    /// Builds from pairs in request order: a duplicate key keeps its last value.
    pub fn from_pairs(pairs: Vec<(Bytes, Bytes)>) -> Metadata {
        let mut v: Vec<(Bytes, Bytes)> = Vec::with_capacity(pairs.len());
        for (k, val) in pairs {
            match v.iter_mut().find(|(key, _)| *key == k) {
                Some(slot) => slot.1 = val,
                None => v.push((k, val)),
            }
        }
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v.shrink_to_fit();
        Metadata((!v.is_empty()).then(|| Box::new(v)))
    }

    /// The pairs, sorted by key.
    pub fn pairs(&self) -> &[(Bytes, Bytes)] {
        self.0.as_deref().map_or(&[], Vec::as_slice)
    }
}

/// Limits of SPEC §6 (each a server option).
#[derive(Clone, Debug)]
pub struct Limits {
    /// Longest namespace or semaphore name, bytes.
    pub max_name_len: usize,
    /// Longest process_id, bytes.
    pub max_process_id_len: usize,
    /// Longest description, bytes.
    pub max_description_len: usize,
    /// Most metadata entries.
    pub max_metadata_entries: usize,
    /// Longest metadata key, bytes.
    pub max_metadata_key_len: usize,
    /// Longest metadata value, bytes.
    pub max_metadata_value_len: usize,
    /// Shortest lease ttl, seconds.
    pub min_lease_ttl: i64,
    /// Longest lease ttl, seconds.
    pub max_lease_ttl: i64,
    /// Longest acquire timeout, seconds.
    pub max_acquire_timeout: f64,
    /// Most namespaces on the server.
    pub max_namespaces: usize,
    /// Most semaphores in one namespace.
    pub max_semaphores_per_namespace: usize,
    /// Most leases in one namespace.
    pub max_leases_per_namespace: usize,
    /// Most holders of one semaphore.
    pub max_holders_per_semaphore: usize,
    /// Most parked acquires on one semaphore.
    pub max_waiters_per_semaphore: usize,
    /// Most parked acquires on the whole server.
    pub max_waiters: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_name_len: 128,
            max_process_id_len: 128,
            max_description_len: 1024,
            max_metadata_entries: 32,
            max_metadata_key_len: 128,
            max_metadata_value_len: 256,
            min_lease_ttl: 1,
            max_lease_ttl: 300,
            max_acquire_timeout: 300.0,
            max_namespaces: 100_000,
            max_semaphores_per_namespace: 1_000_000,
            max_leases_per_namespace: 1_000_000,
            max_holders_per_semaphore: 1_000,
            max_waiters_per_semaphore: 100_000,
            max_waiters: 1_000_000,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ids from a seeded xorshift generator, drawn the way the server draws them from the OS.
    fn random_id(state: &mut u64) -> LeaseId {
        LeaseId::from_random(|buf| {
            for b in buf.iter_mut() {
                *state ^= *state << 13;
                *state ^= *state >> 7;
                *state ^= *state << 17;
                *b = (*state >> 24) as u8;
            }
        })
    }

    #[test]
    fn lease_ids_are_shaped_and_distinct() {
        let mut seed = 0x5eed;
        let a = random_id(&mut seed);
        let b = random_id(&mut seed);
        assert_ne!(a, b);
        let wire = a.to_bytes();
        assert_eq!(wire.len(), 31);
        assert!(wire.starts_with(b"ls_"));
        assert_eq!(LeaseId::parse(&wire), Some(a));
        assert_eq!(LeaseId::parse(b"ls_short"), None);
        assert_eq!(format!("{a:?}"), "ls_<redacted>");
    }

    #[test]
    fn packed_lease_ids_keep_their_text_and_its_order() {
        let text = |body: &str| format!("ls_{body}").into_bytes();
        let texts = [
            text(&"0".repeat(28)),
            text(&"09AZaz".repeat(5)[..28]),
            text(&"z".repeat(27)),
            text(&"z".repeat(28)),
        ];
        let ids: Vec<LeaseId> = texts.iter().filter_map(|t| LeaseId::parse(t)).collect();
        assert_eq!(ids.len(), 3, "the 27-character one is not an id");
        for (id, text) in ids.iter().zip([&texts[0], &texts[1], &texts[3]]) {
            assert_eq!(&id.to_bytes()[..], &text[..]);
        }
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "packed ids order as their text"
        );
        let mut seed = 7;
        for _ in 0..100 {
            let id = random_id(&mut seed);
            let wire = id.to_bytes();
            assert!(wire[3..].iter().all(u8::is_ascii_alphanumeric));
            assert_eq!(LeaseId::parse(&wire), Some(id));
        }
        assert_eq!(LeaseId::parse(b"ls_000000000000000000000000000-"), None);
        assert_eq!(LeaseId::from_counter(61).to_bytes()[30], b'z');
    }

    #[test]
    fn metadata_last_duplicate_wins_and_sorts() {
        let m = Metadata::from_pairs(vec![
            (Bytes::from("b"), Bytes::from("1")),
            (Bytes::from("a"), Bytes::from("2")),
            (Bytes::from("b"), Bytes::from("3")),
        ]);
        assert_eq!(
            m.pairs(),
            &[
                (Bytes::from("a"), Bytes::from("2")),
                (Bytes::from("b"), Bytes::from("3"))
            ]
        );
    }
}

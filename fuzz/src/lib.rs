//! Fuzz target bodies, shared by the libFuzzer targets in `fuzz/fuzz_targets/` and by the
//! corpus replay test `tests/fuzz_corpus.rs` (which includes this file with `#[path]`), so an
//! input kept under `fuzz/corpus/<target>/` or `fuzz/regressions/<target>/` fails `cargo test`
//! the same way. `FUZZ_TRACE=1` makes the engine target print every request and reply.
//!
//! Every body takes arbitrary bytes, never panics on its own, and panics (an `assert!`) when
//! the code under test breaks a property:
//!
//! * [`request_parser`]: the Redis request grammar gives the same commands and the same error
//!   whether the bytes arrive at once, in random chunks, or one at a time; what it returns
//!   re-encodes to itself.
//! * [`command_parser`]: `parse_argv` never panics; an accepted request is within every limit
//!   (names, weights, ttl, timeout, metadata, pages), deterministic, and the command name's
//!   case does not matter; a rejected one is an `ERR` or `INVALIDARG`.
//! * [`engine`]: a sequence of operations with time jumps against one `Shard`; after every step
//!   the SPEC invariants hold (`active_holds` is the sum of the holder weights and at most
//!   `permits`, no holder or lease is visible past its death, queues are strict FIFO, fencing
//!   tokens only rise, each parked acquire is answered once), holder pages are exact, and the
//!   journal, encoded, decoded and replayed into an empty state, gives the same state.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use permitd::command::{self, table, Request};
use permitd::engine::journal;
use permitd::engine::page::{Cursor, CursorKind, Page};
use permitd::engine::request::{
    EngineRequest, LeaseCreate, LeaseGet, LeaseList, LeaseRefresh, LeaseRevoke, NsCreate, NsDelete,
    NsGet, NsList, NsUpdate, SemAcquire, SemAcquireAll, SemCreate, SemDelete, SemGet, SemHolders,
    SemList, SemRelease, SemUpdate, SemWaiters, MAX_ACQUIRE_ALL,
};
use permitd::engine::state::Namespace;
use permitd::engine::types::{LeaseId, Limits, Metadata, Name, NANOS_PER_SEC};
use permitd::engine::{Cancel, Exec, Shard, WaiterId};
use permitd::error::Error;
use permitd::persist::codec;
use permitd::protocol::request::INLINE_MAX;
use permitd::protocol::{Proto, Reply, RequestLimits, RequestParser};

// ---------------------------------------------------------------------------------------------
// A tiny deterministic byte reader and PRNG, so inputs decode the same everywhere.
// ---------------------------------------------------------------------------------------------

/// Reads bytes off the front of a fuzz input; past the end every read is 0.
struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Input<'a> {
    fn new(data: &'a [u8]) -> Input<'a> {
        Input { data, pos: 0 }
    }

    fn done(&self) -> bool {
        self.pos >= self.data.len()
    }

    fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    fn below(&mut self, n: usize) -> usize {
        self.u8() as usize % n
    }

    fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[self.below(from.len())]
    }
}

/// xorshift64*: chunk sizes from one seed byte.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

// ---------------------------------------------------------------------------------------------
// request_parser
// ---------------------------------------------------------------------------------------------

/// What feeding a byte stream to a fresh parser gives: the complete requests, then either the
/// protocol error that closes the connection or `None` (the rest is an incomplete request).
#[derive(Debug, PartialEq)]
struct Parsed {
    commands: Vec<Vec<Bytes>>,
    error: Option<String>,
}

fn feed(
    input: &[u8],
    chunks: &mut dyn FnMut() -> usize,
    limits: &RequestLimits,
    auth: bool,
) -> Parsed {
    let mut parser = RequestParser::default();
    let mut buf = BytesMut::new();
    let mut commands = Vec::new();
    let mut at = 0;
    while at < input.len() {
        let n = chunks().clamp(1, input.len() - at);
        buf.extend_from_slice(&input[at..at + n]);
        at += n;
        loop {
            match parser.next(&mut buf, limits, auth) {
                Ok(Some(args)) => {
                    assert!(!args.is_empty(), "an empty request was returned");
                    commands.push(args);
                }
                Ok(None) => break,
                Err(e) => {
                    return Parsed {
                        commands,
                        error: Some(e.0),
                    }
                }
            }
            // Bytes held by a partial request never exceed what was fed.
            assert!(parser.pending_bytes() + buf.len() <= at);
        }
    }
    Parsed {
        commands,
        error: None,
    }
}

/// An error reply is one line on the wire whatever its message holds (user input is echoed in
/// some), under both protocols.
fn check_error_line(e: &Error) {
    for proto in [Proto::Resp2, Proto::Resp3] {
        let mut out = BytesMut::new();
        Reply::Error(e.clone()).encode(proto, &mut out);
        assert!(out.starts_with(b"-") && out.ends_with(b"\r\n"));
        let body = &out[..out.len() - 2];
        assert!(
            !body.contains(&b'\r') && !body.contains(&b'\n'),
            "error reply {out:?}"
        );
    }
}

fn encode_multibulk(args: &[Bytes]) -> Vec<u8> {
    let args: Vec<&[u8]> = args.iter().map(|a| &a[..]).collect();
    let mut out = Vec::new();
    permitd::protocol::request::encode_request(&mut out, &args);
    out
}

/// Input: `[flags, chunk seed, bytes...]`. Flags bit 0: not authenticated; bits 1-2: limits.
pub fn request_parser(data: &[u8]) {
    let [flags, seed, rest @ ..] = data else {
        return;
    };
    // Past INLINE_MAX bytes without a newline the parser refuses a line as soon as it has seen
    // that much, so the verdict may then depend on where reads end (as in Redis): stay below.
    let input = &rest[..rest.len().min(INLINE_MAX)];
    let auth = flags & 1 == 0;
    let limits = match (flags >> 1) & 3 {
        0 => RequestLimits::default(),
        1 => RequestLimits {
            max_bulk_len: 16,
            max_multibulk_len: 8,
        },
        2 => RequestLimits {
            max_bulk_len: 0,
            max_multibulk_len: 1,
        },
        _ => RequestLimits {
            max_bulk_len: 1024,
            max_multibulk_len: 3,
        },
    };
    let whole = feed(input, &mut || usize::MAX, &limits, auth);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (*seed as u64 + 1));
    let chunked = feed(input, &mut || 1 + (rng.next() % 64) as usize, &limits, auth);
    assert_eq!(chunked, whole, "random chunks differ from one read");
    let bytewise = feed(input, &mut || 1, &limits, auth);
    assert_eq!(bytewise, whole, "byte-by-byte differs from one read");

    if let Some(e) = &whole.error {
        // The connection answers `-ERR Protocol error: <e>` before closing: one line.
        assert!(!e.is_empty());
        check_error_line(&Error::Err(format!("Protocol error: {e}")));
    }
    // What was accepted re-encodes as multibulk and parses back to itself.
    let generous = RequestLimits::default();
    for args in &whole.commands {
        let bytes = encode_multibulk(args);
        let again = feed(&bytes, &mut || usize::MAX, &generous, true);
        assert_eq!(again.error, None);
        assert_eq!(&again.commands, &vec![args.clone()], "re-encoded request");
    }
}

// ---------------------------------------------------------------------------------------------
// command_parser
// ---------------------------------------------------------------------------------------------

/// Every command the table knows, as the words that name it (`["client", "kill"]`).
fn command_words() -> Vec<Vec<&'static str>> {
    let mut out = Vec::new();
    for spec in table::COMMANDS {
        if spec.subcommands.is_empty() {
            out.push(vec![spec.name]);
        }
        for sub in spec.subcommands {
            let (container, word) = sub.name.split_once('|').expect("container|sub");
            out.push(vec![container, word]);
        }
    }
    out
}

fn fuzz_limits(sel: u8) -> Limits {
    match sel % 3 {
        0 => Limits::default(),
        1 => Limits {
            max_name_len: 4,
            max_process_id_len: 3,
            max_description_len: 5,
            max_metadata_entries: 2,
            max_metadata_key_len: 3,
            max_metadata_value_len: 4,
            min_lease_ttl: 2,
            max_lease_ttl: 9,
            max_acquire_timeout: 2.5,
            ..Limits::default()
        },
        _ => Limits {
            max_acquire_timeout: 0.0,
            min_lease_ttl: 300,
            ..Limits::default()
        },
    }
}

fn swap_case(b: &Bytes) -> Bytes {
    Bytes::from(
        b.iter()
            .map(|c| {
                if c.is_ascii_lowercase() {
                    c.to_ascii_uppercase()
                } else {
                    c.to_ascii_lowercase()
                }
            })
            .collect::<Vec<u8>>(),
    )
}

/// A request with the one random part (a new lease's id) blanked, for comparisons.
fn comparable(r: &Request) -> Request {
    let mut r = r.clone();
    if let Request::Engine(EngineRequest::LeaseCreate(LeaseCreate { id, .. })) = &mut r {
        *id = LeaseId::from_counter(0);
    }
    r
}

fn check_metadata(m: &Metadata, limits: &Limits) {
    let pairs = m.pairs();
    assert!(pairs.len() <= limits.max_metadata_entries);
    assert!(
        pairs.windows(2).all(|w| w[0].0 < w[1].0),
        "metadata keys unique, sorted"
    );
    for (k, v) in pairs {
        assert!(!k.is_empty() && k.len() <= limits.max_metadata_key_len);
        assert!(v.len() <= limits.max_metadata_value_len);
    }
}

fn check_name(n: &Name, limits: &Limits) {
    assert!(Name::is_valid(n.bytes(), limits.max_name_len), "name {n:?}");
}

fn check_page(p: &Page) {
    assert!((1..=250).contains(&p.limit), "LIMIT {}", p.limit);
}

fn check_lease_arg(lease: &Option<LeaseId>, raw: &Bytes) {
    match lease {
        Some(id) => assert_eq!(&id.to_bytes(), raw, "lease id round trip"),
        None => assert!(LeaseId::parse(raw).is_none()),
    }
}

/// The invariants of an accepted engine request.
fn check_engine_request(e: &EngineRequest, argv: &[Bytes], limits: &Limits) {
    use EngineRequest as E;
    if let Some(ns) = e.namespace() {
        check_name(ns, limits);
        assert_eq!(ns.bytes(), &argv[1], "the namespace is the first key");
    }
    let secs = |s: i64| s * NANOS_PER_SEC;
    match e {
        E::NsCreate(NsCreate { desc, meta, .. }) | E::NsUpdate(NsUpdate { desc, meta, .. }) => {
            assert!(desc.len() <= limits.max_description_len);
            check_metadata(meta, limits);
        }
        E::NsGet(NsGet { .. }) | E::NsDelete(NsDelete { .. }) => {}
        E::NsList(NsList { page }) => check_page(page),
        E::SemCreate(SemCreate {
            sem,
            permits,
            desc,
            meta,
            ..
        })
        | E::SemUpdate(SemUpdate {
            sem,
            permits,
            desc,
            meta,
            ..
        }) => {
            check_name(sem, limits);
            assert!(*permits > 0);
            assert!(desc.len() <= limits.max_description_len);
            check_metadata(meta, limits);
        }
        E::SemGet(SemGet { sem, .. }) | E::SemDelete(SemDelete { sem, .. }) => {
            check_name(sem, limits)
        }
        E::SemList(SemList { page, .. }) => check_page(page),
        E::SemAcquire(SemAcquire {
            sem,
            lease,
            weight,
            timeout,
            meta,
            ..
        }) => {
            check_name(sem, limits);
            check_lease_arg(lease, &argv[3]);
            assert!(*weight > 0);
            let max = (limits.max_acquire_timeout * NANOS_PER_SEC as f64).round() as i64;
            assert!(*timeout >= 0 && *timeout <= max, "timeout {timeout}");
            assert_eq!(e.may_block(), *timeout > 0);
            check_metadata(meta, limits);
        }
        E::SemAcquireAll(SemAcquireAll {
            lease,
            timeout,
            parts,
            meta,
            ..
        }) => {
            check_lease_arg(lease, &argv[2]);
            assert!(!parts.is_empty() && parts.len() <= MAX_ACQUIRE_ALL);
            for (i, p) in parts.iter().enumerate() {
                check_name(&p.sem, limits);
                assert!(p.weight > 0);
                assert!(
                    parts[..i].iter().all(|q| q.sem != p.sem),
                    "a semaphore twice"
                );
            }
            let max = (limits.max_acquire_timeout * NANOS_PER_SEC as f64).round() as i64;
            assert!(*timeout >= 0 && *timeout <= max, "timeout {timeout}");
            assert_eq!(e.may_block(), *timeout > 0);
            check_metadata(meta, limits);
        }
        E::SemRelease(SemRelease { sem, lease, .. }) => {
            check_name(sem, limits);
            check_lease_arg(lease, &argv[3]);
        }
        E::SemHolders(SemHolders { sem, page, .. })
        | E::SemWaiters(SemWaiters { sem, page, .. }) => {
            check_name(sem, limits);
            check_page(page);
        }
        E::LeaseCreate(LeaseCreate {
            process_id,
            ttl,
            meta,
            ..
        }) => {
            assert!(!process_id.is_empty() && process_id.len() <= limits.max_process_id_len);
            assert_eq!(process_id, &argv[2]);
            assert!(*ttl >= secs(limits.min_lease_ttl) && *ttl <= secs(limits.max_lease_ttl));
            check_metadata(meta, limits);
        }
        E::LeaseGet(LeaseGet { lease, .. }) | E::LeaseRevoke(LeaseRevoke { lease, .. }) => {
            check_lease_arg(lease, &argv[2])
        }
        E::LeaseList(LeaseList { page, .. }) => check_page(page),
        E::LeaseRefresh(LeaseRefresh { lease, ttl, .. }) => {
            check_lease_arg(lease, &argv[2]);
            assert!(*ttl >= secs(limits.min_lease_ttl) && *ttl <= secs(limits.max_lease_ttl));
        }
    }
    if !matches!(e, E::SemAcquire(_) | E::SemAcquireAll(_)) {
        assert!(!e.may_block());
    }
}

/// Input: `[limits, command, words separated by 0xFF...]`. The command byte picks a command of
/// the table (its words come first, in a case chosen by the limits byte), or, when it is 0xFF,
/// none: then the first word is the name.
pub fn command_parser(data: &[u8]) {
    let [sel, cmd, rest @ ..] = data else {
        return;
    };
    let limits = fuzz_limits(*sel);
    let table = command_words();
    let mut argv: Vec<Bytes> = Vec::new();
    if *cmd != 0xFF {
        let words = &table[*cmd as usize % table.len()];
        for w in words {
            let w = if sel & 0x10 != 0 {
                w.to_ascii_uppercase()
            } else {
                w.to_string()
            };
            argv.push(Bytes::from(w));
        }
    }
    if !rest.is_empty() {
        argv.extend(rest.split(|&b| b == 0xFF).map(Bytes::copy_from_slice));
    }
    if argv.is_empty() {
        // The request grammar never yields an empty request.
        return;
    }
    let got = command::parse_argv(&argv, &limits);
    // Deterministic.
    let again = command::parse_argv(&argv, &limits);
    match (&got, &again) {
        (Ok((s1, r1)), Ok((s2, r2))) => {
            assert!(std::ptr::eq(*s1, *s2));
            assert_eq!(comparable(r1), comparable(r2));
        }
        (Err(e1), Err(e2)) => assert_eq!(e1, e2),
        _ => panic!("parse_argv is not deterministic: {got:?} then {again:?}"),
    }
    // Command names (and subcommand words) are case-insensitive.
    let mut swapped = argv.clone();
    swapped[0] = swap_case(&swapped[0]);
    let container = command::resolve(&argv)
        .map(|s| s.name.contains('|'))
        .unwrap_or(false);
    if container {
        swapped[1] = swap_case(&swapped[1]);
    }
    let other = command::parse_argv(&swapped, &limits);
    match (&got, &other) {
        (Ok((s1, r1)), Ok((s2, r2))) => {
            assert!(std::ptr::eq(*s1, *s2), "case changed the command");
            // ECHO/PING/etc. carry the words they were given; compare engine requests only.
            if let (Request::Engine(_), Request::Engine(_)) = (r1, r2) {
                assert_eq!(comparable(r1), comparable(r2), "case changed the request");
            }
        }
        (Err(e1), Err(e2)) => assert_eq!(e1.code(), e2.code(), "case changed the error"),
        _ => panic!("case of the name changed the verdict: {got:?} vs {other:?}"),
    }

    match got {
        Ok((spec, req)) => {
            assert!(
                spec.arity_ok(argv.len()),
                "{} with {} words",
                spec.name,
                argv.len()
            );
            let full = match spec.name.split_once('|') {
                None => argv[0].to_ascii_lowercase(),
                Some(_) => [
                    argv[0].to_ascii_lowercase(),
                    b"|".to_vec(),
                    argv[1].to_ascii_lowercase(),
                ]
                .concat(),
            };
            assert_eq!(full, spec.name.as_bytes(), "resolved to another command");
            if let Request::Engine(e) = &req {
                check_engine_request(e, &argv, &limits);
            }
        }
        Err(e) => {
            assert!(
                matches!(e.code(), "ERR" | "INVALIDARG"),
                "parse error with code {}: {}",
                e.code(),
                e.message()
            );
            assert!(!e.message().is_empty());
            check_error_line(&e);
            if let Some(rest) = e.message().strip_prefix("wrong number of arguments for '") {
                let name = rest.split('\'').next().unwrap_or("");
                assert_eq!(name, name.to_ascii_lowercase(), "arity error names {name}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// engine
// ---------------------------------------------------------------------------------------------

const S: i64 = NANOS_PER_SEC;
const MS: i64 = S / 1000;
const T0: i64 = 1_700_000_000 * S;
const NSS: [&str; 2] = ["n0", "n1"];
const SEMS: [&str; 3] = ["s0", "s1", "s2"];

fn name(s: &str) -> Name {
    Name::new_unchecked(Bytes::copy_from_slice(s.as_bytes()))
}

fn field<'a>(r: &'a Reply, key: &str) -> Option<&'a Reply> {
    r.field(key)
}

fn int_field(r: &Reply, key: &str) -> i64 {
    match field(r, key) {
        Some(Reply::Int(i)) => *i,
        other => panic!("field {key}: {other:?} in {r:?}"),
    }
}

fn outcome(r: &Reply) -> Option<&[u8]> {
    match field(r, "outcome") {
        Some(Reply::Bulk(b)) => Some(b),
        _ => None,
    }
}

/// The checks every reply of the engine passes: known error codes, and an acquire result that
/// is possible (ACQUIRED within the permits, with a token).
fn check_reply(r: &Reply) {
    if let Reply::Error(e) = r {
        check_error_line(e);
        assert!(
            matches!(
                e.code(),
                "NOTFOUND" | "ALREADYEXISTS" | "INVALIDARG" | "RESOURCEEXHAUSTED" | "UNBLOCKED"
            ),
            "engine error code {}: {}",
            e.code(),
            e.message()
        );
        return;
    }
    if let Some(o) = outcome(r) {
        let sem = field(r, "semaphore").expect("acquire result has a semaphore");
        let (permits, held) = (int_field(sem, "permits"), int_field(sem, "active_holds"));
        assert!(
            held >= 0 && held <= permits,
            "reply shows {held} held of {permits}"
        );
        match o {
            b"ACQUIRE_OUTCOME_ACQUIRED" => assert!(int_field(r, "fencing_token") > 0),
            b"ACQUIRE_OUTCOME_UNAVAILABLE" | b"ACQUIRE_OUTCOME_TIMED_OUT" => {
                assert!(field(r, "fencing_token").is_none())
            }
            other => panic!("outcome {:?}", String::from_utf8_lossy(other)),
        }
    }
}

thread_local! {
    /// How often the engine target reached each situation that matters (since the last
    /// [`take_engine_hits`]): the corpus replay test checks the seeds reach them all.
    static HITS: RefCell<BTreeMap<&'static str, u64>> = const { RefCell::new(BTreeMap::new()) };
}

fn hit(what: &'static str) {
    HITS.with(|h| *h.borrow_mut().entry(what).or_default() += 1);
}

/// The engine target's situation tallies since the last call.
pub fn take_engine_hits() -> BTreeMap<&'static str, u64> {
    HITS.with(|h| std::mem::take(&mut *h.borrow_mut()))
}

/// The harness around one shard: what was handed out, and what must hold across steps.
struct Harness {
    shard: Shard,
    limits: Arc<Limits>,
    now: i64,
    /// Lease ids ever created, per namespace index.
    leases: [Vec<LeaseId>; 2],
    next_lease: u64,
    /// Parked acquires not answered yet, with their lease and semaphore.
    parked: BTreeMap<WaiterId, (usize, usize)>,
    /// Parked acquires answered or silenced.
    finished: BTreeSet<WaiterId>,
    /// Waiters whose client went away: never answered.
    silenced: BTreeSet<WaiterId>,
    /// Per (namespace, semaphore) name: the last waiter granted from its queue.
    last_grant: BTreeMap<(usize, usize), WaiterId>,
    /// Per (namespace, semaphore) name: the highest fencing token seen.
    max_token: BTreeMap<(usize, usize), i64>,
    /// Holders seen in the last step: (ns, sem, token).
    seen_tokens: BTreeSet<(usize, usize, i64)>,
    /// The journal, replayed.
    replica: BTreeMap<Name, Namespace>,
    replica_hwm: i64,
    /// `FUZZ_TRACE` set: print every request and reply (to triage a crash input).
    trace: bool,
}

fn ns_index(n: &Name) -> usize {
    NSS.iter()
        .position(|x| x.as_bytes() == &n.bytes()[..])
        .expect("known namespace")
}

fn sem_index(n: &Name) -> usize {
    SEMS.iter()
        .position(|x| x.as_bytes() == &n.bytes()[..])
        .expect("known semaphore")
}

impl Harness {
    fn new(limits: Limits) -> Harness {
        let limits = Arc::new(limits);
        Harness {
            shard: Shard::new(limits.clone(), Arc::new(AtomicUsize::new(0))),
            limits,
            now: T0,
            leases: [Vec::new(), Vec::new()],
            next_lease: 1,
            parked: BTreeMap::new(),
            finished: BTreeSet::new(),
            silenced: BTreeSet::new(),
            last_grant: BTreeMap::new(),
            max_token: BTreeMap::new(),
            seen_tokens: BTreeSet::new(),
            replica: BTreeMap::new(),
            replica_hwm: 0,
            trace: std::env::var_os("FUZZ_TRACE").is_some(),
        }
    }

    /// A lease id: one handed out in that namespace, one never handed out, or none (not
    /// shaped like an id).
    fn pick_lease(&self, input: &mut Input, ns: usize) -> Option<LeaseId> {
        let b = input.u8();
        let known = &self.leases[ns];
        match b {
            0xFE => Some(LeaseId::from_counter(999_999)),
            0xFF => None,
            _ if known.is_empty() => Some(LeaseId::from_counter(999_998)),
            // Mostly live ones (in creation order), else any ever handed out.
            _ if b & 0xC0 != 0xC0 => {
                let (nss, _) = self.shard.state();
                let live: Vec<LeaseId> = nss
                    .get(&name(NSS[ns]))
                    .map(|n| n.leases.iter().map(|(_, l)| l.id).collect())
                    .unwrap_or_default();
                if live.is_empty() {
                    Some(known[b as usize % known.len()])
                } else {
                    Some(live[b as usize % live.len()])
                }
            }
            _ => Some(known[b as usize % known.len()]),
        }
    }

    fn held_by(&self, ns: usize, sem: usize, lease: Option<LeaseId>) -> Option<(i64, i64)> {
        let (nss, _) = self.shard.state();
        let s = nss.get(&name(NSS[ns]))?.semaphores.get(&name(SEMS[sem]))?;
        let l = nss.get(&name(NSS[ns]))?.leases.by_id(&lease?)?;
        let token = l.hold_on(s.key)?;
        Some((s.holders.get(token)?.weight, token))
    }

    fn queue_len(&self, ns: usize, sem: usize) -> usize {
        let (nss, _) = self.shard.state();
        nss.get(&name(NSS[ns]))
            .and_then(|n| n.semaphores.get(&name(SEMS[sem])))
            .map_or(0, |s| s.queue.len())
    }

    fn exec(&mut self, req: EngineRequest, may_wait: bool) -> Exec {
        if self.trace {
            eprintln!(
                "t={:.3}s {req:?} may_wait={may_wait}",
                (self.now - T0) as f64 / S as f64
            );
        }
        let e = self.shard.execute(self.now, req, may_wait.then_some(1));
        if self.trace {
            eprintln!("  -> {e:?}");
        }
        if let Exec::Reply(r) = &e {
            check_reply(r);
        }
        e
    }

    fn read(&mut self, req: EngineRequest) -> Reply {
        match self.exec(req, true) {
            Exec::Reply(r) => r,
            Exec::Parked(w) => panic!("a read parked as waiter {w}"),
        }
    }

    /// Runs one operation decoded from `input`.
    fn step(&mut self, input: &mut Input) {
        let op = input.below(16);
        let ns = input.below(2);
        let nsn = name(NSS[ns]);
        match op {
            0 => {
                let d = input.pick(&[
                    0,
                    1,
                    MS,
                    250 * MS,
                    500 * MS,
                    999 * MS,
                    S,
                    S + 500 * MS,
                    2 * S,
                    5 * S,
                    11 * S,
                    301 * S,
                ]);
                self.now += d;
                let advance = input.u8() & 1 == 0;
                if self.trace {
                    eprintln!("time +{d}ns advance={advance}");
                }
                if advance {
                    self.shard.advance(self.now);
                }
            }
            1 | 2 => {
                let ttl = 1 + input.below(10) as i64;
                let id = LeaseId::from_counter(self.next_lease);
                self.next_lease += 1;
                let req = EngineRequest::LeaseCreate(LeaseCreate {
                    ns: nsn,
                    id,
                    process_id: Bytes::from(vec![b'p', b'0' + input.below(2) as u8]),
                    ttl: ttl * S,
                    meta: Metadata::default(),
                });
                if let Exec::Reply(r) = self.exec(req, true) {
                    if !r.is_error() {
                        assert_eq!(int_field(&r, "expires_at"), self.now + ttl * S);
                        self.leases[ns].push(id);
                    }
                }
            }
            3 => {
                let lease = self.pick_lease(input, ns);
                let ttl = 1 + input.below(10) as i64;
                self.exec(
                    EngineRequest::LeaseRefresh(LeaseRefresh {
                        ns: nsn,
                        lease,
                        ttl: ttl * S,
                    }),
                    true,
                );
            }
            4 => {
                let lease = self.pick_lease(input, ns);
                self.exec(
                    EngineRequest::LeaseRevoke(LeaseRevoke { ns: nsn, lease }),
                    true,
                );
            }
            5..=9 => self.acquire(input, ns),
            10 => {
                let sem = input.below(3);
                let lease = self.pick_lease(input, ns);
                self.exec(
                    EngineRequest::SemRelease(SemRelease {
                        ns: nsn,
                        sem: name(SEMS[sem]),
                        lease,
                    }),
                    true,
                );
            }
            11 => {
                let sem = input.below(3);
                let permits = 1 + input.below(6) as i64;
                let stale = input.u8() < 32;
                let (nss, _) = self.shard.state();
                let version = nss
                    .get(&nsn)
                    .and_then(|n| n.semaphores.get(&name(SEMS[sem])))
                    .map_or(1, |s| s.version)
                    + stale as i64;
                self.exec(
                    EngineRequest::SemUpdate(SemUpdate {
                        ns: nsn,
                        sem: name(SEMS[sem]),
                        permits,
                        version,
                        desc: Bytes::new(),
                        meta: Metadata::default(),
                    }),
                    true,
                );
            }
            12 => {
                let sem = input.below(3);
                let permits = 1 + input.below(6) as i64;
                self.exec(
                    EngineRequest::SemCreate(SemCreate {
                        ns: nsn,
                        sem: name(SEMS[sem]),
                        permits,
                        desc: Bytes::new(),
                        meta: Metadata::default(),
                    }),
                    true,
                );
            }
            13 => {
                let sem = input.below(3);
                if input.u8() < 64 {
                    self.exec(
                        EngineRequest::SemDelete(SemDelete {
                            ns: nsn,
                            sem: name(SEMS[sem]),
                        }),
                        true,
                    );
                } else {
                    self.paging_check(ns, sem, 1 + input.below(3));
                }
            }
            14 => {
                if input.u8() < 24 {
                    self.exec(EngineRequest::NsDelete(NsDelete { ns: nsn }), true);
                } else {
                    self.exec(
                        EngineRequest::NsCreate(NsCreate {
                            ns: nsn,
                            desc: Bytes::new(),
                            meta: Metadata::default(),
                        }),
                        true,
                    );
                }
            }
            _ => {
                let how = input.pick(&[
                    Cancel::Disconnected,
                    Cancel::UnblockTimeout,
                    Cancel::UnblockError,
                ]);
                let b = input.u8() as usize;
                let waiter = if self.parked.is_empty() || b == 0xFF {
                    (b as u64) + 1
                } else {
                    *self
                        .parked
                        .keys()
                        .nth(b % self.parked.len())
                        .expect("in range")
                };
                let was_parked = self.parked.contains_key(&waiter);
                let cancelled = self.shard.cancel(self.now, waiter, how);
                // cancel() fires what is due first, which may answer the waiter.
                if cancelled {
                    assert!(was_parked, "cancelled waiter {waiter} that never parked");
                    hit(match how {
                        Cancel::Disconnected => "cancel: client gone",
                        _ => "cancel: CLIENT UNBLOCK",
                    });
                    if how == Cancel::Disconnected {
                        self.silenced.insert(waiter);
                    }
                }
            }
        }
    }

    fn acquire(&mut self, input: &mut Input, ns: usize) {
        let sem = input.below(3);
        let lease = self.pick_lease(input, ns);
        let weight = input.pick(&[1, 1, 1, 2, 2, 3, 4, 6, 7]);
        let timeout = input.pick(&[0, 0, 0, 1, 250 * MS, S, 2 * S + 500 * MS, 5 * S, 300 * S]);
        let may_wait = input.u8() >= 24;
        let meta = match input.below(3) {
            0 => Metadata::default(),
            k => Metadata::from_pairs(vec![(Bytes::from("k"), Bytes::from(vec![b'0' + k as u8]))]),
        };
        // What the acquire may do depends on the state before it: fire due timers first, and
        // account for the holders they made (their tokens are older than this acquire's).
        self.shard.advance(self.now);
        self.check(true);
        let before = self.held_by(ns, sem, lease);
        let queued = self.queue_len(ns, sem);
        let req = EngineRequest::SemAcquire(SemAcquire {
            ns: name(NSS[ns]),
            sem: name(SEMS[sem]),
            lease,
            weight,
            timeout,
            meta,
        });
        match self.exec(req, may_wait) {
            Exec::Parked(w) => {
                hit(if queued > 0 {
                    "parked behind others"
                } else {
                    "parked"
                });
                assert!(may_wait && timeout > 0, "parked without a timeout");
                assert!(!self.parked.contains_key(&w) && !self.finished.contains(&w));
                self.parked.insert(w, (ns, sem));
            }
            Exec::Reply(r) => {
                if outcome(&r) == Some(b"ACQUIRE_OUTCOME_ACQUIRED") {
                    let token = int_field(&r, "fencing_token");
                    let s = field(&r, "semaphore").expect("semaphore");
                    assert!(weight <= int_field(s, "permits"));
                    match before {
                        Some((held, old)) => {
                            hit("re-acquire");
                            assert_eq!(token, old, "a re-acquire keeps its fencing token");
                            // Growing while others wait would jump the queue.
                            assert!(weight <= held || queued == 0, "grew past {queued} waiters");
                        }
                        None => {
                            assert_eq!(queued, 0, "acquired past {queued} waiters");
                            let max = self.max_token.entry((ns, sem)).or_insert(0);
                            assert!(token > *max, "token {token} not above {max}");
                            *max = token;
                            self.seen_tokens.insert((ns, sem, token));
                        }
                    }
                } else if outcome(&r) == Some(b"ACQUIRE_OUTCOME_UNAVAILABLE") {
                    hit("unavailable");
                    assert!(
                        !may_wait || timeout == 0,
                        "UNAVAILABLE for a waiting acquire"
                    );
                } else if outcome(&r).is_some() {
                    panic!("immediate outcome {r:?}");
                }
            }
        }
    }

    /// SEM.HOLDERS page by page: each page but the last is full, the pages make up the whole
    /// list, and `previous_cursor` leads back to exactly the page before.
    fn paging_check(&mut self, ns: usize, sem: usize, limit: usize) {
        let holders = |h: &mut Harness, cursor: Option<Cursor>, limit: usize| {
            h.read(EngineRequest::SemHolders(SemHolders {
                ns: name(NSS[ns]),
                sem: name(SEMS[sem]),
                page: Page { cursor, limit },
            }))
        };
        let all = holders(self, None, 250);
        if all.is_error() {
            return;
        }
        let items = |r: &Reply| -> Vec<Reply> {
            match field(r, "holders") {
                Some(Reply::Array(a)) => a.clone(),
                other => panic!("holders: {other:?}"),
            }
        };
        let cursor_of = |r: &Reply, key: &str| -> Option<Cursor> {
            match field(r, key) {
                Some(Reply::Bulk(b)) if b.is_empty() => None,
                Some(Reply::Bulk(b)) => {
                    Some(Cursor::decode(b, CursorKind::Holders).expect("server's own cursor"))
                }
                other => panic!("{key}: {other:?}"),
            }
        };
        let want = items(&all);
        let mut pages: Vec<Reply> = vec![holders(self, None, limit)];
        while let Some(c) = cursor_of(pages.last().expect("one page"), "next_cursor") {
            assert!(pages.len() <= want.len() + 1, "pages do not end");
            pages.push(holders(self, Some(c), limit));
        }
        if pages.len() > 1 {
            hit("holders over several pages");
        }
        let mut got = Vec::new();
        for (i, p) in pages.iter().enumerate() {
            let its = items(p);
            if i + 1 < pages.len() {
                assert_eq!(its.len(), limit, "a page before the last is not full");
            }
            if i > 0 {
                let c = cursor_of(p, "previous_cursor").expect("a later page has a previous");
                let back = holders(self, Some(c), limit);
                assert_eq!(items(&back), items(&pages[i - 1]), "previous_cursor");
            } else {
                assert!(cursor_of(p, "previous_cursor").is_none());
            }
            got.extend(its);
        }
        assert_eq!(got, want, "pages together are the whole list");
    }

    /// Takes the outbox and checks each reply of a parked acquire.
    fn drain(&mut self) {
        for (w, r) in self.shard.take_outbox() {
            if self.trace {
                eprintln!("  waiter {w} <- {r:?}");
            }
            check_reply(&r);
            assert!(
                !self.silenced.contains(&w),
                "waiter {w} answered after its client left"
            );
            let Some((ns, sem)) = self.parked.remove(&w) else {
                panic!("reply for waiter {w}, which is not parked: {r:?}");
            };
            assert!(self.finished.insert(w), "waiter {w} answered twice");
            hit(match (&r, outcome(&r)) {
                (_, Some(b"ACQUIRE_OUTCOME_ACQUIRED")) => "waiter granted",
                (_, Some(_)) => "waiter timed out",
                (Reply::Error(e), _) if e.message().starts_with("lease") => {
                    "waiter ended: lease gone"
                }
                (Reply::Error(e), _) if e.message().starts_with("semaphore") => {
                    "waiter ended: semaphore deleted"
                }
                (Reply::Error(e), _) if e.message().starts_with("namespace") => {
                    "waiter ended: namespace deleted"
                }
                (Reply::Error(e), _) if e.message().contains("exceeds") => {
                    "waiter ended: permits lowered"
                }
                (Reply::Error(e), _) if e.code() == "UNBLOCKED" => "waiter ended: unblocked",
                _ => "waiter ended: other",
            });
            if outcome(&r) == Some(b"ACQUIRE_OUTCOME_ACQUIRED") {
                let last = self.last_grant.entry((ns, sem)).or_insert(0);
                assert!(w > *last, "FIFO: waiter {w} granted after waiter {last}");
                *last = w;
            } else if outcome(&r) == Some(b"ACQUIRE_OUTCOME_UNAVAILABLE") {
                panic!("a parked acquire answered UNAVAILABLE");
            }
        }
        for w in &self.silenced {
            if self.parked.remove(w).is_some() {
                self.finished.insert(*w);
            }
        }
    }

    /// Replays the new journal records (after an encode/decode round trip) into the replica.
    fn replay(&mut self) {
        for rec in self.shard.take_journal() {
            let mut out = BytesMut::new();
            codec::encode_record(&rec, &mut out);
            let mut dec = codec::Dec::new(out.freeze());
            let back = codec::decode_record(&mut dec).expect("a record decodes");
            assert!(dec.is_empty(), "record decoding left bytes");
            assert_eq!(back, rec, "record codec round trip");
            hit(match &rec {
                journal::Record::LeaseDel { .. } => "journal: lease deleted",
                journal::Record::HoldSet { .. } => "journal: hold set",
                journal::Record::HoldDel { .. } => "journal: hold released",
                _ => "journal: other record",
            });
            journal::apply(&mut self.replica, &mut self.replica_hwm, back)
                .unwrap_or_else(|e| panic!("journal does not replay: {}", e.0));
        }
    }

    /// The invariants after a step. `advanced`: every timer due at `now` has fired.
    fn check(&mut self, advanced: bool) {
        self.drain();
        self.replay();
        self.shard.check();
        let now = self.now;
        if advanced {
            if let Some(t) = self.shard.next_deadline() {
                assert!(t > now, "a timer due at {t} has not fired at {now}");
            }
        }
        let limits = self.limits.clone();
        let (nss, hwm) = self.shard.state();
        let mut waiters = 0;
        let mut holders_total = 0;
        let mut leases_total = 0;
        let mut semaphores_total = 0;
        let mut seen = BTreeSet::new();
        for (nname, n) in nss {
            let ni = ns_index(nname);
            leases_total += n.leases.len();
            semaphores_total += n.semaphores.len();
            let mut serial = None;
            for (_, l) in n.leases.iter() {
                assert!(serial < Some(l.serial), "leases out of creation order");
                serial = Some(l.serial);
                if advanced {
                    assert!(l.expires_at > now, "a dead lease is still there");
                }
            }
            for (sname, s) in &n.semaphores {
                let si = sem_index(sname);
                let sum: i64 = s.holders.iter().map(|h| h.weight).sum();
                assert_eq!(
                    s.active_holds, sum,
                    "active_holds is not the sum of the weights"
                );
                assert!(
                    s.permits > 0 && s.active_holds <= s.permits,
                    "{} of {}",
                    s.active_holds,
                    s.permits
                );
                assert!(s.holders.len() <= limits.max_holders_per_semaphore);
                holders_total += s.holders.len();
                for h in s.holders.iter() {
                    let token = &h.token;
                    assert!(h.weight > 0 && h.weight <= s.permits);
                    assert!(*token <= hwm, "token above the high-water mark");
                    let l = n
                        .leases
                        .get(h.lease)
                        .expect("a holder of a lease that is gone");
                    if advanced {
                        assert!(l.expires_at > now, "a holder of a dead lease");
                    }
                    // Tokens only rise: a holder not seen before is newer than all seen.
                    if !self.seen_tokens.contains(&(ni, si, *token)) {
                        let max = self.max_token.entry((ni, si)).or_insert(0);
                        assert!(*token > *max, "new holder token {token} not above {max}");
                        *max = *token;
                    }
                    seen.insert((ni, si, *token));
                }
                waiters += s.queue.len();
                if let Some((w, head)) = s.queue.first_key_value() {
                    // Strict FIFO: the head waits only because it does not fit yet.
                    assert!(
                        head.weight <= s.permits,
                        "head waiter heavier than the permits"
                    );
                    let held = s.held_by(&n.leases[head.lease]);
                    let fits = s.available() >= head.weight - held.unwrap_or(0);
                    let quota =
                        held.is_none() && s.holders.len() >= limits.max_holders_per_semaphore;
                    assert!(!fits || quota, "head waiter {w} fits but waits");
                    assert!(!quota, "head waiter {w} waits on a full holder quota");
                }
                for (w, q) in &s.queue {
                    assert!(
                        self.parked.get(w) == Some(&(ni, si)),
                        "queued waiter {w} unknown"
                    );
                    assert!(q.weight > 0);
                    if advanced {
                        assert!(q.deadline > now, "waiter {w} past its deadline");
                    }
                }
            }
        }
        self.seen_tokens = seen;
        assert_eq!(
            waiters,
            self.parked.len(),
            "parked acquires lost or unanswered"
        );
        let c = self.shard.counts();
        assert_eq!(c.namespaces as usize, nss.len());
        assert_eq!(c.waiters as usize, waiters);
        assert_eq!(c.holders as usize, holders_total);
        assert_eq!(c.leases as usize, leases_total);
        assert_eq!(c.semaphores as usize, semaphores_total);
        // The journal replayed gives the same state (queues are not journaled).
        assert!(
            self.replica_hwm <= hwm,
            "replayed tokens above the high-water mark"
        );
        compare_states(nss, &self.replica);
    }
}

fn compare_states(a: &BTreeMap<Name, Namespace>, b: &BTreeMap<Name, Namespace>) {
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>(),
        "replay: namespaces"
    );
    for (k, x) in a {
        let y = &b[k];
        assert_eq!(
            (
                &x.description,
                &x.metadata,
                x.version,
                x.created_at,
                x.updated_at
            ),
            (
                &y.description,
                &y.metadata,
                y.version,
                y.created_at,
                y.updated_at
            ),
            "replay: namespace {k:?}"
        );
        // Handles and keys are each shard's own: leases and holds compare by id and name.
        let order = |n: &Namespace| -> Vec<(u64, LeaseId)> {
            n.leases.iter().map(|(_, l)| (l.serial, l.id)).collect()
        };
        assert_eq!(order(x), order(y), "replay: lease order");
        let holds = |n: &Namespace, l: &permitd::engine::leases::Lease| {
            let mut h: Vec<(Name, i64)> = l
                .holds
                .iter()
                .map(|(k, t)| (n.sem_keys.get(k).expect("live").clone(), t))
                .collect();
            h.sort();
            h
        };
        for (_, l) in x.leases.iter() {
            let m = y.leases.by_id(&l.id).expect("replay: lease missing");
            assert_eq!(
                (
                    &l.process_id,
                    l.created_at,
                    l.expires_at,
                    &l.metadata,
                    holds(x, l)
                ),
                (
                    &m.process_id,
                    m.created_at,
                    m.expires_at,
                    &m.metadata,
                    holds(y, m)
                ),
                "replay: lease"
            );
        }
        assert_eq!(
            x.semaphores.keys().collect::<Vec<_>>(),
            y.semaphores.keys().collect::<Vec<_>>(),
            "replay: semaphores of {k:?}"
        );
        for (sn, s) in &x.semaphores {
            let t = &y.semaphores[sn];
            assert_eq!(
                (
                    s.permits,
                    s.active_holds,
                    s.version,
                    s.created_at,
                    s.updated_at,
                    s.last_activity_at,
                    &s.description,
                    &s.metadata
                ),
                (
                    t.permits,
                    t.active_holds,
                    t.version,
                    t.created_at,
                    t.updated_at,
                    t.last_activity_at,
                    &t.description,
                    &t.metadata
                ),
                "replay: semaphore {sn:?}"
            );
            let hs = |n: &Namespace, s: &permitd::engine::state::Semaphore| {
                s.holders
                    .iter()
                    .map(|h| {
                        (
                            h.token,
                            n.leases[h.lease].id,
                            h.weight,
                            h.locked_at,
                            h.metadata.clone(),
                        )
                    })
                    .collect::<Vec<_>>()
            };
            assert_eq!(hs(x, s), hs(y, t), "replay: holders of {sn:?}");
        }
    }
}

/// Input: `[limits, ops...]`: an operation stream (time jumps, leases, acquires, releases,
/// updates, deletes, cancels, paged reads) on two namespaces of three semaphores.
pub fn engine(data: &[u8]) {
    let mut input = Input::new(data);
    let sel = input.u8();
    let limits = Limits {
        max_holders_per_semaphore: [2, 3, 1000][sel as usize % 3],
        max_waiters_per_semaphore: [3, 1000][(sel as usize / 3) % 2],
        max_waiters: [4, 1_000_000][(sel as usize / 6) % 2],
        ..Limits::default()
    };
    let mut h = Harness::new(limits);
    // Both namespaces with their semaphores, so most operations do something.
    for ns in NSS {
        h.exec(
            EngineRequest::NsCreate(NsCreate {
                ns: name(ns),
                desc: Bytes::new(),
                meta: Metadata::default(),
            }),
            true,
        );
        for (sem, permits) in [3, 1, 5].into_iter().enumerate() {
            h.exec(
                EngineRequest::SemCreate(SemCreate {
                    ns: name(ns),
                    sem: name(SEMS[sem]),
                    permits,
                    desc: Bytes::new(),
                    meta: Metadata::default(),
                }),
                true,
            );
        }
    }
    h.check(true);
    let mut steps = 0;
    while !input.done() && steps < 2000 {
        steps += 1;
        let before = input.pos;
        let op = input.data[before] % 16;
        let expired = h.shard.stats().leases_expired;
        h.step(&mut input);
        if h.shard.stats().leases_expired > expired {
            hit("lease expired");
        }
        // A time jump without `advance` leaves due timers for the next command to fire.
        let advanced = op != 0 || h.shard.next_deadline().is_none_or(|t| t > h.now);
        h.check(advanced);
    }
    // Run out the clock: every lease dies, every parked acquire is answered exactly once.
    h.now += 400 * S;
    h.shard.advance(h.now);
    h.check(true);
    assert!(
        h.parked.is_empty(),
        "waiters left after every deadline: {:?}",
        h.parked
    );
    assert_eq!(h.shard.counts().waiters, 0);
    assert_eq!(h.shard.counts().holders, 0);
    assert_eq!(h.shard.counts().leases, 0);
    assert_eq!(h.shard.next_deadline(), None);
}

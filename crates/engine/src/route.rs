//! Which shard owns a namespace: every command of a namespace runs on that shard's thread, and
//! its state is logged and snapshotted there.

use super::types::Name;

/// The shard owning namespace `ns` among `shards`. Stable across runs (fixed hash seeds), so a
/// restart with the same `--shards` finds each namespace where its log put it; a restart with
/// another count re-shards at load.
pub fn shard_for(ns: &Name, shards: usize) -> usize {
    let h = ahash::RandomState::with_seeds(0x7065, 0x726d, 0x6974, 0x64);
    (h.hash_one(ns.bytes().as_ref()) % shards as u64) as usize
}

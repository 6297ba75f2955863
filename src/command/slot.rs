//! Redis Cluster's hash slots: which of the 16384 slots a key (for permitd, a namespace) is in,
//! by CRC16 with Redis's `{hash tag}` rule. `CLUSTER KEYSLOT` answers with it, and cluster-aware
//! clients compute the same number to pick the node a command goes to; a node that does not
//! serve a slot will answer `MOVED <slot> ...` with it (SPEC §10).
//!
//! It lives in the command layer because the key it hashes is the one the command table names
//! (each command's first key, the namespace), and because this layer sits below the server and
//! any cluster module, so both use this one function without a cycle. It is not the engine's
//! `route.rs`: that spreads namespaces over one node's shards (ahash), which no client sees,
//! while this is the routing between nodes that every cluster client computes for itself.

/// How many slots a Redis cluster has.
pub const SLOTS: u16 = 16384;

/// The slot of `key`: the CRC16 of its hash tag (the bytes between the first `{` and the first
/// `}` after it, when there are any) or else of the whole key, modulo [`SLOTS`]. As Redis's
/// `keyHashSlot`: `{}` (an empty tag) and a `{` never closed hash the whole key.
pub fn key_slot(key: &[u8]) -> u16 {
    crc16(hash_tag(key).unwrap_or(key)) & (SLOTS - 1)
}

/// The non-empty `{tag}` of `key`, if it has one.
fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|&b| b == b'{')?;
    let rest = &key[open + 1..];
    let close = rest.iter().position(|&b| b == b'}')?;
    (close > 0).then(|| &rest[..close])
}

/// CRC16 as Redis Cluster computes it: the XMODEM variant (polynomial 0x1021, initial value 0,
/// no reflection, no final xor). Bit by bit: keys are namespaces of at most a few hundred
/// bytes, and a 512-byte table would buy nothing measurable here.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_is_xmodem() {
        // The check value Redis's crc16.c gives for its variant.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(crc16(b""), 0);
    }

    #[test]
    fn slots_match_redis() {
        // Redis's tests/unit/moduleapi/misc.tcl: CLUSTER KEYSLOT foo.
        assert_eq!(key_slot(b"foo"), 12182);
        // Redis's src/crc16_slottable.h lists, for every slot, the shortest key in it; its
        // module test checks that `x{key}y` lands in the same slot. A sample across the range:
        let table: &[(u16, &[u8])] = &[
            (0, b"06S"),
            (1, b"Qi"),
            (2, b"5L5"),
            (3, b"4Iu"),
            (4, b"4gY"),
            (5, b"460"),
            (8000, b"42"),
            (8001, b"27B"),
            (12182, b"9Le"),
            (16379, b"YY"),
            (16380, b"wu"),
            (16381, b"0TG"),
            (16382, b"4oi"),
            (16383, b"6ZJ"),
        ];
        for &(slot, key) in table {
            assert_eq!(key_slot(key), slot, "{}", String::from_utf8_lossy(key));
            let tagged = [&b"x{"[..], key, b"}y"].concat();
            assert_eq!(
                key_slot(&tagged),
                slot,
                "{}",
                String::from_utf8_lossy(&tagged)
            );
        }
    }

    #[test]
    fn hash_tags_follow_redis_rules() {
        // The examples of the Redis Cluster specification ("Hash tags").
        assert_eq!(
            key_slot(b"{user1000}.following"),
            key_slot(b"{user1000}.followers")
        );
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        // An empty tag: the whole key is hashed.
        assert_eq!(key_slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") & 0x3FFF);
        // The tag ends at the first `}` after the first `{`.
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
        assert_eq!(key_slot(b"foo{{bar}}zap"), crc16(b"{bar") & 0x3FFF);
        // Only the first tag counts.
        assert_eq!(key_slot(b"foo{bar}{zap}"), key_slot(b"bar"));
        // A `{` never closed: the whole key.
        assert_eq!(key_slot(b"foo{bar"), crc16(b"foo{bar") & 0x3FFF);
        assert_eq!(key_slot(b"}foo{"), crc16(b"}foo{") & 0x3FFF);
    }
}

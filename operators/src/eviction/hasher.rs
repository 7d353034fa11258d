//! A fast, deterministic hasher for integer keys. Cache keys are already
//! well-mixed ids or hashes and never attacker-chosen inside a node, so
//! SipHash's DoS resistance buys nothing here and costs most of a lookup.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// Multiply-xorshift hasher (one multiply per word).
#[derive(Default, Clone, Copy, Debug)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        let x = self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        x ^ (x >> 29)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x0100_0000_01B3);
        }
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0 ^ i).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    }
    fn write_u32(&mut self, i: u32) {
        self.write_u64(i as u64);
    }
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
}

pub type KeyMap<K, V> = HashMap<K, V, BuildHasherDefault<KeyHasher>>;
pub type KeySet<K> = HashSet<K, BuildHasherDefault<KeyHasher>>;

pub fn key_map<K, V>() -> KeyMap<K, V> {
    KeyMap::default()
}

pub fn key_set<K>() -> KeySet<K> {
    KeySet::default()
}

//! Least-recently-used: a doubly linked list in a slab plus a key index.

use std::collections::hash_map::Entry;

use super::{EvictCtx, EvictionPolicy, Key, KeyMap, key_map};

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Node {
    key: Key,
    prev: u32,
    next: u32,
}

/// LRU order of the resident keys; `head` is the most recent.
#[derive(Clone, Debug, Default)]
pub struct Lru {
    index: KeyMap<Key, u32>,
    nodes: Vec<Node>,
    free: Vec<u32>,
    head: u32,
    tail: u32,
}

impl Lru {
    pub fn new() -> Self {
        Self {
            index: key_map(),
            nodes: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
        }
    }

    fn unlink(&mut self, i: u32) {
        let Node { prev, next, .. } = self.nodes[i as usize];
        if prev == NIL {
            self.head = next;
        } else {
            self.nodes[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.nodes[next as usize].prev = prev;
        }
    }

    fn push_front(&mut self, i: u32) {
        self.nodes[i as usize].prev = NIL;
        self.nodes[i as usize].next = self.head;
        if self.head != NIL {
            self.nodes[self.head as usize].prev = i;
        } else {
            self.tail = i;
        }
        self.head = i;
    }

    /// An empty LRU whose index has room for `capacity` keys.
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            index: KeyMap::with_capacity_and_hasher(capacity, Default::default()),
            nodes: Vec::with_capacity(capacity),
            ..Self::new()
        }
    }

    /// Resident keys from least to most recent (tests, debugging).
    pub fn keys_lru_first(&self) -> Vec<Key> {
        let mut out = Vec::with_capacity(self.index.len());
        let mut i = self.tail;
        while i != NIL {
            out.push(self.nodes[i as usize].key);
            i = self.nodes[i as usize].prev;
        }
        out
    }
}

impl EvictionPolicy for Lru {
    fn name(&self) -> &'static str {
        "lru"
    }

    fn clone_box(&self) -> Option<Box<dyn EvictionPolicy>> {
        Some(Box::new(self.clone()))
    }

    fn access(&mut self, key: Key, _now: u64) -> bool {
        match self.index.get(&key) {
            Some(&i) => {
                if self.head != i {
                    self.unlink(i);
                    self.push_front(i);
                }
                true
            }
            None => false,
        }
    }

    fn insert(&mut self, key: Key, _now: u64) {
        // One probe finds the key or its slot.
        let Entry::Vacant(slot) = self.index.entry(key) else {
            return;
        };
        let node = Node {
            key,
            prev: NIL,
            next: NIL,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        slot.insert(i);
        self.push_front(i);
    }

    fn evict(&mut self, _now: u64, ctx: &mut EvictCtx<'_>) -> Option<Key> {
        let mut i = self.tail;
        while i != NIL {
            let key = self.nodes[i as usize].key;
            if ctx.may_evict(key) {
                self.remove(key);
                return Some(key);
            }
            i = self.nodes[i as usize].prev;
        }
        None
    }

    fn remove(&mut self, key: Key) -> bool {
        let Some(i) = self.index.remove(&key) else {
            return false;
        };
        self.unlink(i);
        self.free.push(i);
        true
    }

    fn contains(&self, key: Key) -> bool {
        self.index.contains_key(&key)
    }

    fn len(&self) -> usize {
        self.index.len()
    }
}

//! The catalog's semantic-ID index for generative retrieval (xGR §6.1): the
//! trie that keeps beam search on valid items, and the way back from a
//! generated semantic ID to an item id.

use std::collections::HashMap;

use grflow_kernels::{KernelError, SidTrie};

#[derive(Debug)]
pub struct RetrievalIndex {
    trie: SidTrie,
    items: HashMap<[u16; 3], u32>,
}

impl RetrievalIndex {
    /// Indexes `(item, semantic id)` pairs. Items sharing a semantic ID are
    /// served as the lowest item id, so results do not depend on input order.
    pub fn new(
        items: impl IntoIterator<Item = (u32, [u16; 3])>,
        codebook_size: usize,
    ) -> Result<Self, KernelError> {
        let mut by_sid: HashMap<[u16; 3], u32> = HashMap::new();
        for (item, sid) in items {
            by_sid
                .entry(sid)
                .and_modify(|held| *held = (*held).min(item))
                .or_insert(item);
        }
        let mut sids: Vec<[u16; 3]> = by_sid.keys().copied().collect();
        sids.sort_unstable();
        Ok(Self {
            trie: SidTrie::new(&sids, codebook_size)?,
            items: by_sid,
        })
    }

    pub fn trie(&self) -> &SidTrie {
        &self.trie
    }

    /// The item a generated semantic ID stands for.
    pub fn item(&self, sid: [u16; 3]) -> Option<u32> {
        self.items.get(&sid).copied()
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_semantic_ids_resolve_to_the_lowest_item() {
        let index =
            RetrievalIndex::new([(9, [1, 2, 3]), (4, [1, 2, 3]), (5, [0, 0, 1])], 8).unwrap();
        assert_eq!(index.len(), 2);
        assert_eq!(index.item([1, 2, 3]), Some(4));
        assert_eq!(index.item([0, 0, 1]), Some(5));
        assert_eq!(index.item([7, 7, 7]), None);
        assert!(index.trie().contains([0, 0, 1]));
    }

    #[test]
    fn codes_outside_the_codebook_are_rejected() {
        assert!(RetrievalIndex::new([(1, [9, 0, 0])], 8).is_err());
    }
}

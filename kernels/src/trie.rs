//! Valid-path constraint of generative retrieval (xGR §6.1): a trie of the
//! catalog's semantic-ID triplets. Step 0 uses a dense mask built once;
//! steps 1 and 2 use sparse child lists of the beam's trie node.

use crate::error::KernelError;

/// Trie over `[c0, c1, c2]` codes, stored as CSR arrays.
#[derive(Clone, Debug)]
pub struct SidTrie {
    codebook_size: usize,
    /// Dense step-0 mask: 0 for valid first codes, -inf otherwise.
    first_mask: Vec<f32>,
    /// Level-1 nodes of first code c0: `l1_start[c0]..l1_start[c0+1]`.
    l1_start: Vec<u32>,
    l1_code: Vec<u16>,
    /// Level-2 leaves of level-1 node n: `l2_start[n]..l2_start[n+1]`.
    l2_start: Vec<u32>,
    l2_code: Vec<u16>,
    items: usize,
}

impl SidTrie {
    /// Builds the trie of valid items; duplicates are merged. Codes must be
    /// below `codebook_size`.
    pub fn new(sids: &[[u16; 3]], codebook_size: usize) -> Result<Self, KernelError> {
        if let Some(bad) = sids
            .iter()
            .find(|s| s.iter().any(|&c| c as usize >= codebook_size))
        {
            return Err(KernelError::SidOutOfRange {
                sid: *bad,
                codebook_size,
            });
        }
        let mut sorted = sids.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let mut first_mask = vec![f32::NEG_INFINITY; codebook_size];
        let mut l1_start = vec![0u32; codebook_size + 1];
        let (mut l1_code, mut l2_start, mut l2_code) = (Vec::new(), Vec::new(), Vec::new());
        let mut prev: Option<[u16; 3]> = None;
        for s in &sorted {
            let new_l1 = prev.is_none_or(|p| p[0] != s[0] || p[1] != s[1]);
            if new_l1 {
                first_mask[s[0] as usize] = 0.0;
                l1_start[s[0] as usize + 1] += 1;
                l1_code.push(s[1]);
                l2_start.push(l2_code.len() as u32);
            }
            l2_code.push(s[2]);
            prev = Some(*s);
        }
        l2_start.push(l2_code.len() as u32);
        for c in 0..codebook_size {
            l1_start[c + 1] += l1_start[c];
        }
        Ok(Self {
            codebook_size,
            first_mask,
            l1_start,
            l1_code,
            l2_start,
            l2_code,
            items: sorted.len(),
        })
    }

    pub fn codebook_size(&self) -> usize {
        self.codebook_size
    }

    /// Distinct valid items.
    pub fn len(&self) -> usize {
        self.items
    }

    pub fn is_empty(&self) -> bool {
        self.items == 0
    }

    /// The dense additive step-0 mask (0 or -inf per first code).
    pub fn first_mask(&self) -> &[f32] {
        &self.first_mask
    }

    /// Valid second codes after `c0`, with the index of the first child node
    /// (child `j` is node `first + j`). A `c0` outside the codebook has no
    /// children: an empty slice (and `first` 0).
    pub fn children_of_first(&self, c0: u16) -> (&[u16], u32) {
        let c0 = c0 as usize;
        if c0 >= self.codebook_size {
            return (&[], 0);
        }
        let (a, b) = (self.l1_start[c0], self.l1_start[c0 + 1]);
        (&self.l1_code[a as usize..b as usize], a)
    }

    /// Valid third codes under level-1 node `node`; empty for a `node` that
    /// is not one (at or past the number of level-1 nodes).
    pub fn children_of_node(&self, node: u32) -> &[u16] {
        let n = node as usize;
        // `l2_start` holds one entry per level-1 node and the end.
        if n >= self.l2_start.len().saturating_sub(1) {
            return &[];
        }
        let (a, b) = (self.l2_start[n], self.l2_start[n + 1]);
        &self.l2_code[a as usize..b as usize]
    }

    /// Whether the triplet is a catalog item.
    pub fn contains(&self, sid: [u16; 3]) -> bool {
        if sid[0] as usize >= self.codebook_size {
            return false;
        }
        let (l1, first) = self.children_of_first(sid[0]);
        match l1.binary_search(&sid[1]) {
            Ok(j) => self
                .children_of_node(first + j as u32)
                .binary_search(&sid[2])
                .is_ok(),
            Err(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trie_holds_exactly_the_catalog() {
        let cat = [[1, 2, 3], [1, 2, 4], [1, 5, 0], [7, 0, 0], [1, 2, 3]];
        let t = SidTrie::new(&cat, 8).unwrap();
        assert_eq!(t.len(), 4);
        for s in cat {
            assert!(t.contains(s));
        }
        assert!(!t.contains([1, 2, 5]) && !t.contains([0, 0, 0]) && !t.contains([7, 1, 0]));
        assert_eq!(t.first_mask().iter().filter(|v| **v == 0.0).count(), 2);
        let (c1, first) = t.children_of_first(1);
        assert_eq!(c1, &[2, 5]);
        assert_eq!(t.children_of_node(first), &[3, 4]);
        assert!(SidTrie::new(&[[8, 0, 0]], 8).is_err());
    }

    #[test]
    fn children_out_of_range_are_empty() {
        let t = SidTrie::new(&[[1, 2, 3], [7, 0, 0]], 8).unwrap();
        // First codes past the codebook, up to the largest u16.
        for c0 in [8, 9, u16::MAX] {
            assert_eq!(t.children_of_first(c0), (&[][..], 0));
        }
        // Two level-1 nodes: 0 and 1; anything past them has no children.
        assert_eq!(t.children_of_node(1), &[0]);
        for n in [2, 3, u32::MAX] {
            assert!(t.children_of_node(n).is_empty());
        }
        let empty = SidTrie::new(&[], 8).unwrap();
        assert!(empty.children_of_first(0).0.is_empty());
        assert!(empty.children_of_node(0).is_empty());
        assert!(!t.contains([9, 0, 0]) && !t.contains([u16::MAX, 0, 0]));
    }
}

//! The device memory pool (HLEM §IV-B): M bytes cut into fixed pages of one
//! KV block each. The EMB cache owns a set of pages (α of the pool, several
//! rows per page); the KV caches draw single pages from the rest. Pages are
//! real storage: the model reads and writes KV blocks in place by page id
//! through [`grflow_kernels::KvBlockStore`].

use grflow_kernels::KvBlockStore;

/// Who holds a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tenant {
    /// In the KV share, unused.
    Free,
    /// Lent to the EMB cache.
    Emb,
    /// Holds a KV block (user-prefix, item-prefix or scratch).
    Kv,
}

/// Fixed pages of `page_floats` f32 each.
#[derive(Debug)]
pub struct PagePool {
    page_floats: usize,
    data: Vec<f32>,
    tenant: Vec<Tenant>,
    /// Free pages of the KV share; popped from the back.
    free: Vec<u32>,
}

impl PagePool {
    pub fn new(pages: usize, page_floats: usize) -> Self {
        Self {
            page_floats,
            data: vec![0.0; pages * page_floats],
            tenant: vec![Tenant::Free; pages],
            free: (0..pages as u32).rev().collect(),
        }
    }

    pub fn pages(&self) -> usize {
        self.tenant.len()
    }

    pub fn page_floats(&self) -> usize {
        self.page_floats
    }

    pub fn page_bytes(&self) -> usize {
        self.page_floats * std::mem::size_of::<f32>()
    }

    pub fn tenant(&self, page: u32) -> Tenant {
        self.tenant[page as usize]
    }

    /// Pages held by `t`.
    pub fn count(&self, t: Tenant) -> usize {
        match t {
            Tenant::Free => self.free.len(),
            _ => self.tenant.iter().filter(|&&x| x == t).count(),
        }
    }

    pub fn free_pages(&self) -> usize {
        self.free.len()
    }

    /// A free page for a KV block.
    pub fn alloc_kv(&mut self) -> Option<u32> {
        let p = self.free.pop()?;
        self.tenant[p as usize] = Tenant::Kv;
        Some(p)
    }

    /// Returns a KV block's page to the free list.
    pub fn free_kv(&mut self, page: u32) {
        debug_assert_eq!(self.tenant[page as usize], Tenant::Kv);
        self.tenant[page as usize] = Tenant::Free;
        self.free.push(page);
    }

    /// Lends up to `n` free pages to the EMB cache (metadata only).
    pub fn lend_to_emb(&mut self, n: usize) -> Vec<u32> {
        let at = self.free.len().saturating_sub(n);
        let pages = self.free.split_off(at);
        for &p in &pages {
            self.tenant[p as usize] = Tenant::Emb;
        }
        pages
    }

    /// EMB pages come back to the KV share.
    pub fn return_from_emb(&mut self, pages: &[u32]) {
        for &p in pages {
            debug_assert_eq!(self.tenant[p as usize], Tenant::Emb);
            self.tenant[p as usize] = Tenant::Free;
            self.free.push(p);
        }
    }

    pub fn page(&self, page: u32) -> &[f32] {
        let s = page as usize * self.page_floats;
        &self.data[s..s + self.page_floats]
    }

    pub fn page_mut(&mut self, page: u32) -> &mut [f32] {
        let s = page as usize * self.page_floats;
        &mut self.data[s..s + self.page_floats]
    }

    /// Address of a page's first float (tests of "KV blocks never move").
    pub fn page_addr(&self, page: u32) -> *const f32 {
        self.page(page).as_ptr()
    }
}

impl KvBlockStore for PagePool {
    fn block_floats(&self) -> usize {
        self.page_floats
    }
    fn block(&self, id: u32) -> &[f32] {
        self.page(id)
    }
    fn block_mut(&mut self, id: u32) -> &mut [f32] {
        self.page_mut(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_move_between_tenants_by_metadata() {
        let mut p = PagePool::new(4, 8);
        let kv = p.alloc_kv().unwrap();
        p.block_mut(kv)[3] = 7.0;
        let lent = p.lend_to_emb(5);
        assert_eq!(lent.len(), 3);
        assert_eq!(p.count(Tenant::Emb), 3);
        assert!(p.alloc_kv().is_none());
        p.return_from_emb(&lent[..1]);
        assert_eq!(p.free_pages(), 1);
        assert_eq!(p.block(kv)[3], 7.0);
        assert_eq!(p.tenant(kv), Tenant::Kv);
    }
}

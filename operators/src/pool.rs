//! The device memory pool (HLEM §IV-B): M bytes cut into fixed pages of one
//! KV block each. The EMB cache owns a set of pages (α of the pool, several
//! rows per page); the KV caches draw single pages from the rest. Pages are
//! real storage: the model reads and writes KV blocks in place by page id
//! through [`grflow_kernels::KvBlockStore`].

use std::ops::Range;

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

/// A page handed back to the pool that the pool did not lend out that way:
/// a double free or a stray id. The pool is left unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    #[error("page {page} is out of range (pool of {pages} pages)")]
    OutOfRange { page: u32, pages: usize },
    #[error("double free of KV page {page} (it is already free)")]
    DoubleFree { page: u32 },
    #[error("page {page} returned as {expected:?} but it is held by {held:?}")]
    WrongTenant {
        page: u32,
        expected: Tenant,
        held: Tenant,
    },
}

/// The host could not allocate a pool's floats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("cannot allocate the pool's {bytes} bytes on this host")]
pub struct PoolAllocError {
    pub bytes: u64,
}

/// `n` zero floats, or `None` where the allocator refuses. Zeroed memory
/// comes from the allocator as is (large blocks are mapped lazily), so a
/// pool costs resident memory only for the pages it touches.
fn zeroed_floats(n: usize) -> Option<Vec<f32>> {
    if n == 0 {
        return Some(Vec::new());
    }
    let layout = std::alloc::Layout::array::<f32>(n).ok()?;
    // SAFETY: the layout's size is non-zero (n > 0).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<f32>();
    if ptr.is_null() {
        return None;
    }
    // SAFETY: `ptr` comes from the global allocator with the layout of
    // `n` f32s (capacity n), and all-zero bits are n initialised 0.0s.
    Some(unsafe { Vec::from_raw_parts(ptr, n, n) })
}

/// Fixed pages of `page_floats` f32 each.
#[derive(Clone, Debug)]
pub struct PagePool {
    page_floats: usize,
    /// Every page's floats, or one scratch page that all pages share
    /// ([`PagePool::keep_metadata_only`]).
    data: Vec<f32>,
    metadata_only: bool,
    tenant: Vec<Tenant>,
    /// Free pages of the KV share; popped from the back.
    free: Vec<u32>,
    /// Frees refused by the checks (each a caller bug, counted not applied).
    rejected_frees: u64,
}

impl PagePool {
    pub fn new(pages: usize, page_floats: usize) -> Self {
        Self::try_new(pages, page_floats, false).expect("pool allocation")
    }

    /// A pool of `pages` pages, with their floats unless `metadata_only`
    /// (see [`PagePool::keep_metadata_only`]). Fails where the host cannot
    /// allocate the floats: a pool sized for a device larger than this
    /// host's memory would otherwise abort the process.
    pub fn try_new(
        pages: usize,
        page_floats: usize,
        metadata_only: bool,
    ) -> Result<Self, PoolAllocError> {
        let floats = if metadata_only {
            page_floats
        } else {
            pages.saturating_mul(page_floats)
        };
        let data = zeroed_floats(floats).ok_or(PoolAllocError {
            bytes: (floats as u64).saturating_mul(4),
        })?;
        Ok(Self {
            page_floats,
            data,
            metadata_only,
            tenant: vec![Tenant::Free; pages],
            free: (0..pages as u32).rev().collect(),
            rejected_frees: 0,
        })
    }

    pub fn pages(&self) -> usize {
        self.tenant.len()
    }

    /// Drops the pages' floats and keeps who holds which page: the virtual
    /// clock runs no model, so nothing reads what a page holds, and a node
    /// (and each oracle copy of it) then costs its metadata only. Every
    /// page reads and writes one shared scratch page from here on.
    pub fn keep_metadata_only(&mut self) {
        self.data = vec![0.0; self.page_floats];
        self.metadata_only = true;
    }

    /// Whether the pages hold no floats of their own.
    pub fn is_metadata_only(&self) -> bool {
        self.metadata_only
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

    /// Returns a KV block's page to the free list. A page that is not a KV
    /// page (already free, lent to EMB, out of range) is refused and counted:
    /// pushing it would put one page on the free list twice, and two blocks
    /// would later share storage.
    pub fn free_kv(&mut self, page: u32) -> Result<(), PoolError> {
        self.check(page, Tenant::Kv)?;
        self.tenant[page as usize] = Tenant::Free;
        self.free.push(page);
        Ok(())
    }

    /// Frees refused so far by [`PagePool::free_kv`] and
    /// [`PagePool::return_from_emb`].
    pub fn rejected_frees(&self) -> u64 {
        self.rejected_frees
    }

    fn check(&mut self, page: u32, expected: Tenant) -> Result<(), PoolError> {
        let err = match self.tenant.get(page as usize) {
            None => PoolError::OutOfRange {
                page,
                pages: self.tenant.len(),
            },
            Some(&held) if held == expected => return Ok(()),
            Some(Tenant::Free) if expected == Tenant::Kv => PoolError::DoubleFree { page },
            Some(&held) => PoolError::WrongTenant {
                page,
                expected,
                held,
            },
        };
        self.rejected_frees += 1;
        Err(err)
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

    /// EMB pages come back to the KV share. A page not lent to EMB is
    /// skipped and counted; the first such error is returned after the
    /// valid pages came back.
    pub fn return_from_emb(&mut self, pages: &[u32]) -> Result<(), PoolError> {
        let mut first = Ok(());
        for &p in pages {
            if let Err(e) = self.check(p, Tenant::Emb) {
                first = first.and(Err(e));
                continue;
            }
            self.tenant[p as usize] = Tenant::Free;
            self.free.push(p);
        }
        first
    }

    pub fn page(&self, page: u32) -> &[f32] {
        let s = self.offset(page);
        &self.data[s..s + self.page_floats]
    }

    pub fn page_mut(&mut self, page: u32) -> &mut [f32] {
        let s = self.offset(page);
        &mut self.data[s..s + self.page_floats]
    }

    /// Writes `values` at `at` within `page`; nothing in a metadata-only
    /// pool, which has no floats to hold them.
    pub fn write_floats(&mut self, page: u32, at: Range<usize>, values: &[f32]) {
        if !self.metadata_only {
            self.page_mut(page)[at].copy_from_slice(values);
        }
    }

    /// Copies the floats at `from_at` of `from` to `to_at` of `to` (same
    /// length); nothing in a metadata-only pool.
    pub fn copy_floats(&mut self, from: u32, from_at: Range<usize>, to: u32, to_at: Range<usize>) {
        debug_assert_eq!(from_at.len(), to_at.len());
        if self.metadata_only {
            return;
        }
        let (src, dst) = (self.offset(from), self.offset(to));
        self.data
            .copy_within(src + from_at.start..src + from_at.end, dst + to_at.start);
    }

    fn offset(&self, page: u32) -> usize {
        if self.metadata_only {
            0
        } else {
            page as usize * self.page_floats
        }
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
    fn a_pool_the_host_cannot_hold_is_an_error_not_an_abort() {
        // 2^62 floats: more than any allocator hands out.
        let e = PagePool::try_new(1 << 12, 1 << 50, false).unwrap_err();
        assert_eq!(e.bytes, u64::MAX);
        // Metadata only: one scratch page of floats, every page's owner.
        let p = PagePool::try_new(1 << 20, 1024, true).unwrap();
        assert!(p.is_metadata_only());
        assert_eq!(p.pages(), 1 << 20);
        assert_eq!(p.data.len(), 1024);
        assert_eq!(PagePool::try_new(3, 4, false).unwrap().data, vec![0.0; 12]);
    }

    #[test]
    fn pages_move_between_tenants_by_metadata() {
        let mut p = PagePool::new(4, 8);
        let kv = p.alloc_kv().unwrap();
        p.block_mut(kv)[3] = 7.0;
        let lent = p.lend_to_emb(5);
        assert_eq!(lent.len(), 3);
        assert_eq!(p.count(Tenant::Emb), 3);
        assert!(p.alloc_kv().is_none());
        p.return_from_emb(&lent[..1]).unwrap();
        assert_eq!(p.free_pages(), 1);
        assert_eq!(p.block(kv)[3], 7.0);
        assert_eq!(p.tenant(kv), Tenant::Kv);
    }

    #[test]
    fn a_metadata_only_pool_keeps_tenants_and_drops_the_floats() {
        let mut p = PagePool::new(64, 1024);
        let kv = p.alloc_kv().unwrap();
        let lent = p.lend_to_emb(8);
        p.keep_metadata_only();
        assert!(p.is_metadata_only());
        assert_eq!(p.data.capacity(), 1024);
        assert_eq!(
            (p.pages(), p.count(Tenant::Emb), p.free_pages()),
            (64, 8, 55)
        );
        assert_eq!(p.tenant(kv), Tenant::Kv);
        // Every page is the one scratch page.
        p.block_mut(kv)[0] = 3.0;
        assert_eq!(p.block(lent[0])[0], 3.0);
        assert_eq!(p.block(kv).len(), 1024);
        p.free_kv(kv).unwrap();
        assert_eq!(p.free_pages(), 56);
    }

    #[test]
    fn double_free_is_a_checked_error_and_leaves_the_free_list_alone() {
        let mut p = PagePool::new(3, 4);
        let a = p.alloc_kv().unwrap();
        let b = p.alloc_kv().unwrap();
        assert_eq!(p.free_kv(a), Ok(()));
        assert_eq!(p.free_kv(a), Err(PoolError::DoubleFree { page: a }));
        assert_eq!(
            p.free_kv(9),
            Err(PoolError::OutOfRange { page: 9, pages: 3 })
        );
        let lent = p.lend_to_emb(1);
        assert_eq!(
            p.free_kv(lent[0]),
            Err(PoolError::WrongTenant {
                page: lent[0],
                expected: Tenant::Kv,
                held: Tenant::Emb
            })
        );
        assert_eq!(
            p.return_from_emb(&[b, lent[0]]),
            Err(PoolError::WrongTenant {
                page: b,
                expected: Tenant::Emb,
                held: Tenant::Kv
            })
        );
        assert_eq!(p.rejected_frees(), 4);
        // Two free pages (a, the returned EMB page), each listed once: two
        // allocations give distinct pages and the third finds none.
        assert_eq!(p.free_pages(), 2);
        let (x, y) = (p.alloc_kv().unwrap(), p.alloc_kv().unwrap());
        assert_ne!(x, y);
        assert!(p.alloc_kv().is_none());
        assert_eq!(p.tenant(b), Tenant::Kv);
    }
}

//! The node's memory: pool pages hold EMB rows and KV blocks, boundary moves
//! never move a resident KV block, EMB counts per table, prefix reuse.

use grflow_kernels::KvBlockStore;
use grflow_operators::cache::{KvTenant, MemoryError, NodeMemory, NodeMemoryConfig};
use proptest::prelude::*;

/// 16 pages of 8 floats; rows of 2 floats (4 per page); blocks of 2 tokens.
fn cfg(alpha: f64) -> NodeMemoryConfig {
    serde_json::from_value(serde_json::json!({
        "pool_bytes": 16 * 8 * 4,
        "page_floats": 8,
        "block_tokens": 2,
        "emb_row_floats": 2,
        "alpha": alpha,
        "emb_policy": "lru",
        "user_kv_policy": "lru",
        "item_kv_policy": "lru",
    }))
    .unwrap()
}

#[test]
fn a_pool_too_large_for_the_host_names_memory_pool_mib() {
    let mut c = cfg(0.5);
    c.pool_bytes = 1 << 62;
    c.page_floats = 1 << 20;
    c.emb_row_floats = 1 << 20;
    let e = NodeMemory::new(c.clone()).unwrap_err().to_string();
    assert!(e.starts_with("memory.pool_mib: cannot allocate"), "{e}");
    // Metadata only, the same pool's pages are bookkeeping alone.
    c.pool_bytes = 1 << 40;
    let m = NodeMemory::with_storage(c, true).unwrap();
    assert_eq!(m.stats().pages, 1 << 18);
}

#[test]
fn config_errors_are_typed() {
    let bad: Result<NodeMemoryConfig, _> = serde_json::from_value(
        serde_json::json!({"pool_bytes": 1, "page_floats": 1, "block_tokens": 1, "emb_row_floats": 1, "alpha": 0.5, "colour": 1}),
    );
    assert!(bad.unwrap_err().to_string().contains("unknown field"));
    assert_eq!(
        NodeMemory::new(cfg(1.5)).unwrap_err(),
        MemoryError::Alpha(1.5)
    );
    let mut c = cfg(0.5);
    c.emb_policy = "arc".into();
    assert!(
        NodeMemory::new(c)
            .unwrap_err()
            .to_string()
            .starts_with("memory.emb_policy: unknown eviction policy")
    );
    let mut c = cfg(0.5);
    c.pool_bytes = 4;
    assert!(matches!(
        NodeMemory::new(c),
        Err(MemoryError::TooSmall { .. })
    ));
}

#[test]
fn emb_rows_live_in_pool_pages_and_count_per_table() {
    let mut m = NodeMemory::new(cfg(0.25)).unwrap(); // 4 pages = 16 rows
    assert!(m.emb_lookup(1, 7).is_none());
    m.emb_insert(1, 7, &[7.0, 1.0]);
    assert_eq!(m.emb_lookup(1, 7), Some(&[7.0, 1.0][..]));
    assert!(m.emb_lookup(0, 7).is_none());
    let s = m.stats();
    assert_eq!(
        (
            s.emb_tables[1].hits,
            s.emb_tables[1].misses,
            s.emb_tables[0].misses
        ),
        (1, 1, 1)
    );
    assert_eq!((s.emb_pages, s.emb_capacity_rows, s.emb_rows), (4, 16, 1));
    // LRU order within the EMB share.
    for r in 0..16 {
        m.emb_insert(2, r, &[r as f32, 0.0]);
    }
    assert!(!m.emb_contains(1, 7), "least recent row went first");
    assert!(m.emb_contains(2, 15));
}

#[test]
fn prefix_is_reused_extended_and_counted() {
    let mut m = NodeMemory::new(cfg(0.0)).unwrap();
    let hist = [1, 2, 3, 4, 5];
    let p = m.kv_match(&hist);
    assert_eq!(p.matched_tokens, 0);
    let table = m.kv_alloc(3, KvTenant::UserPrefix).unwrap();
    m.kv_store().block_mut(table[0])[0] = 42.0;
    m.kv_commit(&hist, &table, &p);
    assert_eq!(m.kv_cached_prefix_len(&hist), 4);
    let longer = [1, 2, 3, 4, 5, 6, 7];
    let p = m.kv_match(&longer);
    assert_eq!(
        (p.matched_tokens, p.blocks.clone()),
        (4, table[..2].to_vec())
    );
    assert_eq!(m.kv_store().block(p.blocks[0])[0], 42.0);
    let mut t2 = p.blocks.clone();
    t2.extend(m.kv_alloc(2, KvTenant::UserPrefix).unwrap());
    m.kv_commit(&longer, &t2, &p);
    let s = m.stats();
    assert_eq!((s.kv_reused_tokens, s.kv_total_tokens), (4, 12));
    assert_eq!(s.user_kv_pages, 3);
}

#[test]
fn only_unpinned_leaves_go_and_full_is_an_error() {
    let mut c = cfg(0.0);
    c.pool_bytes = 3 * 8 * 4;
    let mut m = NodeMemory::new(c).unwrap();
    let a = [1, 2, 3, 4];
    let p = m.kv_match(&a);
    let t = m.kv_alloc(2, KvTenant::UserPrefix).unwrap();
    m.kv_commit(&a, &t, &p);
    let pinned = m.kv_match(&a);
    assert_eq!(
        m.kv_alloc(2, KvTenant::UserPrefix),
        Err(MemoryError::KvFull {
            wanted: 2,
            free: 1,
            evictable: 0
        })
    );
    m.kv_release(&pinned, &[]);
    assert_eq!(m.kv_alloc(3, KvTenant::UserPrefix).unwrap().len(), 3);
    assert_eq!(m.kv_cached_prefix_len(&a), 0);
}

/// A reservation that cannot succeed even after evicting every unpinned
/// block fails at once and evicts nothing: it emptied the whole prefix
/// cache first, for a request that waited for a later sub-batch anyway.
#[test]
fn a_reservation_that_cannot_fit_evicts_nothing() {
    let mut c = cfg(0.0);
    c.pool_bytes = 8 * 8 * 4;
    let mut m = NodeMemory::new(c).unwrap();
    let x = [1, 2, 3, 4];
    let p = m.kv_match(&x);
    let t = m.kv_alloc(2, KvTenant::UserPrefix).unwrap();
    m.kv_commit(&x, &t, &p);
    assert_eq!(m.kv_cached_prefix_len(&x), 4);
    // Another request holds 4 pages while it computes.
    let held = m.kv_alloc(4, KvTenant::UserPrefix).unwrap();
    assert_eq!(
        m.kv_alloc(5, KvTenant::UserPrefix),
        Err(MemoryError::KvFull {
            wanted: 5,
            free: 2,
            evictable: 2
        })
    );
    assert_eq!(m.kv_cached_prefix_len(&x), 4, "x's prefix stays cached");
    // One that fits by evicting still evicts.
    assert_eq!(m.kv_alloc(4, KvTenant::UserPrefix).unwrap().len(), 4);
    assert_eq!(m.kv_cached_prefix_len(&x), 0);
    drop(held);
}

#[test]
fn item_prefix_entries_are_pinned_while_used() {
    let mut m = NodeMemory::new(cfg(0.0)).unwrap();
    assert!(m.item_get(9).is_none());
    let pages = m.kv_alloc(2, KvTenant::ItemPrefix).unwrap();
    m.item_insert(9, pages.clone());
    assert_eq!(m.item_get(9), Some(pages));
    let s = m.stats();
    assert_eq!(
        (s.item_kv_hits, s.item_kv_misses, s.item_kv_pages),
        (1, 1, 2)
    );
    // Still pinned (insert + get): asking for all 16 pages fails.
    assert!(m.kv_alloc(16, KvTenant::UserPrefix).is_err());
    m.item_unpin(9);
    m.item_unpin(9);
    assert_eq!(m.kv_alloc(16, KvTenant::UserPrefix).unwrap().len(), 16);
}

#[test]
fn boundary_moves_report_and_refill_on_the_slow_lane() {
    let mut m = NodeMemory::new(cfg(0.5)).unwrap(); // 8 EMB pages = 32 rows
    for r in 0..32 {
        m.emb_insert(0, r, &[r as f32, 0.0]);
    }
    let down = m.set_alpha(0.25, 0).unwrap();
    assert_eq!((down.pages_to_emb, down.emb_rows_evicted), (-4, 16));
    // Survivors were compacted into the kept pages, values intact.
    for r in 16..32 {
        assert_eq!(m.emb_lookup(0, r), Some(&[r as f32, 0.0][..]));
    }
    let up = m.set_alpha(0.5, 0).unwrap();
    assert_eq!(
        (up.pages_to_emb, up.refill_rows, up.refill_bytes),
        (4, 16, 16 * 8)
    );
    assert_eq!(m.stats().refill_queued_bytes, 128);
    let host = |_t: u16, r: u32| vec![r as f32, 0.0];
    let refilled = m.advance_refill(1_000_000_000, &host).len();
    assert_eq!(refilled, 16);
    assert_eq!(m.stats().refill_queued_bytes, 0);
    assert!(m.emb_contains(0, 3));
}

/// The refill after a move at 1 s starts then: the idle link before the
/// move is not credited to it (16 rows of 8 bytes take 64 ns at 2 GB/s).
#[test]
fn refill_starts_when_the_boundary_moves() {
    let mut m = NodeMemory::new(cfg(0.5)).unwrap();
    for r in 0..32 {
        m.emb_insert(0, r, &[r as f32, 0.0]);
    }
    m.set_alpha(0.25, 0).unwrap();
    let host = |_t: u16, r: u32| vec![r as f32, 0.0];
    assert_eq!(m.advance_refill(1_000, &host).len(), 0);
    let up = m.set_alpha(0.5, 1_000_000_000).unwrap();
    assert_eq!(up.refill_rows, 16);
    let early = m.advance_refill(1_000_000_032, &host).len();
    assert!(early > 0 && early < 16, "{early} rows refilled in 32 ns");
    assert_eq!(early + m.advance_refill(1_000_000_064, &host).len(), 16);
}

#[test]
fn refill_that_finishes_during_a_miss_transfer_still_lands() {
    let mut m = NodeMemory::new(cfg(0.5)).unwrap();
    for r in 0..32 {
        m.emb_insert(0, r, &[r as f32, 0.0]);
    }
    m.set_alpha(0.25, 0).unwrap();
    let up = m.set_alpha(0.5, 0).unwrap();
    assert_eq!(up.refill_rows, 16);
    // A miss long after the refill finished runs the refill lane first.
    m.link().miss_transfer(64, 1_000_000_000);
    let host = |_t: u16, r: u32| vec![r as f32, 0.0];
    assert_eq!(m.advance_refill(1_000_000_100, &host).len(), 16);
    assert!((0..16).all(|r| m.emb_contains(0, r)));
    let jobs = m.stats().refill_jobs;
    assert_eq!((jobs.submitted, jobs.completed, jobs.pending), (16, 16, 0));
}

/// Rows whose refill crossed the link inside a miss transfer, not placed
/// yet, are not queued and paid for again by the next grow.
#[test]
fn a_grow_does_not_refill_rows_already_across_the_link() {
    let mut m = NodeMemory::new(cfg(0.5)).unwrap();
    for r in 0..32 {
        m.emb_insert(0, r, &[r as f32, 0.0]);
    }
    m.set_alpha(0.25, 0).unwrap();
    assert_eq!(m.set_alpha(0.5, 0).unwrap().refill_rows, 16);
    // The refill lane runs inside this miss: all 16 jobs finish, unplaced.
    m.link().miss_transfer(8, 1_000_000_000);
    let again = m.set_alpha(0.75, 1_000_000_000).unwrap();
    assert_eq!((again.refill_rows, again.refill_bytes), (0, 0));
    let host = |_t: u16, r: u32| vec![r as f32, 0.0];
    assert_eq!(m.advance_refill(2_000_000_000, &host).len(), 16);
    let jobs = m.stats().refill_jobs;
    assert_eq!(
        (jobs.submitted, jobs.completed, jobs.cancelled),
        (16, 16, 0)
    );
    assert_eq!(m.link().bytes_moved().1, 16 * 8);
}

/// A grow while an earlier refill is still queued keeps those jobs (and
/// their progress) and queues only other rows, for the room left.
#[test]
fn a_grow_keeps_the_queued_refill_and_adds_only_new_rows() {
    let mut m = NodeMemory::new(cfg(0.5)).unwrap();
    // 64 rows through 32 slots: rows 0..32 are evicted (ghosts).
    for r in 0..64 {
        m.emb_insert(0, r, &[r as f32, 0.0]);
    }
    m.set_alpha(0.25, 0).unwrap(); // evicts 16 more: 48 ghosts
    assert_eq!(m.set_alpha(0.5, 0).unwrap().refill_rows, 16);
    // Before any of it lands: 16 rows resident, 16 on the lane, 16 slots left.
    let up = m.set_alpha(0.75, 0).unwrap();
    assert_eq!((up.refill_rows, up.refill_bytes), (16, 16 * 8));
    let host = |_t: u16, r: u32| vec![r as f32, 0.0];
    assert_eq!(m.advance_refill(1_000_000_000, &host).len(), 32);
    let jobs = m.stats().refill_jobs;
    assert_eq!(
        (jobs.submitted, jobs.completed, jobs.cancelled),
        (32, 32, 0)
    );
    assert_eq!(m.stats().emb_rows, 48);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Resident KV blocks never move: their pages and bytes survive any
    /// sequence of α moves (pinned blocks stay; unpinned ones may be evicted
    /// but are never relocated).
    #[test]
    fn kv_blocks_never_move(alphas in prop::collection::vec(0.0f64..=1.0, 1..12)) {
        let mut m = NodeMemory::new(cfg(0.0)).unwrap();
        let seq: Vec<u32> = (0..8).collect();
        let p = m.kv_match(&seq);
        let table = m.kv_alloc(4, KvTenant::UserPrefix).unwrap();
        for (i, &b) in table.iter().enumerate() {
            m.kv_store().block_mut(b).fill(i as f32 + 1.0);
        }
        m.kv_commit(&seq, &table, &p);
        let pinned = m.kv_match(&seq);
        let addrs: Vec<*const f32> = table.iter().map(|&b| m.pool().page_addr(b)).collect();
        for a in alphas {
            m.set_alpha(a, 0).unwrap();
            for r in 0..40 {
                m.emb_insert(0, r, &[1.0, 2.0]);
            }
            let now: Vec<*const f32> = table.iter().map(|&b| m.pool().page_addr(b)).collect();
            prop_assert_eq!(&now, &addrs);
            for (i, &b) in table.iter().enumerate() {
                prop_assert!(m.kv_store().block(b).iter().all(|&v| v == i as f32 + 1.0));
            }
            prop_assert_eq!(m.kv_cached_prefix_len(&seq), 8);
            prop_assert!(m.stats().emb_pages <= 12, "4 pinned KV pages stay KV");
        }
        m.kv_release(&pinned, &[]);
    }
}

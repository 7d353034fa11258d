//! Embedding lookup: a request's items become token embeddings (each the
//! sum of the item's rows over all tables) through the EMB cache; a miss is
//! read from the host tier, paid for on the host→device link, and cached.

use std::time::{Duration, Instant};

use crate::cache::NodeMemory;
use crate::host::HostTables;
use crate::link::LinkConfig;
use crate::shards::ShardMap;

use super::ItemCatalog;
use super::residency::Residency;

/// Cache outcome of one request's lookups.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EmbStats {
    pub hits: u32,
    pub lookups: u32,
    pub miss_bytes: usize,
    pub oov_items: u32,
}

impl EmbStats {
    /// Adds another lookup's counts.
    pub fn add(&mut self, other: &EmbStats) {
        self.hits += other.hits;
        self.lookups += other.lookups;
        self.miss_bytes += other.miss_bytes;
        self.oov_items += other.oov_items;
    }
}

/// What a lookup reads and updates: the cache, the host tier, and the
/// shard counts residency reports are made from.
#[derive(Debug)]
pub struct Lookup<'a> {
    pub memory: &'a mut NodeMemory,
    pub host: &'a HostTables,
    pub shards: &'a ShardMap,
    pub residency: &'a mut Residency,
    /// Whether token values are summed: the virtual clock runs no model
    /// and needs only the cache traffic (the tokens stay zero).
    pub values: bool,
}

impl Lookup<'_> {
    /// Token embeddings of `items`, `host.dim()` floats each; unknown items
    /// use each table's OOV row.
    pub fn item_tokens(
        &mut self,
        items: &[u32],
        catalog: &dyn ItemCatalog,
        stats: &mut EmbStats,
    ) -> Vec<f32> {
        let d = self.host.dim();
        let tables = self.host.tables();
        let mut out = vec![0f32; items.len() * d];
        for (i, &item) in items.iter().enumerate() {
            let features = catalog.feature_ids(item);
            if features.is_none() {
                stats.oov_items += 1;
            }
            let token = &mut out[i * d..(i + 1) * d];
            for t in 0..tables {
                let table = t as u16;
                let feature = features.and_then(|f| f.get(t).copied()).unwrap_or(u32::MAX);
                let (row, _) = self.host.resolve(table, feature);
                stats.lookups += 1;
                if let Some(values) = self.memory.emb_lookup(table, row) {
                    stats.hits += 1;
                    if self.values {
                        add(token, values);
                    }
                    continue;
                }
                let values = self.host.row(table, row);
                if self.values {
                    add(token, values);
                }
                stats.miss_bytes += self.host.row_bytes();
                let evicted = self.memory.emb_insert(table, row, values);
                // The OOV row stands for no item: it lies past the table's
                // shards (in the next table's first when the row count is a
                // multiple of the shard size), so it is not counted.
                if super::counted_as_cached(self.memory, self.host, table, row) {
                    self.residency.count_row(self.shards, table, row, 1);
                }
                for (table, row) in evicted {
                    if row != self.host.oov_row(table) {
                        self.residency.count_row(self.shards, table, row, -1);
                    }
                }
            }
        }
        out
    }
}

/// The part of a link wait spent yielding rather than asleep (the timer's
/// usual overshoot).
const SLEEP_SLACK: Duration = Duration::from_micros(100);

/// The link's nanosecond clock. On the wall clock it is the time since the
/// node started and a miss transfer is waited for; on the virtual clock it
/// is the event time of the request being served and nothing waits, so
/// refill after an α move progresses with event time and a replay is
/// deterministic.
#[derive(Clone, Copy, Debug)]
pub enum LinkClock {
    Wall { started: Instant },
    Event { now_ns: u64 },
}

impl LinkClock {
    pub fn start() -> Self {
        Self::Wall {
            started: Instant::now(),
        }
    }

    /// The event-time clock, at 0 until the first [`LinkClock::observe`].
    pub fn event() -> Self {
        Self::Event { now_ns: 0 }
    }

    /// Event time `now_ms` has come (the event clock never goes back).
    pub fn observe(&mut self, now_ms: u64) {
        if let Self::Event { now_ns } = self {
            *now_ns = (*now_ns).max(now_ms.saturating_mul(1_000_000));
        }
    }

    pub fn now_ns(&self) -> u64 {
        match self {
            Self::Wall { started } => started.elapsed().as_nanos() as u64,
            Self::Event { now_ns } => *now_ns,
        }
    }

    /// The link time of something that happens at event time `now_ms` (a
    /// command), without moving the clock: requests of earlier times may
    /// still be served after it under `arrival`. The wall clock's own.
    pub fn at(&self, now_ms: u64) -> u64 {
        match self {
            Self::Wall { .. } => self.now_ns(),
            Self::Event { now_ns } => (*now_ns).max(now_ms.saturating_mul(1_000_000)),
        }
    }

    /// A host→device transfer of `bytes` on the link's miss lane. On the
    /// wall clock the CPU backend's device pool is host memory, so this
    /// waits out what PCIe would cost (queueing behind earlier misses); the
    /// wait gives the core away: it sleeps through all but the last
    /// `SLEEP_SLACK` of a long transfer and yields for the rest, so other
    /// workers run meanwhile. On the event clock the lane is only booked
    /// (the latency model charges the transfer).
    pub fn pay(&self, memory: &mut NodeMemory, bytes: usize) {
        if bytes == 0 {
            return;
        }
        let done = memory.link().miss_transfer(bytes as u64, self.now_ns());
        let Self::Wall { started } = self else {
            return;
        };
        let until = *started + Duration::from_nanos(done);
        let left = until.saturating_duration_since(Instant::now());
        if left > SLEEP_SLACK {
            // Sleeps overshoot by tens of µs: wake a little early.
            std::thread::sleep(left - SLEEP_SLACK);
        }
        while Instant::now() < until {
            std::thread::yield_now();
        }
    }
}

/// Transfer time of `bytes` on an idle miss lane (the event-time model).
pub fn link_cost(link: &LinkConfig, bytes: usize) -> Duration {
    if bytes == 0 {
        return Duration::ZERO;
    }
    Duration::from_nanos(link.latency_ns) + Duration::from_secs_f64(bytes as f64 / link.bytes_per_s)
}

fn add(acc: &mut [f32], row: &[f32]) {
    for (a, r) in acc.iter_mut().zip(row) {
        *a += r;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::NodeMemoryConfig;
    use std::collections::HashMap;

    struct Catalog(HashMap<u32, Vec<u32>>);

    impl ItemCatalog for Catalog {
        fn feature_ids(&self, item: u32) -> Option<&[u32]> {
            self.0.get(&item).map(|f| f.as_slice())
        }
    }

    const D: usize = 4;

    fn memory(alpha: f64) -> NodeMemory {
        NodeMemory::new(NodeMemoryConfig {
            pool_bytes: 64 * 64 * 4,
            page_floats: 64,
            block_tokens: 4,
            emb_row_floats: D,
            alpha,
            emb_policy: "lru".into(),
            user_kv_policy: "lru".into(),
            item_kv_policy: "lru".into(),
            link: LinkConfig {
                bytes_per_s: 1e9,
                latency_ns: 1_000,
                refill_bytes_per_s: 1e8,
            },
        })
        .unwrap()
    }

    #[test]
    fn a_token_is_the_sum_of_its_rows_and_a_second_lookup_hits() {
        let host = HostTables::new(&[10, 20], D, 5);
        let shards = ShardMap::new(&[10, 20], 4);
        let mut memory = memory(0.5);
        let mut residency = Residency::default();
        let catalog = Catalog(HashMap::from([(7, vec![3, 11])]));
        let mut lookup = Lookup {
            memory: &mut memory,
            host: &host,
            shards: &shards,
            residency: &mut residency,
            values: true,
        };
        let mut first = EmbStats::default();
        let tokens = lookup.item_tokens(&[7], &catalog, &mut first);
        let expected: Vec<f32> = (0..D)
            .map(|i| host.row(0, host.resolve(0, 3).0)[i] + host.row(1, host.resolve(1, 11).0)[i])
            .collect();
        assert_eq!(tokens, expected);
        assert_eq!((first.hits, first.lookups), (0, 2));
        assert_eq!(first.miss_bytes, 2 * host.row_bytes());

        let mut second = EmbStats::default();
        assert_eq!(lookup.item_tokens(&[7], &catalog, &mut second), expected);
        assert_eq!((second.hits, second.lookups, second.miss_bytes), (2, 2, 0));
    }

    #[test]
    fn an_unknown_item_is_counted_uses_the_oov_rows_and_counts_in_no_shard() {
        // 8 rows in shards of 4: table 0's OOV row (8) would fall in table
        // 1's first shard, table 1's in a shard past the last.
        let host = HostTables::new(&[8, 8], D, 5);
        let shards = ShardMap::new(&[8, 8], 4);
        let mut memory = memory(0.5);
        let mut residency = Residency::default();
        let mut lookup = Lookup {
            memory: &mut memory,
            host: &host,
            shards: &shards,
            residency: &mut residency,
            values: true,
        };
        let mut stats = EmbStats::default();
        let tokens = lookup.item_tokens(&[99], &Catalog(HashMap::new()), &mut stats);
        assert_eq!((stats.oov_items, stats.lookups, stats.hits), (1, 2, 0));
        let expected: Vec<f32> = (0..D)
            .map(|i| host.row(0, host.oov_row(0))[i] + host.row(1, host.oov_row(1))[i])
            .collect();
        assert_eq!(tokens, expected);
        assert!(memory.emb_contains(0, host.oov_row(0)));
        let mut report = crate::router::NodeReport::default();
        residency.report_shards(1.0, &mut report);
        assert!(report.shards_added.is_empty(), "{report:?}");
    }

    #[test]
    fn the_link_costs_its_latency_plus_bytes_over_bandwidth_and_nothing_for_no_bytes() {
        let link = LinkConfig {
            bytes_per_s: 1e9,
            latency_ns: 10_000,
            refill_bytes_per_s: 1e8,
        };
        assert_eq!(link_cost(&link, 0), Duration::ZERO);
        let cost = link_cost(&link, 1_000_000).as_nanos() as i64;
        assert!((cost - 1_010_000).abs() <= 1, "{cost} ns");
    }

    /// CPU time this thread has used (Linux: /proc/thread-self/schedstat).
    #[cfg(target_os = "linux")]
    fn thread_cpu() -> Duration {
        let stat = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap();
        let ns: u64 = stat.split_whitespace().next().unwrap().parse().unwrap();
        Duration::from_nanos(ns)
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn paying_for_a_transfer_waits_its_time_without_spinning_a_core() {
        let mut m = memory(0.5);
        let clock = LinkClock::start();
        // 20 MB at 1 GB/s: a 20 ms transfer.
        let (wall, cpu) = (Instant::now(), thread_cpu());
        clock.pay(&mut m, 20_000_000);
        let (waited, used) = (wall.elapsed(), thread_cpu() - cpu);
        assert!(waited >= Duration::from_millis(20), "{waited:?}");
        // A spin would use the whole 20 ms; a sleep uses almost none.
        assert!(
            used < Duration::from_millis(5),
            "{used:?} of CPU in {waited:?}"
        );
    }
}

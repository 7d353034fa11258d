//! Long histories: which of a user's items a request is served with.
//!
//! The model sees at most `limit` items (its position table, and the KV
//! pages one request may pin), and users expect the most recent ones, as
//! sequential recommenders do with a maximum length. A sliding window would
//! move the first kept item on every request; KV depends on every earlier
//! token and on absolute positions, so every cached block would change and
//! exactly the heavy users would never reuse their prefix. Instead the
//! oldest items are dropped in chunks (a quarter of the limit, whole KV
//! blocks): the first kept item is always a multiple of the chunk, so it
//! moves once every `chunk` new items and the prefix is reused in between.
//!
//! Pure arithmetic, no I/O: decoders (Kafka, Parquet) and the serving node
//! call the same functions, so a history truncated at decode time is not
//! truncated again (the result is a fixed point).

use grflow_kernels::{ModelConfig, SID_STEPS};
// In the kernels crate so that evaluation drops what serving drops.
pub use grflow_kernels::history::{chunk_for, oldest_dropped};

/// Share of the node's pool pages one request may pin for its history: a
/// long history cannot evict every other user's prefix. Past the KV share
/// the request takes pages back from EMB.
pub const MAX_PIN_SHARE: f64 = 0.5;

/// What a history is used for; the two have different position budgets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Task {
    /// User-as-prefix ranking: history, then every candidate at one shared
    /// position and the instruction token (2 positions).
    Rank,
    /// Generative retrieval: history, then `SID_STEPS` decoded tokens.
    Retrieve,
}

/// History limits of one model on one memory pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistoryLimits {
    /// Most history items a rank request is served with.
    pub rank: usize,
    /// Most history items a retrieve request is served with.
    pub retrieve: usize,
    /// Oldest items are dropped in multiples of this many (≥ 1, ≤ both
    /// limits when they are ≥ 1).
    pub chunk: usize,
}

impl HistoryLimits {
    /// Limits of `model` when one request may pin at most `max_pages` KV
    /// pages (blocks of `model.block_size` tokens).
    pub fn new(model: &ModelConfig, max_pages: usize) -> Self {
        let pinnable = max_pages.saturating_mul(model.block_size);
        let rank = model.max_positions.saturating_sub(2).min(pinnable);
        let retrieve = model.max_positions.saturating_sub(SID_STEPS).min(pinnable);
        Self {
            rank,
            retrieve,
            chunk: chunk_for(rank.min(retrieve), model.block_size),
        }
    }

    /// At most `max` items for either task (a trained model's
    /// `max_history`: it never saw longer histories).
    pub fn capped(self, max: usize, block: usize) -> Self {
        let (rank, retrieve) = (self.rank.min(max), self.retrieve.min(max));
        Self {
            rank,
            retrieve,
            chunk: chunk_for(rank.min(retrieve), block),
        }
    }

    /// No bound at all (tools and tests that decode without a model).
    pub fn unbounded() -> Self {
        Self {
            rank: usize::MAX,
            retrieve: usize::MAX,
            chunk: 1,
        }
    }

    pub fn limit(&self, task: Task) -> usize {
        match task {
            Task::Rank => self.rank,
            Task::Retrieve => self.retrieve,
        }
    }

    /// How many of the oldest items a history of `len` items loses.
    pub fn dropped(&self, len: usize, task: Task) -> usize {
        oldest_dropped(len, self.limit(task), self.chunk)
    }

    /// The most recent items of `history` that a request is served with.
    pub fn keep<'a>(&self, history: &'a [u32], task: Task) -> &'a [u32] {
        &history[self.dropped(history.len(), task)..]
    }
}

/// Pages one request may pin on a pool of `pages` pages.
pub fn pinnable_pages(pages: usize) -> usize {
    (pages as f64 * MAX_PIN_SHARE) as usize
}

/// What a decoder in front of nodes of several models drops (a hot swap
/// leaves some nodes on the old model for a while, or for good when theirs
/// failed): the most that every model's own cut drops, rounded down to a
/// common multiple of their chunks. A node then cuts the rest exactly as
/// it would have cut the whole history: its own drop is a multiple of its
/// chunk and at least this one, so what remains for it to drop is a whole
/// number of its chunks. One model alone: its own cut.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommonCut {
    /// Distinct, in the order they came.
    limits: Vec<HistoryLimits>,
}

impl CommonCut {
    pub fn new(all: impl IntoIterator<Item = HistoryLimits>) -> Self {
        let mut cut = Self { limits: Vec::new() };
        for l in all {
            cut.add(l);
        }
        cut
    }

    /// Adds a model's limits (once).
    pub fn add(&mut self, limits: HistoryLimits) {
        if !self.limits.contains(&limits) {
            self.limits.push(limits);
        }
    }

    pub fn limits(&self) -> &[HistoryLimits] {
        &self.limits
    }

    /// How many of the oldest items a history of `len` items loses here
    /// (none without limits).
    pub fn dropped(&self, len: usize, task: Task) -> usize {
        let Some(most) = self.limits.iter().map(|l| l.dropped(len, task)).min() else {
            return 0;
        };
        // A model that keeps nothing drops whatever is left: any step.
        let mut step = 1usize;
        for l in &self.limits {
            let limit = l.limit(task);
            if limit == 0 {
                continue;
            }
            let chunk = l.chunk.clamp(1, limit);
            step = match (step / gcd(step, chunk)).checked_mul(chunk) {
                Some(s) if s <= most => s,
                // A step past what may go: nothing is dropped here.
                _ => return 0,
            };
        }
        most / step * step
    }
}

impl From<HistoryLimits> for CommonCut {
    fn from(limits: HistoryLimits) -> Self {
        Self::new([limits])
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> ModelConfig {
        ModelConfig::preset("small").unwrap()
    }

    #[test]
    fn a_trained_max_history_caps_both_tasks() {
        let l = HistoryLimits::new(&small(), 1_000).capped(50, 16);
        assert_eq!((l.rank, l.retrieve, l.chunk), (50, 50, 16));
        assert_eq!(l.keep(&[0u32; 50], Task::Rank).len(), 50);
        // 60 items: one chunk of 16 goes, 44 remain.
        assert_eq!(l.keep(&[0u32; 60], Task::Retrieve).len(), 44);
        // A cap above the memory limit changes nothing.
        let m = HistoryLimits::new(&small(), 2);
        assert_eq!(m.capped(10_000, 16), m);
    }

    #[test]
    fn small_preset_limits_come_from_the_position_table() {
        let l = HistoryLimits::new(&small(), 96);
        assert_eq!((l.rank, l.retrieve), (1022, 1024 - SID_STEPS));
        // A quarter of 1021 is 255, rounded down to 16-token blocks.
        assert_eq!(l.chunk, 240);
    }

    #[test]
    fn large_presets_are_bounded_by_the_pages_one_request_may_pin() {
        let hstu = ModelConfig::preset("hstu-6l").unwrap();
        let l = HistoryLimits::new(&hstu, 3);
        assert_eq!((l.rank, l.retrieve, l.chunk), (48, 48, 16));
        let l = HistoryLimits::new(&hstu, 1_000);
        assert_eq!((l.rank, l.retrieve), (4094, 4096 - SID_STEPS));
        assert_eq!(l.chunk % hstu.block_size, 0);
        // No KV at all: nothing of the history can be served.
        let none = HistoryLimits::new(&hstu, 0);
        assert!(none.keep(&[1, 2, 3], Task::Rank).is_empty());
        assert_eq!(pinnable_pages(7), 3);
    }

    #[test]
    fn the_most_recent_items_are_kept() {
        let l = HistoryLimits::new(&small(), 96);
        let history: Vec<u32> = (0..3000).collect();
        let kept = l.keep(&history, Task::Rank);
        assert!(kept.len() <= 1022 && kept.len() > 1022 - 240);
        assert_eq!(kept.last(), Some(&2999));
        assert_eq!(
            kept[0] as usize % 240,
            0,
            "the first kept item is chunk-aligned"
        );
        assert_eq!(l.keep(&history[..1022], Task::Rank).len(), 1022);
        assert_eq!(l.keep(&history[..1022], Task::Retrieve).len(), 782);
    }

    #[test]
    fn the_first_kept_item_moves_once_per_chunk() {
        let (limit, chunk) = (1022, 240);
        let mut starts = Vec::new();
        for len in 0..=5000 {
            let d = oldest_dropped(len, limit, chunk);
            let kept = len - d;
            assert!(kept <= limit, "len {len}");
            assert!(len <= limit || kept > limit - chunk, "len {len}");
            assert_eq!(d % chunk, 0);
            if starts.last() != Some(&d) {
                starts.push(d);
            }
        }
        // One move per `chunk` growth of the history, not one per item.
        assert_eq!(starts.len(), (5000 - limit).div_ceil(chunk) + 1);
    }

    #[test]
    fn truncating_twice_changes_nothing() {
        let l = HistoryLimits::new(&small(), 96);
        for len in [0, 5, 1022, 1023, 1262, 1263, 2999, 100_000] {
            let history: Vec<u32> = (0..len as u32).collect();
            for task in [Task::Rank, Task::Retrieve] {
                let once = l.keep(&history, task);
                assert_eq!(l.keep(once, task), once, "len {len}");
            }
        }
    }

    /// Cut by the decoder, then by the node: the node's items are exactly
    /// those of its own cut of the whole history, for every model and
    /// length, and with one model the decoder's cut is that model's.
    #[test]
    fn a_common_cut_then_a_nodes_own_cut_keep_what_the_nodes_cut_alone_keeps() {
        let block = 16;
        let a = HistoryLimits::new(&small(), 96).capped(50, block);
        let b = HistoryLimits::new(&small(), 96).capped(200, block);
        let odd = HistoryLimits {
            rank: 70,
            retrieve: 30,
            chunk: 7,
        };
        let none = HistoryLimits {
            rank: 0,
            retrieve: 0,
            chunk: 1,
        };
        let sets: [&[HistoryLimits]; 5] = [&[a], &[a, b], &[a, b, odd], &[odd, none], &[b, a, a]];
        let history: Vec<u32> = (0..600).collect();
        for set in sets {
            let common = CommonCut::new(set.iter().copied());
            for len in 0..600 {
                for task in [Task::Rank, Task::Retrieve] {
                    let decoded = &history[common.dropped(len, task)..len];
                    for one in set {
                        assert_eq!(
                            one.keep(decoded, task),
                            one.keep(&history[..len], task),
                            "{set:?}, len {len}, {task:?}"
                        );
                    }
                    if let [one] = set {
                        assert_eq!(common.dropped(len, task), one.dropped(len, task));
                    }
                }
            }
        }
        assert_eq!(CommonCut::new([]).dropped(10, Task::Rank), 0);
        assert_eq!(CommonCut::new([a, a]).limits(), &[a]);
    }

    #[test]
    fn degenerate_limits_keep_at_least_one_item_when_they_can() {
        assert_eq!(chunk_for(0, 16), 1);
        assert_eq!(chunk_for(5, 16), 5);
        assert_eq!(chunk_for(64, 16), 16);
        assert_eq!(oldest_dropped(10, 0, 1), 10);
        assert_eq!(oldest_dropped(10, 3, 3), 9);
        assert_eq!(oldest_dropped(10, 3, 99), 9, "chunk clamped to the limit");
        let u = HistoryLimits::unbounded();
        assert_eq!(u.dropped(usize::MAX - 1, Task::Rank), 0);
    }
}

//! Eviction policies behind one trait, chosen by name: `lru`, `laru`
//! (LCR Alg. 1, Async or Sync), `fpb` (follow predictions blindly), `hf`
//! (LRU pre-filters 4 candidates, prediction picks) and `opt` (Belady,
//! offline, bench only).
//!
//! A policy tracks the resident keys of one cache and their order; the cache
//! owns the values. Time is the cache's access index (one tick per request).

mod hasher;
mod lru;
mod opt;
mod predictive;
mod quad_heap;

pub use hasher::{KeyMap, KeySet, key_map, key_set};
pub use lru::Lru;
pub use opt::{Belady, next_use_times};
pub use predictive::{Mode, PredictiveLru};

/// A cache key (EMB `(table, row)`, KV block hash, item id, trace key).
pub type Key = u64;

/// Sync-mode predictor (LCR Alg. 1 line 16). A prediction depends only on
/// the key's history up to its last request and on the model version, so a
/// policy may keep a prediction until either changes.
pub trait PredictOracle {
    /// The model version in use at `now`.
    fn version(&self, now: u64) -> u64;
    /// Predicted next-access times of `(key, last request time)` pairs at
    /// `now`, pushed to `out` in order; NEG_INFINITY where it cannot say.
    fn predict(&mut self, items: &[(Key, u64)], now: u64, out: &mut Vec<f64>);
}

/// What a cache tells a policy when it asks for a victim.
#[derive(Default)]
pub struct EvictCtx<'a> {
    /// Keys that may not go now (pinned KV blocks, inner radix nodes);
    /// `None`: every key may go.
    pub evictable: Option<&'a dyn Fn(Key) -> bool>,
    /// Sync-mode predictor; ignored by the other policies.
    pub oracle: Option<&'a mut dyn PredictOracle>,
}

impl std::fmt::Debug for EvictCtx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EvictCtx")
            .field("filtered", &self.evictable.is_some())
            .field("oracle", &self.oracle.is_some())
            .finish()
    }
}

impl EvictCtx<'_> {
    pub(crate) fn may_evict(&self, key: Key) -> bool {
        self.evictable.is_none_or(|f| f(key))
    }
}

/// The resident set and eviction order of one cache.
///
/// Protocol per request of `key` at time `now`: `access` (hit or miss); on a
/// miss the cache calls `evict` until it has room, then `insert`. A miss
/// may be accessed again before its `insert` (the prefix cache reports it
/// before its evictions and again when it commits); it is one request.
pub trait EvictionPolicy: Send + std::fmt::Debug {
    /// The policy's name as accepted by [`PolicyName::parse`].
    fn name(&self) -> &'static str;
    /// A request for `key`; returns whether it is resident (a hit) and
    /// updates recency. Called for every request, hit or miss.
    fn access(&mut self, key: Key, now: u64) -> bool;
    /// `key` becomes resident (after a miss; the cache made room).
    fn insert(&mut self, key: Key, now: u64);
    /// Choose a victim, forget it and return it; `None` when nothing may go.
    fn evict(&mut self, now: u64, ctx: &mut EvictCtx<'_>) -> Option<Key>;
    /// Forget a resident key (freed by the cache itself); whether it was there.
    fn remove(&mut self, key: Key) -> bool;
    /// Whether `key` is resident (no recency change).
    fn contains(&self, key: Key) -> bool;
    /// Resident keys.
    fn len(&self) -> usize;
    /// Whether no key is resident.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The cache's capacity in keys (LARU's k); caches call it when it changes.
    fn set_capacity(&mut self, _capacity: usize) {}
    /// Async prediction result: `key`'s predicted next-access time
    /// (LCR Alg. 1 line 24). Ignored by policies without predictions.
    fn set_prediction(&mut self, _key: Key, _next_access: f64) {}
    /// Whether the policy uses predictions at all.
    fn uses_predictions(&self) -> bool {
        false
    }
    /// An independent copy with the same state, for policies whose
    /// decisions depend on their state alone (the oracle α* replays one
    /// epoch from copies); `None` where that does not hold.
    fn clone_box(&self) -> Option<Box<dyn EvictionPolicy>> {
        None
    }
}

/// Policy names accepted in configs and on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PolicyName {
    Lru,
    /// LARU, Async prediction (the default LARU).
    Laru,
    /// LARU, Sync prediction at eviction time.
    LaruSync,
    Fpb,
    Hf,
    /// Belady; offline, needs the trace's future.
    Opt,
}

/// A policy name that is not one of ours.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown eviction policy {0:?} (known: lru, laru, laru-sync, fpb, hf, opt)")]
pub struct UnknownPolicy(pub String);

impl PolicyName {
    /// Every policy, in bench order.
    pub const ALL: [PolicyName; 6] = [
        PolicyName::Lru,
        PolicyName::Laru,
        PolicyName::LaruSync,
        PolicyName::Fpb,
        PolicyName::Hf,
        PolicyName::Opt,
    ];

    pub fn parse(s: &str) -> Result<Self, UnknownPolicy> {
        Ok(match s.trim() {
            "lru" => Self::Lru,
            "laru" | "laru-async" => Self::Laru,
            "laru-sync" => Self::LaruSync,
            "fpb" => Self::Fpb,
            "hf" => Self::Hf,
            "opt" | "belady" => Self::Opt,
            other => return Err(UnknownPolicy(other.to_string())),
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Lru => "lru",
            Self::Laru => "laru",
            Self::LaruSync => "laru-sync",
            Self::Fpb => "fpb",
            Self::Hf => "hf",
            Self::Opt => "opt",
        }
    }

    /// Whether the policy consults predictions (and so noise applies).
    pub fn uses_predictions(self) -> bool {
        matches!(self, Self::Laru | Self::LaruSync | Self::Fpb | Self::Hf)
    }

    /// An online policy for a cache of `capacity` keys. `opt` is offline and
    /// needs the trace's future: build it with [`Belady::new`].
    pub fn build_online(self, capacity: usize) -> Option<Box<dyn EvictionPolicy>> {
        Some(match self {
            Self::Lru => Box::new(Lru::with_capacity(capacity)),
            Self::Laru => Box::new(PredictiveLru::new(Mode::LaruAsync, capacity)),
            Self::LaruSync => Box::new(PredictiveLru::new(Mode::LaruSync, capacity)),
            Self::Fpb => Box::new(PredictiveLru::new(Mode::Fpb, capacity)),
            Self::Hf => Box::new(PredictiveLru::new(Mode::Hf, capacity)),
            Self::Opt => return None,
        })
    }
}

impl std::fmt::Display for PolicyName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

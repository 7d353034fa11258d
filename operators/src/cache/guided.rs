//! A policy plus, for prediction-guided policies, its own online predictor
//! (trained on a background thread): each request is observed and its Async
//! prediction handed to the policy (LCR Alg. 1 line 24).

use crate::eviction::{EvictCtx, EvictionPolicy, Key, PolicyName, UnknownPolicy};
use crate::predictor::{AccessContext, OnlinePredictor, PredictorConfig, Training};

/// Why a policy cannot serve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error(transparent)]
    Unknown(#[from] UnknownPolicy),
    /// Known, but it needs the trace's future (`opt`) or blocks on its
    /// predictor (`laru-sync`).
    #[error(
        "eviction policy {0:?} is for `grflow bench cache` only; a serving cache takes lru, laru, fpb or hf"
    )]
    BenchOnly(String),
}

/// One cache's eviction order, with its clock (one tick per request).
#[derive(Debug)]
pub struct GuidedPolicy {
    policy: Box<dyn EvictionPolicy>,
    predictor: Option<OnlinePredictor>,
    tick: u64,
}

impl GuidedPolicy {
    /// `name`: lru | laru | fpb | hf (online policies; `opt` and
    /// `laru-sync` are bench-only).
    pub fn new(name: &str, capacity: usize) -> Result<Self, PolicyError> {
        let parsed = PolicyName::parse(name)?;
        if matches!(parsed, PolicyName::Opt | PolicyName::LaruSync) {
            return Err(PolicyError::BenchOnly(name.to_string()));
        }
        let policy = parsed.build_online(capacity).expect("online policy");
        let predictor = parsed.uses_predictions().then(|| {
            OnlinePredictor::new(PredictorConfig {
                training: Training::Background,
                ..PredictorConfig::default()
            })
        });
        Ok(Self {
            policy,
            predictor,
            tick: 0,
        })
    }

    pub fn name(&self) -> &'static str {
        self.policy.name()
    }

    /// A request; returns whether `key` is resident.
    pub fn access(&mut self, key: Key) -> bool {
        self.tick += 1;
        self.policy.access(key, self.tick)
    }

    /// A request missed `key` and will insert it after evictions that the
    /// policy must see as caused by this miss (LARU Alg. 1 line 10). No
    /// tick: the request is counted by the `access` before its `insert`,
    /// which repeats the miss without counting the key twice.
    pub fn missed(&mut self, key: Key) {
        let hit = self.policy.access(key, self.tick);
        debug_assert!(!hit, "a missed key is not resident");
    }

    /// `key` (requested last) becomes resident.
    pub fn insert(&mut self, key: Key) {
        self.policy.insert(key, self.tick);
    }

    /// After a request of `key` was served (hit or insert): the Async
    /// prediction for it.
    pub fn observed(&mut self, key: Key, ctx: AccessContext) {
        let t = self.tick;
        if let Some(p) = &mut self.predictor {
            let row = p.observe(key, t, ctx);
            if let Some(next) = p.predict_next(&[row], &[t]) {
                self.policy.set_prediction(key, next[0]);
            }
        }
    }

    pub fn evict(&mut self, evictable: Option<&dyn Fn(Key) -> bool>) -> Option<Key> {
        let mut ctx = EvictCtx {
            evictable,
            oracle: None,
        };
        self.policy.evict(self.tick, &mut ctx)
    }

    pub fn remove(&mut self, key: Key) -> bool {
        self.policy.remove(key)
    }

    pub fn contains(&self, key: Key) -> bool {
        self.policy.contains(key)
    }

    pub fn len(&self) -> usize {
        self.policy.len()
    }

    pub fn is_empty(&self) -> bool {
        self.policy.is_empty()
    }

    pub fn set_capacity(&mut self, capacity: usize) {
        self.policy.set_capacity(capacity);
    }

    /// An independent copy, for a policy whose state is all it decides by:
    /// `None` when it learns online (its predictor trains on a thread of
    /// its own) or cannot be copied.
    pub fn try_clone(&self) -> Option<Self> {
        if self.predictor.is_some() {
            return None;
        }
        Some(Self {
            policy: self.policy.clone_box()?,
            predictor: None,
            tick: self.tick,
        })
    }
}

#[cfg(test)]
impl GuidedPolicy {
    /// `policy` without a predictor: the test sets predictions itself.
    pub(crate) fn without_predictor(policy: Box<dyn EvictionPolicy>) -> Self {
        Self {
            policy,
            predictor: None,
            tick: 0,
        }
    }

    pub(crate) fn set_prediction(&mut self, key: Key, next_access: f64) {
        self.policy.set_prediction(key, next_access);
    }
}

//! HLEM's base policy (§IV-A): an actor–critic over Table I's state and
//! Eq. 3's actions, each a two-layer MLP (64 and 128 tanh units; 18.7K
//! parameters in all, under the paper's 25K), trained offline with PPO
//! (clipped objective, GAE advantages, Adam) and frozen at serve time.
//! Pure: the trainer gathers trajectories from virtual-clock replays and
//! calls [`ActorCritic::update`]; the allocator decides through its frozen
//! f32 copy, [`Decider::greedy`].
//! Weights travel as safetensors bytes (f64) with the sizes and the
//! provenance in the metadata.

use std::collections::HashMap;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use safetensors::{Dtype, SafeTensors, tensor::TensorView};
use serde::{Deserialize, Serialize};

use super::mdp::{ACTIONS, BEST_REWARD};
use super::mlp::{Frozen, Grads, Layer, MAX_WIDTH, Mlp};

/// Hidden sizes of both networks (the paper's "64/128").
pub const HIDDEN: [usize; 2] = [64, 128];
const STATE: usize = 7;
/// Metadata key of the sizes and provenance.
const META_KEY: &str = "grflow_allocator_policy";

/// One decision of a trajectory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Step {
    pub state: [f64; 7],
    /// Index into [`ACTIONS`].
    pub action: usize,
    /// log π(action | state) when it was taken.
    pub logp: f64,
    /// The critic's value of `state` when it was taken.
    pub value: f64,
    /// Eq. 5 over the window after the action.
    pub reward: f64,
    /// Whether moves toward EMB were allowed (see [`ActorCritic::probs`]).
    #[serde(default = "allowed")]
    pub allow_up: bool,
}

fn allowed() -> bool {
    true
}

/// PPO's settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PpoConfig {
    pub gamma: f64,
    pub lambda: f64,
    pub clip: f64,
    /// Passes over the batch per update.
    pub epochs: usize,
    pub minibatch: usize,
    pub learning_rate: f64,
    pub entropy_coef: f64,
}

impl Default for PpoConfig {
    fn default() -> Self {
        Self {
            gamma: 0.9,
            lambda: 0.95,
            clip: 0.2,
            epochs: 4,
            minibatch: 64,
            // 3e-4, the usual PPO default, left the tight policy where it
            // started after 15 iterations of ~1,600 decisions; 1e-3 learned
            // (docs/allocator-bench.md, "A policy that learns").
            learning_rate: 1e-3,
            entropy_coef: 0.01,
        }
    }
}

/// What one update did.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct UpdateStats {
    pub steps: usize,
    pub mean_reward: f64,
    /// Share of the decisions whose window earned Eq. 5's best reward.
    /// Near 1 the reward does not depend on the action (every window
    /// met the SLO), and there is nothing to learn.
    pub best_reward_share: f64,
    pub policy_loss: f64,
    pub value_loss: f64,
    pub entropy: f64,
    /// Mean (old − new) log-probability of the taken actions afterwards.
    pub approx_kl: f64,
}

/// Why policy bytes could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("allocator policy: {0}")]
    Safetensors(String),
    #[error("allocator policy: tensor `{name}`: {problem}")]
    Tensor { name: String, problem: String },
    #[error("allocator policy: metadata `{META_KEY}` missing or unreadable: {0}")]
    Meta(String),
}

/// What a policy file says about itself.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Provenance {
    /// How it was trained: command, cost model, traces, seeds, iterations.
    pub trained_with: String,
    /// The latency objective of its reward: a policy is for this SLO.
    #[serde(default)]
    pub slo_ms: Option<f64>,
}

#[derive(Serialize, Deserialize)]
struct Meta {
    actor: Vec<usize>,
    critic: Vec<usize>,
    provenance: Provenance,
}

/// Adam's moments for one network.
#[derive(Clone, Debug)]
struct Adam {
    m: Grads,
    v: Grads,
    t: i32,
}

impl Adam {
    fn new(net: &Mlp) -> Self {
        Self {
            m: Grads::zeros(net),
            v: Grads::zeros(net),
            t: 0,
        }
    }

    /// Descends `net` along `g` (a gradient of the loss).
    fn step(&mut self, net: &mut Mlp, g: &Grads, rate: f64) {
        const B1: f64 = 0.9;
        const B2: f64 = 0.999;
        self.t += 1;
        let (c1, c2) = (1.0 - B1.powi(self.t), 1.0 - B2.powi(self.t));
        for (((p, g), m), v) in net
            .layers
            .iter_mut()
            .zip(&g.layers)
            .zip(&mut self.m.layers)
            .zip(&mut self.v.layers)
        {
            let one = |p: &mut [f64], g: &[f64], m: &mut [f64], v: &mut [f64]| {
                for i in 0..p.len() {
                    m[i] = B1 * m[i] + (1.0 - B1) * g[i];
                    v[i] = B2 * v[i] + (1.0 - B2) * g[i] * g[i];
                    p[i] -= rate * (m[i] / c1) / ((v[i] / c2).sqrt() + 1e-8);
                }
            };
            one(&mut p.w, &g.w, &mut m.w, &mut v.w);
            one(&mut p.b, &g.b, &mut m.b, &mut v.b);
        }
    }
}

fn softmax(logits: &[f64]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
    let sum: f64 = e.iter().sum();
    e.into_iter().map(|x| x / sum).collect()
}

/// The index of the largest logit among the allowed actions; ties (and
/// NaN) keep the zero move.
fn best_action<T: PartialOrd + Copy>(logits: &[T], allow_up: bool) -> usize {
    let mut best = 3; // the "0" action first among equals
    for (i, l) in logits.iter().enumerate() {
        if (allow_up || ACTIONS[i] <= 0.0) && *l > logits[best] {
            best = i;
        }
    }
    best
}

/// GAE(λ) (advantage, return) of each step of one trajectory. An episode
/// ends at a time limit, not in a terminal state, and time is not in the
/// state: the step after the last is bootstrapped with the last step's own
/// value (V(s_T) ≈ V(s_{T-1}); a Step records no value of the state after
/// it). A value of 0 there would bias the last ~1/(1−γ) steps' targets
/// down by up to V, which the critic cannot explain.
fn gae(t: &[Step], gamma: f64, lambda: f64) -> Vec<(f64, f64)> {
    let mut acc = 0.0;
    let mut out = vec![(0.0, 0.0); t.len()];
    for i in (0..t.len()).rev() {
        let next_value = t.get(i + 1).map_or(t[i].value, |s| s.value);
        let delta = t[i].reward + gamma * next_value - t[i].value;
        acc = delta + gamma * lambda * acc;
        out[i] = (acc, acc + t[i].value);
    }
    out
}

/// A trained actor in f32 for serving-time decisions ([`ActorCritic::decider`]).
#[derive(Clone, Debug)]
pub struct Decider(Frozen);

impl Decider {
    /// The greedy action, as [`ActorCritic::greedy`] (it differs only where
    /// two logits are within f32 rounding of each other).
    pub fn greedy(&self, state: &[f64; 7], allow_up: bool) -> usize {
        self.0
            .forward_with(state, |logits| best_action(logits, allow_up))
    }
}

#[derive(Clone, Debug)]
pub struct ActorCritic {
    actor: Mlp,
    critic: Mlp,
    actor_opt: Adam,
    critic_opt: Adam,
    pub provenance: Provenance,
}

impl PartialEq for ActorCritic {
    fn eq(&self, o: &Self) -> bool {
        self.actor == o.actor && self.critic == o.critic && self.provenance == o.provenance
    }
}

impl ActorCritic {
    /// A fresh policy: uniform over the actions (zero output layer), value 0.
    pub fn new(seed: u64) -> Self {
        let actor = Mlp::zero_output(&[STATE, HIDDEN[0], HIDDEN[1], ACTIONS.len()], seed);
        let critic = Mlp::zero_output(&[STATE, HIDDEN[0], HIDDEN[1], 1], seed.wrapping_add(1));
        Self {
            actor_opt: Adam::new(&actor),
            critic_opt: Adam::new(&critic),
            actor,
            critic,
            provenance: Provenance::default(),
        }
    }

    pub fn parameters(&self) -> usize {
        self.actor.parameters() + self.critic.parameters()
    }

    /// The parameter-wise mean of `policies` (checkpoints of one training,
    /// so of one shape): a late-training average is steadier than any one
    /// checkpoint. The optimiser state and provenance are the first's.
    /// None when `policies` is empty or their shapes differ.
    pub fn average(policies: &[&ActorCritic]) -> Option<ActorCritic> {
        let first = *policies.first()?;
        let mean = |nets: Vec<&Mlp>| -> Option<Mlp> {
            let mut out = nets[0].clone();
            for (l, layer) in out.layers.iter_mut().enumerate() {
                for net in &nets[1..] {
                    let other = net.layers.get(l)?;
                    if (other.inputs, other.outputs) != (layer.inputs, layer.outputs) {
                        return None;
                    }
                    layer.w.iter_mut().zip(&other.w).for_each(|(a, b)| *a += b);
                    layer.b.iter_mut().zip(&other.b).for_each(|(a, b)| *a += b);
                }
                let n = nets.len() as f64;
                layer
                    .w
                    .iter_mut()
                    .chain(layer.b.iter_mut())
                    .for_each(|v| *v /= n);
            }
            nets.iter()
                .all(|net| net.layers.len() == out.layers.len())
                .then_some(out)
        };
        let mut avg = first.clone();
        avg.actor = mean(policies.iter().map(|p| &p.actor).collect())?;
        avg.critic = mean(policies.iter().map(|p| &p.critic).collect())?;
        Some(avg)
    }

    /// The action distribution. `allow_up = false` masks the moves toward
    /// EMB: the node truncated histories in the last window, so its KV
    /// share is already too small for them.
    pub fn probs(&self, state: &[f64; 7], allow_up: bool) -> Vec<f64> {
        let mut logits = self.actor.forward(state);
        if !allow_up {
            for (l, a) in logits.iter_mut().zip(ACTIONS) {
                if a > 0.0 {
                    *l = f64::NEG_INFINITY;
                }
            }
        }
        softmax(&logits)
    }

    pub fn value(&self, state: &[f64; 7]) -> f64 {
        self.critic.forward_with(state, |y| y[0])
    }

    /// The most likely action (index into [`ACTIONS`]). Ties go to the
    /// smaller move.
    pub fn greedy(&self, state: &[f64; 7], allow_up: bool) -> usize {
        self.actor
            .forward_with(state, |logits| best_action(logits, allow_up))
    }

    /// The frozen policy's decision network (an f32 copy of the actor):
    /// what a serving allocator decides with.
    pub fn decider(&self) -> Decider {
        Decider(Frozen::of(&self.actor))
    }

    /// A sampled action with its log-probability and the state's value
    /// (what a training episode records).
    pub fn sample(
        &self,
        state: &[f64; 7],
        allow_up: bool,
        rng: &mut ChaCha8Rng,
    ) -> (usize, f64, f64) {
        let p = self.probs(state, allow_up);
        let u: f64 = rng.random_range(0.0..1.0);
        let mut acc = 0.0;
        let mut a = p.len() - 1;
        for (i, pi) in p.iter().enumerate() {
            acc += pi;
            if u < acc {
                a = i;
                break;
            }
        }
        (a, p[a].max(1e-300).ln(), self.value(state))
    }

    /// One PPO update on whole trajectories (each in time order; its end
    /// is the episode's time limit, not a terminal state).
    pub fn update(
        &mut self,
        trajectories: &[Vec<Step>],
        cfg: &PpoConfig,
        seed: u64,
    ) -> UpdateStats {
        let mut batch: Vec<(&Step, f64, f64)> = Vec::new();
        for t in trajectories {
            let out = gae(t, cfg.gamma, cfg.lambda);
            batch.extend(t.iter().zip(out).map(|(s, (a, r))| (s, a, r)));
        }
        let n = batch.len();
        let mut stats = UpdateStats {
            steps: n,
            mean_reward: batch.iter().map(|b| b.0.reward).sum::<f64>() / n.max(1) as f64,
            best_reward_share: batch
                .iter()
                .filter(|b| b.0.reward >= BEST_REWARD - 1e-9)
                .count() as f64
                / n.max(1) as f64,
            ..Default::default()
        };
        if n == 0 {
            return stats;
        }
        let mean = batch.iter().map(|b| b.1).sum::<f64>() / n as f64;
        let sd = (batch.iter().map(|b| (b.1 - mean).powi(2)).sum::<f64>() / n as f64)
            .sqrt()
            .max(1e-8);
        for b in &mut batch {
            b.1 = (b.1 - mean) / sd;
        }
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut order: Vec<usize> = (0..n).collect();
        let mut last = (0.0, 0.0, 0.0);
        for _ in 0..cfg.epochs {
            // Fisher–Yates with the seeded generator.
            for i in (1..n).rev() {
                order.swap(i, rng.random_range(0..=i));
            }
            for chunk in order.chunks(cfg.minibatch.max(1)) {
                last = self.minibatch(chunk.iter().map(|&i| batch[i]), chunk.len(), cfg);
            }
        }
        (stats.policy_loss, stats.value_loss, stats.entropy) = last;
        stats.approx_kl = batch
            .iter()
            .map(|(s, _, _)| s.logp - self.probs(&s.state, s.allow_up)[s.action].max(1e-300).ln())
            .sum::<f64>()
            / n as f64;
        stats
    }

    /// One gradient step on a minibatch; returns (policy loss, value loss,
    /// entropy), each a mean.
    fn minibatch<'a>(
        &mut self,
        items: impl Iterator<Item = (&'a Step, f64, f64)>,
        len: usize,
        cfg: &PpoConfig,
    ) -> (f64, f64, f64) {
        let scale = 1.0 / len.max(1) as f64;
        let mut actor_g = Grads::zeros(&self.actor);
        let mut critic_g = Grads::zeros(&self.critic);
        let (mut pl, mut vl, mut ent) = (0.0, 0.0, 0.0);
        for (s, adv, ret) in items {
            let p = self.probs(&s.state, s.allow_up);
            let logp = p[s.action].max(1e-300).ln();
            let ratio = (logp - s.logp).exp();
            let clipped = ratio.clamp(1.0 - cfg.clip, 1.0 + cfg.clip);
            pl -= (ratio * adv).min(clipped * adv) * scale;
            // The unclipped term is the active one (the min picks it)
            // unless the ratio left the clip range in the advantage's
            // favour: then the gradient is 0.
            let active = ratio * adv <= clipped * adv;
            let dlogp = if active { -ratio * adv } else { 0.0 };
            let h: f64 = -p.iter().map(|q| q * q.max(1e-300).ln()).sum::<f64>();
            ent += h * scale;
            let dlogits: Vec<f64> = (0..p.len())
                .map(|j| {
                    let onehot = if j == s.action { 1.0 } else { 0.0 };
                    // Loss = −clip term − c·H; ∂H/∂z_j = −p_j (ln p_j + H).
                    let dh = -p[j] * (p[j].max(1e-300).ln() + h);
                    (dlogp * (onehot - p[j]) - cfg.entropy_coef * dh) * scale
                })
                .collect();
            self.actor.backward_add(&s.state, |_| dlogits, &mut actor_g);
            let v = self.value(&s.state);
            vl += 0.5 * (v - ret).powi(2) * scale;
            self.critic
                .backward_add(&s.state, |_| vec![(v - ret) * scale], &mut critic_g);
        }
        // Minibatches are never empty (chunks of the batch).
        self.actor_opt
            .step(&mut self.actor, &actor_g, cfg.learning_rate);
        self.critic_opt
            .step(&mut self.critic, &critic_g, cfg.learning_rate);
        (pl, vl, ent)
    }

    /// The weights as safetensors bytes (f64), sizes and provenance in the
    /// metadata. Optimiser state is not kept: a loaded policy is frozen.
    pub fn to_safetensors(&self) -> Vec<u8> {
        let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
        for (net, name) in [(&self.actor, "actor"), (&self.critic, "critic")] {
            for (i, l) in net.layers.iter().enumerate() {
                let bytes = |v: &[f64]| v.iter().flat_map(|x| x.to_le_bytes()).collect();
                tensors.push((
                    format!("{name}.{i}.w"),
                    vec![l.outputs, l.inputs],
                    bytes(&l.w),
                ));
                tensors.push((format!("{name}.{i}.b"), vec![l.outputs], bytes(&l.b)));
            }
        }
        let views: Vec<(String, TensorView<'_>)> = tensors
            .iter()
            .map(|(n, shape, b)| {
                (
                    n.clone(),
                    TensorView::new(Dtype::F64, shape.clone(), b).expect("shape matches"),
                )
            })
            .collect();
        let sizes = |m: &Mlp| {
            let mut s = vec![m.layers[0].inputs];
            s.extend(m.layers.iter().map(|l| l.outputs));
            s
        };
        let meta = Meta {
            actor: sizes(&self.actor),
            critic: sizes(&self.critic),
            provenance: self.provenance.clone(),
        };
        let meta = HashMap::from([(
            META_KEY.to_string(),
            serde_json::to_string(&meta).expect("metadata serialises"),
        )]);
        safetensors::serialize(views, Some(meta)).expect("serialising in-memory tensors")
    }

    /// Reads [`ActorCritic::to_safetensors`]'s bytes; every tensor is
    /// checked against the sizes in the metadata.
    pub fn from_safetensors(bytes: &[u8]) -> Result<Self, PolicyError> {
        let st_err = |e: safetensors::SafeTensorError| PolicyError::Safetensors(e.to_string());
        let (_, header) = SafeTensors::read_metadata(bytes).map_err(st_err)?;
        let meta: Meta = header
            .metadata()
            .as_ref()
            .and_then(|m| m.get(META_KEY))
            .ok_or_else(|| PolicyError::Meta("absent".into()))
            .and_then(|j| serde_json::from_str(j).map_err(|e| PolicyError::Meta(e.to_string())))?;
        if meta.actor.first() != Some(&STATE)
            || meta.actor.last() != Some(&ACTIONS.len())
            || meta.critic.first() != Some(&STATE)
            || meta.critic.last() != Some(&1)
        {
            return Err(PolicyError::Meta(format!(
                "sizes {:?} / {:?} do not map 7 features to {} actions and a value",
                meta.actor,
                meta.critic,
                ACTIONS.len()
            )));
        }
        // A layer 0 wide (or no layer at all: actor sizes [7] map 7 to 7)
        // would panic at the first forward, inside the dataflow: refuse it
        // here.
        for (name, sizes) in [("actor", &meta.actor), ("critic", &meta.critic)] {
            if sizes.len() < 2 || sizes.contains(&0) {
                return Err(PolicyError::Meta(format!(
                    "{name} sizes {sizes:?}: need at least one layer and no size 0"
                )));
            }
        }
        // The decider keeps its activations on the stack: refuse at load
        // what it could not run, not at the first decision.
        if let Some(w) = meta.actor.iter().find(|&&w| w > MAX_WIDTH) {
            return Err(PolicyError::Meta(format!(
                "actor sizes {:?}: a layer of {w} is wider than the {MAX_WIDTH} a decision supports",
                meta.actor
            )));
        }
        let st = SafeTensors::deserialize(bytes).map_err(st_err)?;
        let read = |name: String, shape: Vec<usize>| -> Result<Vec<f64>, PolicyError> {
            let bad = |problem: String| PolicyError::Tensor {
                name: name.clone(),
                problem,
            };
            let view = st.tensor(&name).map_err(|e| bad(e.to_string()))?;
            if view.dtype() != Dtype::F64 || view.shape() != shape.as_slice() {
                return Err(bad(format!(
                    "{:?} {:?}, expected F64 {shape:?}",
                    view.dtype(),
                    view.shape()
                )));
            }
            let v: Vec<f64> = view
                .data()
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect();
            if v.iter().any(|x| !x.is_finite()) {
                return Err(bad("not finite".into()));
            }
            Ok(v)
        };
        let net = |name: &str, sizes: &[usize]| -> Result<Mlp, PolicyError> {
            let layers = sizes
                .windows(2)
                .enumerate()
                .map(|(i, io)| {
                    Ok(Layer {
                        inputs: io[0],
                        outputs: io[1],
                        w: read(format!("{name}.{i}.w"), vec![io[1], io[0]])?,
                        b: read(format!("{name}.{i}.b"), vec![io[1]])?,
                    })
                })
                .collect::<Result<Vec<_>, PolicyError>>()?;
            Ok(Mlp { layers })
        };
        let actor = net("actor", &meta.actor)?;
        let critic = net("critic", &meta.critic)?;
        Ok(Self {
            actor_opt: Adam::new(&actor),
            critic_opt: Adam::new(&critic),
            actor,
            critic,
            provenance: meta.provenance,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_average_of_checkpoints_is_their_parameter_mean() {
        let (a, b) = (ActorCritic::new(1), ActorCritic::new(2));
        let avg = ActorCritic::average(&[&a, &b]).unwrap();
        for (net, (x, y)) in [
            (&avg.actor, (&a.actor, &b.actor)),
            (&avg.critic, (&a.critic, &b.critic)),
        ] {
            for (l, layer) in net.layers.iter().enumerate() {
                let (xl, yl) = (&x.layers[l], &y.layers[l]);
                for i in 0..layer.w.len() {
                    assert!((layer.w[i] - (xl.w[i] + yl.w[i]) / 2.0).abs() < 1e-12);
                }
                for i in 0..layer.b.len() {
                    assert!((layer.b[i] - (xl.b[i] + yl.b[i]) / 2.0).abs() < 1e-12);
                }
            }
        }
        assert_ne!(avg.actor, a.actor);
        assert_eq!(ActorCritic::average(&[&a]).unwrap(), a);
        assert!(ActorCritic::average(&[]).is_none());
        let mut shallower = b.clone();
        shallower.actor.layers.pop();
        assert!(ActorCritic::average(&[&a, &shallower]).is_none());
    }

    #[test]
    fn the_networks_are_the_papers_size_and_start_uniform() {
        let p = ActorCritic::new(1);
        assert!(p.parameters() < 25_000, "{}", p.parameters());
        let s = [0.3, 0.5, 0.8, 0.2, 0.1, 0.4, 0.3];
        for q in p.probs(&s, true) {
            assert!((q - 1.0 / 7.0).abs() < 1e-12);
        }
        assert_eq!(p.greedy(&s, true), 3, "ties pick the zero move");
        // Masked: no move toward EMB has any probability.
        let masked = p.probs(&s, false);
        assert!(masked[4..].iter().all(|q| *q == 0.0));
        assert!((masked[0] - 0.25).abs() < 1e-12);
        assert_eq!(p.value(&s), 0.0);
    }

    /// `bytes` with the metadata's sizes replaced (the tensors as they are).
    fn with_sizes(bytes: &[u8], actor: Vec<usize>, critic: Vec<usize>) -> Vec<u8> {
        let st = SafeTensors::deserialize(bytes).unwrap();
        let meta = Meta {
            actor,
            critic,
            provenance: Provenance::default(),
        };
        let meta = HashMap::from([(META_KEY.to_string(), serde_json::to_string(&meta).unwrap())]);
        safetensors::serialize(st.tensors(), Some(meta)).unwrap()
    }

    #[test]
    fn safetensors_round_trip_keeps_every_weight_and_the_provenance() {
        let mut p = ActorCritic::new(2);
        let s = [0.3, 0.5, 0.8, 0.2, 0.1, 0.4, 0.3];
        // Move the weights off their initial values.
        let traj = vec![
            Step {
                state: s,
                action: 6,
                logp: (1.0f64 / 7.0).ln(),
                value: 0.0,
                reward: 1.0,
                allow_up: true,
            };
            8
        ];
        p.update(&[traj], &PpoConfig::default(), 1);
        p.provenance.trained_with = "test".into();
        p.provenance.slo_ms = Some(3.0);
        let q = ActorCritic::from_safetensors(&p.to_safetensors()).unwrap();
        assert_eq!(p, q);
        assert_eq!(p.probs(&s, true), q.probs(&s, true));
        // Not a policy: refused with the reason.
        let err = ActorCritic::from_safetensors(b"not safetensors").unwrap_err();
        assert!(err.to_string().starts_with("allocator policy"), "{err}");
        // A layer wider than a decision can run: refused at load.
        let mut wide = ActorCritic::new(3);
        wide.actor = Mlp::zero_output(&[STATE, MAX_WIDTH + 1, ACTIONS.len()], 3);
        let err = ActorCritic::from_safetensors(&wide.to_safetensors()).unwrap_err();
        assert!(err.to_string().contains("wider than"), "{err}");
        wide.actor = Mlp::zero_output(&[STATE, MAX_WIDTH, ACTIONS.len()], 3);
        let ok = ActorCritic::from_safetensors(&wide.to_safetensors()).unwrap();
        assert_eq!(ok.decider().greedy(&s, true), ok.greedy(&s, true));
    }

    #[test]
    fn a_policy_with_a_layer_zero_wide_or_no_layer_is_refused_at_load() {
        // Consistent bytes (tensors of the sizes in the metadata): the
        // mlp would panic at the first decision, inside the dataflow.
        let mut zero = ActorCritic::new(4);
        zero.actor = Mlp::zero_output(&[STATE, 0, ACTIONS.len()], 4);
        let err = ActorCritic::from_safetensors(&zero.to_safetensors())
            .map(|_| "accepted")
            .unwrap_err();
        assert!(err.to_string().contains("no size 0"), "{err}");
        // The same checked on the sizes alone (before any tensor is read).
        let fresh = ActorCritic::new(4).to_safetensors();
        for (actor, critic) in [
            (vec![STATE, 64, ACTIONS.len()], vec![STATE, 0, 1]),
            (vec![STATE, 0, 128, ACTIONS.len()], vec![STATE, 64, 128, 1]),
            // Seven features to seven actions with no layer between.
            (vec![STATE], vec![STATE, 64, 128, 1]),
        ] {
            let bytes = with_sizes(&fresh, actor, critic);
            let err = ActorCritic::from_safetensors(&bytes)
                .map(|_| "accepted")
                .unwrap_err();
            assert!(err.to_string().contains("no size 0"), "{err}");
        }
    }

    #[test]
    fn the_decider_decides_as_the_trained_policy() {
        // Every committed policy: on random states the f32 decider picks the
        // f64 greedy action unless the two best logits are within 1e-4.
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs");
        let mut files = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "safetensors") {
                continue;
            }
            files += 1;
            let p = ActorCritic::from_safetensors(&std::fs::read(&path).unwrap()).unwrap();
            let d = p.decider();
            let mut rng = ChaCha8Rng::seed_from_u64(13);
            let (mut same, mut close) = (0, 0);
            for i in 0..2_000 {
                let s: [f64; 7] = std::array::from_fn(|_| rng.random_range(0.0..1.0));
                let allow_up = i % 4 != 0;
                let (want, got) = (p.greedy(&s, allow_up), d.greedy(&s, allow_up));
                if want == got {
                    same += 1;
                    continue;
                }
                let logits = p.actor.forward(&s);
                assert!(
                    (logits[want] - logits[got]).abs() < 1e-4,
                    "{}: {s:?} picks {got}, the policy {want} ({logits:?})",
                    path.display()
                );
                close += 1;
            }
            assert!(
                same >= 1_990,
                "{}: {same} agree, {close} near ties",
                path.display()
            );
        }
        assert!(files >= 1, "no policy file in {}", dir.display());
        // A fresh policy's ties keep the zero move in f32 too.
        assert_eq!(ActorCritic::new(1).decider().greedy(&[0.5; 7], true), 3);
    }

    /// A toy MDP in the allocator's shape: α moves by the action, the
    /// reward is highest at α = 0.3. PPO learns to move toward it from
    /// either side.
    #[test]
    fn ppo_learns_to_steer_alpha_toward_the_best_value() {
        let mut p = ActorCritic::new(3);
        let cfg = PpoConfig {
            learning_rate: 1e-3,
            ..PpoConfig::default()
        };
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let state = |alpha: f64| [0.3, 0.5, 0.8, 0.2, 0.1, alpha, 0.3];
        let mut last_mean = 0.0;
        for iteration in 0..60 {
            let mut trajs = Vec::new();
            for e in 0..8 {
                let mut alpha = if e % 2 == 0 { 0.1 } else { 0.9 };
                let mut t = Vec::new();
                for _ in 0..20 {
                    let s = state(alpha);
                    let (a, logp, value) = p.sample(&s, true, &mut rng);
                    alpha = super::super::mdp::apply(alpha, ACTIONS[a], 0.1, 0.9);
                    let reward = 1.0 - 4.0 * (alpha - 0.3).abs();
                    t.push(Step {
                        state: s,
                        action: a,
                        logp,
                        value,
                        reward,
                        allow_up: true,
                    });
                }
                trajs.push(t);
            }
            last_mean = p.update(&trajs, &cfg, iteration).mean_reward;
        }
        assert!(last_mean > 0.5, "mean reward after training {last_mean}");
        // Greedy decisions point toward 0.3 from both sides.
        assert!(ACTIONS[p.greedy(&state(0.8), true)] < 0.0);
        assert!(ACTIONS[p.greedy(&state(0.1), true)] > 0.0);
        assert!(ACTIONS[p.greedy(&state(0.1), false)] <= 0.0);
    }

    #[test]
    fn the_time_limited_end_of_an_episode_is_bootstrapped_not_terminal() {
        // A steady reward of 0.8 at γ 0.9 is worth 8 from any state; a
        // critic that knows it leaves nothing to learn at any step, the
        // last ones included (the episode stops at 120 epochs, the
        // process does not).
        let cfg = PpoConfig::default();
        let step = Step {
            state: [0.5; 7],
            action: 3,
            logp: (1.0f64 / ACTIONS.len() as f64).ln(),
            value: 0.8 / (1.0 - cfg.gamma),
            reward: 0.8,
            allow_up: true,
        };
        let out = gae(&vec![step; 120], cfg.gamma, cfg.lambda);
        for (i, (advantage, ret)) in out.iter().enumerate() {
            assert!(advantage.abs() < 1e-9, "step {i}: advantage {advantage}");
            assert!((ret - 8.0).abs() < 1e-9, "step {i}: return {ret}");
        }
    }

    /// The share of decisions at Eq. 5's best reward is what tells a
    /// trainer that the reward is flat (every window met the SLO).
    #[test]
    fn update_counts_the_decisions_at_the_best_reward() {
        let mut p = ActorCritic::new(1);
        let step = |reward: f64| Step {
            state: [0.5; 7],
            action: 3,
            logp: (1.0f64 / ACTIONS.len() as f64).ln(),
            value: 0.0,
            reward,
            allow_up: true,
        };
        let trajs = vec![vec![step(1.0), step(0.4)], vec![step(1.0), step(-0.5)]];
        let stats = p.update(&trajs, &PpoConfig::default(), 1);
        assert_eq!(stats.steps, 4);
        assert_eq!(stats.best_reward_share, 0.5);
        assert_eq!(stats.mean_reward, (1.0 + 0.4 + 1.0 - 0.5) / 4.0);
        let flat = vec![vec![step(1.0); 3]];
        assert_eq!(
            p.update(&flat, &PpoConfig::default(), 2).best_reward_share,
            1.0
        );
    }
}

//! AdamW (decoupled weight decay) over every trained tensor.

use crate::params::Params;

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AdamWConfig {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    /// Decoupled decay of the matrices and tables (not of gains).
    pub weight_decay: f32,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.98,
            eps: 1e-8,
            weight_decay: 0.0,
        }
    }
}

/// The optimiser's moments and step count.
#[derive(Clone, Debug, PartialEq)]
pub struct AdamW {
    pub cfg: AdamWConfig,
    pub m: Params,
    pub v: Params,
    pub step: u64,
}

impl AdamW {
    pub fn new(cfg: AdamWConfig, p: &Params) -> Self {
        AdamW {
            cfg,
            m: p.zeros_like(),
            v: p.zeros_like(),
            step: 0,
        }
    }

    pub fn update(&mut self, p: &mut Params, g: &Params) {
        self.step += 1;
        let c = &self.cfg;
        let b1c = 1.0 - c.beta1.powi(self.step as i32);
        let b2c = 1.0 - c.beta2.powi(self.step as i32);
        let names: Vec<String> = p.trainable().into_iter().map(|(n, _)| n).collect();
        let gs = g.trainable();
        for ((((name, w), m), v), (_, gt)) in names
            .iter()
            .zip(p.trainable_mut())
            .zip(self.m.trainable_mut())
            .zip(self.v.trainable_mut())
            .zip(gs)
        {
            let gain = name.ends_with("ln1") || name.ends_with("ln2") || name == "ln_f";
            let decay = if gain { 0.0 } else { c.lr * c.weight_decay };
            for (((w, m), v), &g) in w.iter_mut().zip(m.iter_mut()).zip(v.iter_mut()).zip(gt) {
                *m = c.beta1 * *m + (1.0 - c.beta1) * g;
                *v = c.beta2 * *v + (1.0 - c.beta2) * g * g;
                let upd = (*m / b1c) / ((*v / b2c).sqrt() + c.eps);
                *w -= c.lr * upd + decay * *w;
            }
        }
    }
}

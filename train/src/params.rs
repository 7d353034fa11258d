//! The trained weights: the kernels' transformer tensors plus item
//! embedding table 0, in the safetensors layout of `train/README.md`.

use std::collections::HashMap;

use grflow_kernels::{GrModel, ModelConfig};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};
use safetensors::{Dtype, SafeTensors, tensor::TensorView};

use crate::error::TrainError;

/// Safetensors metadata key of the model config (the kernels' key).
pub const CONFIG_KEY: &str = "grflow.model_config";
/// Name of embedding table `t` (`rows × d_model`).
pub fn table_name(t: usize) -> String {
    format!("emb.{t}")
}

/// One pre-norm layer; names and layouts as in kernels (`in × out`).
#[derive(Clone, Debug, PartialEq)]
pub struct Layer {
    pub ln1: Vec<f32>,
    pub wqkv: Vec<f32>,
    pub wo: Vec<f32>,
    pub ln2: Vec<f32>,
    pub w1: Vec<f32>,
    pub w2: Vec<f32>,
}

/// Every tensor of a trained model. The generative-retrieval tensors
/// (`gen_token`, `sid_emb`, `sid_head`) ride along untrained so that the
/// file loads as a kernels model.
#[derive(Clone, Debug, PartialEq)]
pub struct Params {
    pub cfg: ModelConfig,
    /// Table 0, the item id: `n_items × d`.
    pub emb: Vec<f32>,
    pub pos: Vec<f32>,
    pub instr: Vec<f32>,
    pub ln_f: Vec<f32>,
    pub w_rank: Vec<f32>,
    pub layers: Vec<Layer>,
    pub frozen: Vec<(String, Vec<usize>, Vec<f32>)>,
}

const FROZEN: [&str; 3] = ["gen_token", "sid_emb", "sid_head"];

impl Params {
    /// Kernels' seeded init for the transformer; item rows uniform with
    /// standard deviation 1 (the scale of the instruction token).
    pub fn init(cfg: ModelConfig, n_items: usize, seed: u64) -> Result<Self, TrainError> {
        let bytes = GrModel::try_new(cfg, seed)?.to_safetensors();
        let mut p = Self::from_safetensors_with(&bytes, Some(n_items), "init")?;
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed_e3b0);
        let a = 3f32.sqrt();
        for v in &mut p.emb {
            *v = ((rng.next_u32() >> 8) as f32 / 8_388_608.0 - 1.0) * a;
        }
        p.pos = sinusoidal(p.cfg.max_positions, p.cfg.d_model);
        Ok(p)
    }

    /// Scales the item rows (the trainer's init sets their spread).
    pub fn scale_items(&mut self, s: f32) {
        self.emb.iter_mut().for_each(|v| *v *= s);
    }

    pub fn n_items(&self) -> usize {
        self.emb.len() / self.cfg.d_model
    }

    pub fn item_row(&self, item: u32) -> &[f32] {
        let d = self.cfg.d_model;
        &self.emb[item as usize * d..(item as usize + 1) * d]
    }

    /// Zeros of the same shapes (a gradient or an optimiser moment).
    pub fn zeros_like(&self) -> Self {
        let z = |v: &Vec<f32>| vec![0f32; v.len()];
        Params {
            cfg: self.cfg.clone(),
            emb: z(&self.emb),
            pos: z(&self.pos),
            instr: z(&self.instr),
            ln_f: z(&self.ln_f),
            w_rank: z(&self.w_rank),
            layers: self
                .layers
                .iter()
                .map(|l| Layer {
                    ln1: z(&l.ln1),
                    wqkv: z(&l.wqkv),
                    wo: z(&l.wo),
                    ln2: z(&l.ln2),
                    w1: z(&l.w1),
                    w2: z(&l.w2),
                })
                .collect(),
            frozen: Vec::new(),
        }
    }

    /// The trained tensors with their names, in a fixed order.
    pub fn trainable(&self) -> Vec<(String, &Vec<f32>)> {
        let mut out = vec![
            (table_name(0), &self.emb),
            ("pos_emb".to_string(), &self.pos),
            ("instr_token".to_string(), &self.instr),
            ("ln_f".to_string(), &self.ln_f),
            ("w_rank".to_string(), &self.w_rank),
        ];
        for (i, l) in self.layers.iter().enumerate() {
            for (n, t) in [
                ("ln1", &l.ln1),
                ("wqkv", &l.wqkv),
                ("wo", &l.wo),
                ("ln2", &l.ln2),
                ("w1", &l.w1),
                ("w2", &l.w2),
            ] {
                out.push((format!("layers.{i}.{n}"), t));
            }
        }
        out
    }

    /// As [`Params::trainable`], mutable (same order).
    pub fn trainable_mut(&mut self) -> Vec<&mut Vec<f32>> {
        let mut out = vec![
            &mut self.emb,
            &mut self.pos,
            &mut self.instr,
            &mut self.ln_f,
            &mut self.w_rank,
        ];
        for l in &mut self.layers {
            out.extend([
                &mut l.ln1,
                &mut l.wqkv,
                &mut l.wo,
                &mut l.ln2,
                &mut l.w1,
                &mut l.w2,
            ]);
        }
        out
    }

    fn shape(&self, name: &str) -> Vec<usize> {
        let (d, f) = (self.cfg.d_model, self.cfg.d_ff);
        match name.rsplit('.').next().unwrap_or(name) {
            _ if name.starts_with("emb.") => vec![self.n_items(), d],
            "pos_emb" => vec![self.cfg.max_positions, d],
            "instr_token" | "ln_f" | "ln1" | "ln2" => vec![d],
            "w_rank" | "wo" => vec![d, d],
            "wqkv" => vec![d, 3 * d],
            "w1" => vec![d, f],
            "w2" => vec![f, d],
            // The untrained retrieval tensors, as the kernels lay them out.
            "gen_token" => vec![d],
            "sid_emb" => vec![2, self.cfg.codebook_size, d],
            "sid_head" => vec![3, d, self.cfg.codebook_size],
            _ => vec![],
        }
    }

    /// The safetensors file: every tensor f32 little-endian, row-major,
    /// the kernels' config in the metadata.
    pub fn to_safetensors(&self) -> Vec<u8> {
        let mut named: Vec<(String, Vec<usize>, Vec<u8>)> = self
            .trainable()
            .into_iter()
            .map(|(n, t)| (n.clone(), self.shape(&n), le_bytes(t)))
            .collect();
        for (n, shape, t) in &self.frozen {
            named.push((n.clone(), shape.clone(), le_bytes(t)));
        }
        let views: Vec<(String, TensorView<'_>)> = named
            .iter()
            .map(|(n, s, b)| {
                let v = TensorView::new(Dtype::F32, s.clone(), b).expect("shapes match data");
                (n.clone(), v)
            })
            .collect();
        let mut meta = HashMap::new();
        meta.insert(
            CONFIG_KEY.to_string(),
            serde_json::to_string(&self.cfg).expect("config serialises"),
        );
        safetensors::serialize(views, Some(meta)).expect("serialising in-memory tensors")
    }

    /// Reads a file in the documented format; `origin` names it in errors.
    pub fn from_safetensors(bytes: &[u8], origin: &str) -> Result<Self, TrainError> {
        Self::from_safetensors_with(bytes, None, origin)
    }

    /// `items`: the row count of table 0 when the buffer has no table (a
    /// bare kernels model being initialised).
    fn from_safetensors_with(
        bytes: &[u8],
        items: Option<usize>,
        origin: &str,
    ) -> Result<Self, TrainError> {
        let bad = |reason: String| TrainError::Model {
            path: origin.into(),
            reason,
        };
        let (_, meta) = SafeTensors::read_metadata(bytes).map_err(|e| bad(e.to_string()))?;
        let cfg_json = meta
            .metadata()
            .as_ref()
            .and_then(|m| m.get(CONFIG_KEY))
            .ok_or_else(|| bad(format!("metadata key {CONFIG_KEY} missing")))?;
        let cfg: ModelConfig =
            serde_json::from_str(cfg_json).map_err(|e| bad(format!("{CONFIG_KEY}: {e}")))?;
        cfg.validate().map_err(|e| bad(e.to_string()))?;
        let st = SafeTensors::deserialize(bytes).map_err(|e| bad(e.to_string()))?;
        let d = cfg.d_model;
        let n_items = match items {
            Some(n) => n,
            None => {
                let v = st
                    .tensor(&table_name(0))
                    .map_err(|e| bad(format!("{}: {e}", table_name(0))))?;
                match v.shape() {
                    [rows, w] if *w == d => *rows,
                    s => {
                        return Err(bad(format!(
                            "{}: shape {s:?}, expected [items, {d}]",
                            table_name(0)
                        )));
                    }
                }
            }
        };
        let mut p = Params {
            emb: vec![0.0; n_items * d],
            pos: Vec::new(),
            instr: Vec::new(),
            ln_f: Vec::new(),
            w_rank: Vec::new(),
            layers: Vec::new(),
            frozen: Vec::new(),
            cfg,
        };
        let read = |p: &Params, name: &str| -> Result<Vec<f32>, TrainError> {
            let v = st.tensor(name).map_err(|e| bad(format!("{name}: {e}")))?;
            if v.dtype() != Dtype::F32 {
                return Err(bad(format!("{name}: dtype {:?}, expected F32", v.dtype())));
            }
            let want = p.shape(name);
            if !want.is_empty() && v.shape() != want.as_slice() {
                return Err(bad(format!(
                    "{name}: shape {:?}, expected {want:?}",
                    v.shape()
                )));
            }
            let values = from_le(v.data());
            if let Some(i) = values.iter().position(|x| !x.is_finite()) {
                return Err(bad(format!(
                    "{name}: value {} at index {i} is not finite",
                    values[i]
                )));
            }
            Ok(values)
        };
        if items.is_none() {
            p.emb = read(&p, &table_name(0))?;
        }
        p.pos = read(&p, "pos_emb")?;
        p.instr = read(&p, "instr_token")?;
        p.ln_f = read(&p, "ln_f")?;
        p.w_rank = read(&p, "w_rank")?;
        for i in 0..p.cfg.n_layers {
            let r = |n: &str| read(&p, &format!("layers.{i}.{n}"));
            let l = Layer {
                ln1: r("ln1")?,
                wqkv: r("wqkv")?,
                wo: r("wo")?,
                ln2: r("ln2")?,
                w1: r("w1")?,
                w2: r("w2")?,
            };
            p.layers.push(l);
        }
        // Optional here (optimiser moments have none); the kernels loader
        // requires them in a model file. Checked as the trained ones are:
        // they are written back as F32 of their shape (`to_safetensors`),
        // and other bytes would be served as floats or fail that write.
        let present = st.names();
        for name in FROZEN {
            if present.contains(&name) {
                let values = read(&p, name)?;
                p.frozen.push((name.to_string(), p.shape(name), values));
            }
        }
        Ok(p)
    }

    /// The transformer as a kernels model (the serving path).
    pub fn to_kernels(&self) -> Result<GrModel, TrainError> {
        Ok(GrModel::from_safetensors(&self.to_safetensors())?)
    }
}

/// Sinusoidal rows: the learned positions start translation-equivariant,
/// so "attend to the previous item" is one pattern for every position
/// instead of one to learn per absolute position.
fn sinusoidal(rows: usize, d: usize) -> Vec<f32> {
    let mut out = vec![0f32; rows * d];
    for (p, row) in out.chunks_exact_mut(d).enumerate() {
        for (i, pair) in row.chunks_mut(2).enumerate() {
            let f = (p as f64) / 10_000f64.powf(2.0 * i as f64 / d as f64);
            pair[0] = f.sin() as f32;
            if let Some(c) = pair.get_mut(1) {
                *c = f.cos() as f32;
            }
        }
    }
    out
}

fn le_bytes(t: &[f32]) -> Vec<u8> {
    t.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn from_le(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_weight_that_is_not_finite_is_refused_on_load_naming_its_tensor() {
        let mut model = ModelConfig::preset("small").unwrap();
        model.n_tables = 1;
        let mut p = Params::init(model, 10, 1).unwrap();
        let ok = p.to_safetensors();
        assert!(Params::from_safetensors(&ok, "m").is_ok());
        p.w_rank[3] = f32::NAN;
        let err = Params::from_safetensors(&p.to_safetensors(), "m")
            .unwrap_err()
            .to_string();
        assert!(err.contains("w_rank") && err.contains("index 3"), "{err}");
    }

    /// `bytes` with tensor `name` replaced by `data` of `dtype` and `shape`.
    fn replaced(bytes: &[u8], name: &str, dtype: Dtype, shape: Vec<usize>, data: &[u8]) -> Vec<u8> {
        let (_, meta) = SafeTensors::read_metadata(bytes).unwrap();
        let st = SafeTensors::deserialize(bytes).unwrap();
        let mut views: Vec<(String, TensorView<'_>)> = st
            .tensors()
            .into_iter()
            .filter(|(n, _)| n != name)
            .collect();
        views.push((name.into(), TensorView::new(dtype, shape, data).unwrap()));
        safetensors::serialize(views, meta.metadata().clone()).unwrap()
    }

    /// The untrained retrieval tensors are written back as F32 of their
    /// shape: other dtypes or shapes, or values that are not finite, are
    /// refused on load naming the tensor (they panicked on the write back,
    /// or were served as the bits of floats).
    #[test]
    fn an_untrained_tensor_of_another_dtype_or_shape_is_refused_naming_it() {
        let mut model = ModelConfig::preset("small").unwrap();
        model.n_tables = 1;
        let p = Params::init(model, 10, 1).unwrap();
        let ok = p.to_safetensors();
        let back = Params::from_safetensors(&ok, "m").unwrap();
        assert_eq!(back.to_safetensors(), ok);
        let (c, d) = (p.cfg.codebook_size, p.cfg.d_model);
        let n = 2 * c * d;
        let nan: Vec<u8> = (0..n)
            .flat_map(|i| if i == 5 { f32::NAN } else { 0.5 }.to_le_bytes())
            .collect();
        for (dtype, shape, data, says) in [
            (Dtype::I32, vec![2, c, d], vec![0u8; 4 * n], "dtype I32"),
            (Dtype::F64, vec![c, d], vec![0u8; 4 * n], "dtype F64"),
            (Dtype::F32, vec![c, 2 * d], vec![0u8; 4 * n], "shape"),
            (Dtype::F32, vec![2, c, d], nan, "index 5"),
        ] {
            let bytes = replaced(&ok, "sid_emb", dtype, shape, &data);
            let err = Params::from_safetensors(&bytes, "m")
                .unwrap_err()
                .to_string();
            assert!(err.contains("sid_emb") && err.contains(says), "{err}");
        }
        let bytes = replaced(
            &ok,
            "gen_token",
            Dtype::F32,
            vec![d + 1],
            &vec![0u8; 4 * (d + 1)],
        );
        let err = Params::from_safetensors(&bytes, "m")
            .unwrap_err()
            .to_string();
        assert!(err.contains("gen_token"), "{err}");
    }
}

//! Trained embedding tables read from a model file: tensors `emb.{t}`
//! (`rows × d_model`, f32) beside the transformer's, one per table of the
//! config (format: train/README.md). An item's input token is the sum of
//! its rows, one per table.

use safetensors::{Dtype, SafeTensors};

use crate::config::ModelConfig;
use crate::error::KernelError;

/// The embedding tables of a model file.
#[derive(Clone, Debug, PartialEq)]
pub struct EmbeddingTables {
    d: usize,
    /// `tables[t]` is `rows_t × d`, row-major.
    tables: Vec<Vec<f32>>,
}

impl EmbeddingTables {
    /// Reads tables `emb.0..emb.{n_tables}` of `cfg` from a safetensors
    /// buffer; an absent tensor, another dtype or a width other than
    /// `d_model` is an error naming the tensor.
    pub fn from_safetensors(cfg: &ModelConfig, bytes: &[u8]) -> Result<Self, KernelError> {
        let st =
            SafeTensors::deserialize(bytes).map_err(|e| KernelError::Safetensors(e.to_string()))?;
        let d = cfg.d_model;
        let tables = (0..cfg.n_tables)
            .map(|t| {
                let name = format!("emb.{t}");
                let v = st
                    .tensor(&name)
                    .map_err(|e| KernelError::Weights(format!("{name}: {e}")))?;
                match (v.dtype(), v.shape()) {
                    (Dtype::F32, [_, w]) if *w == d => crate::model::finite_f32s(&name, v.data()),
                    (dt, s) => Err(KernelError::Weights(format!(
                        "{name}: {dt:?} {s:?}, expected F32 [rows, {d}]"
                    ))),
                }
            })
            .collect::<Result<Vec<Vec<f32>>, KernelError>>()?;
        Ok(EmbeddingTables { d, tables })
    }

    pub fn n_tables(&self) -> usize {
        self.tables.len()
    }

    /// Rows of table `t`.
    pub fn rows(&self, t: usize) -> usize {
        self.tables[t].len() / self.d
    }

    /// Row `row` of table `t`, or `None` when out of range.
    pub fn row(&self, t: usize, row: u32) -> Option<&[f32]> {
        let r = row as usize;
        self.tables
            .get(t)
            .filter(|tab| r < tab.len() / self.d)
            .map(|tab| &tab[r * self.d..(r + 1) * self.d])
    }

    /// `out = Σ_t table_t[feature_ids[t]]`: the item's input token.
    pub fn token(&self, feature_ids: &[u32], out: &mut [f32]) -> Result<(), KernelError> {
        if feature_ids.len() != self.tables.len() || out.len() != self.d {
            return Err(KernelError::Shape {
                what: "feature_ids",
                expected: self.tables.len(),
                got: feature_ids.len(),
            });
        }
        out.fill(0.0);
        for (t, &f) in feature_ids.iter().enumerate() {
            let row = self.row(t, f).ok_or_else(|| {
                KernelError::Weights(format!("emb.{t}: row {f} of {}", self.rows(t)))
            })?;
            out.iter_mut().zip(row).for_each(|(o, v)| *o += v);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::tensor::TensorView;

    #[test]
    fn tables_load_and_sum_into_tokens() {
        let mut cfg = ModelConfig::preset("small").unwrap();
        cfg.d_model = 4;
        cfg.n_heads = 1;
        cfg.n_tables = 2;
        let t0: Vec<u8> = (0..12).flat_map(|i| (i as f32).to_le_bytes()).collect();
        let t1: Vec<u8> = (0..8)
            .flat_map(|i| (100.0 + i as f32).to_le_bytes())
            .collect();
        let views = vec![
            (
                "emb.0",
                TensorView::new(Dtype::F32, vec![3, 4], &t0).unwrap(),
            ),
            (
                "emb.1",
                TensorView::new(Dtype::F32, vec![2, 4], &t1).unwrap(),
            ),
        ];
        let bytes = safetensors::serialize(views, None).unwrap();
        let tabs = EmbeddingTables::from_safetensors(&cfg, &bytes).unwrap();
        assert_eq!((tabs.n_tables(), tabs.rows(0), tabs.rows(1)), (2, 3, 2));
        let mut tok = [0f32; 4];
        tabs.token(&[2, 1], &mut tok).unwrap();
        assert_eq!(tok, [8.0 + 104.0, 9.0 + 105.0, 10.0 + 106.0, 11.0 + 107.0]);
        assert!(tabs.token(&[3, 0], &mut tok).is_err());
        cfg.n_tables = 3;
        let err = EmbeddingTables::from_safetensors(&cfg, &bytes).unwrap_err();
        assert!(err.to_string().contains("emb.2"), "{err}");
        // An infinite entry would make every score built on its row inf.
        cfg.n_tables = 2;
        let mut bad = t1.clone();
        bad[4..8].copy_from_slice(&f32::INFINITY.to_le_bytes());
        let views = vec![
            (
                "emb.0",
                TensorView::new(Dtype::F32, vec![3, 4], &t0).unwrap(),
            ),
            (
                "emb.1",
                TensorView::new(Dtype::F32, vec![2, 4], &bad).unwrap(),
            ),
        ];
        let bytes = safetensors::serialize(views, None).unwrap();
        let err = EmbeddingTables::from_safetensors(&cfg, &bytes).unwrap_err();
        assert!(err.to_string().contains("emb.1: element 1 is inf"), "{err}");
    }
}

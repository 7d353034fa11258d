//! The host tier: every embedding table in full, in host memory. The device
//! EMB cache holds copies of some rows; a miss copies a row from here over
//! the link.
//!
//! Values are a deterministic function of (seed, table, row), so every node
//! (and every run) holds the same tables without shipping them.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Trained tables that do not fit the catalog's table layout.
#[derive(Debug, thiserror::Error)]
pub enum HostTablesError {
    #[error("{got} embedding tables, the catalog has {expected}")]
    Tables { expected: usize, got: usize },
    #[error("emb.{table}: {got} floats, expected {expected}")]
    Shape {
        table: usize,
        expected: usize,
        got: usize,
    },
}

#[derive(Debug, Clone)]
pub struct HostTables {
    dim: usize,
    /// Row count of each table, including its out-of-vocabulary row (last).
    rows: Vec<u32>,
    offsets: Vec<usize>,
    values: Vec<f32>,
}

impl HostTables {
    /// `table_rows[t]` known rows in table t, each of `dim` floats, plus one
    /// out-of-vocabulary row per table for ids the catalog does not know.
    pub fn new(table_rows: &[u32], dim: usize, seed: u64) -> Self {
        let rows: Vec<u32> = table_rows.iter().map(|r| r + 1).collect();
        let mut offsets = Vec::with_capacity(rows.len());
        let mut total = 0usize;
        for &r in &rows {
            offsets.push(total);
            total += r as usize * dim;
        }
        let mut values = vec![0f32; total];
        // One stream per table keeps tables independent of each other's size.
        let scale = (1.0 / dim as f32).sqrt();
        for (t, &r) in rows.iter().enumerate() {
            let mut rng = ChaCha8Rng::seed_from_u64(seed ^ ((t as u64 + 1) << 32));
            let table = &mut values[offsets[t]..offsets[t] + r as usize * dim];
            for v in table {
                *v = (rng.random::<f32>() * 2.0 - 1.0) * scale;
            }
        }
        Self {
            dim,
            rows,
            offsets,
            values,
        }
    }

    /// Trained tables: `values[t]` holds `table_rows[t]` rows of `dim`
    /// floats, row-major; each table gets a zero OOV row (an unknown id
    /// adds nothing to the item's token).
    pub fn from_values(
        table_rows: &[u32],
        dim: usize,
        values: &[Vec<f32>],
    ) -> Result<Self, HostTablesError> {
        if values.len() != table_rows.len() {
            return Err(HostTablesError::Tables {
                expected: table_rows.len(),
                got: values.len(),
            });
        }
        let rows: Vec<u32> = table_rows.iter().map(|r| r + 1).collect();
        let mut offsets = Vec::with_capacity(rows.len());
        let mut flat = Vec::new();
        for (t, (v, &r)) in values.iter().zip(table_rows).enumerate() {
            if v.len() != r as usize * dim {
                return Err(HostTablesError::Shape {
                    table: t,
                    expected: r as usize * dim,
                    got: v.len(),
                });
            }
            offsets.push(flat.len());
            flat.extend_from_slice(v);
            flat.extend(std::iter::repeat_n(0f32, dim));
        }
        Ok(Self {
            dim,
            rows,
            offsets,
            values: flat,
        })
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    pub fn tables(&self) -> usize {
        self.rows.len()
    }

    /// The OOV row of `table`.
    pub fn oov_row(&self, table: u16) -> u32 {
        self.rows[table as usize] - 1
    }

    /// Maps a feature id to its row: itself, or the OOV row when out of range.
    pub fn resolve(&self, table: u16, feature: u32) -> (u32, bool) {
        let oov = self.oov_row(table);
        if feature < oov {
            (feature, false)
        } else {
            (oov, true)
        }
    }

    pub fn row(&self, table: u16, row: u32) -> &[f32] {
        let start = self.offsets[table as usize] + row as usize * self.dim;
        &self.values[start..start + self.dim]
    }

    pub fn row_bytes(&self) -> usize {
        self.dim * std::mem::size_of::<f32>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_deterministic_and_bounded() {
        let a = HostTables::new(&[10, 3], 8, 1);
        let b = HostTables::new(&[10, 3], 8, 1);
        assert_eq!(a.row(1, 2), b.row(1, 2));
        assert_ne!(a.row(0, 0), a.row(0, 1));
        assert!(a.row(0, 5).iter().all(|v| v.abs() <= (1.0f32 / 8.0).sqrt()));
    }

    #[test]
    fn trained_values_are_served_as_given_with_a_zero_oov_row() {
        let t0: Vec<f32> = (0..6).map(|v| v as f32).collect();
        let t = HostTables::from_values(&[3, 1], 2, &[t0, vec![9.0, 8.0]]).unwrap();
        assert_eq!(t.row(0, 2), &[4.0, 5.0]);
        assert_eq!(t.row(1, 0), &[9.0, 8.0]);
        assert_eq!(t.resolve(0, 7), (3, true));
        assert_eq!(t.row(0, 3), &[0.0, 0.0]);
        let err = HostTables::from_values(&[3, 1], 2, &[vec![0.0; 5], vec![0.0; 2]]).unwrap_err();
        assert!(err.to_string().contains("emb.0"), "{err}");
        assert!(HostTables::from_values(&[3], 2, &[]).is_err());
    }

    #[test]
    fn unknown_features_map_to_the_oov_row() {
        let t = HostTables::new(&[10, 3], 4, 1);
        assert_eq!(t.resolve(1, 2), (2, false));
        assert_eq!(t.resolve(1, 3), (3, true));
        assert_eq!(t.resolve(1, 999), (3, true));
        assert_eq!(t.row(1, 3).len(), 4);
    }
}

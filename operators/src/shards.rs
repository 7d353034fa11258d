//! Embedding shards: a shard is a fixed row range of one embedding table
//! (HLEM tracks EMB residency at shard granularity).

use serde::{Deserialize, Serialize};

/// Global shard id: tables are laid out one after another.
pub type ShardId = u32;

/// Maps (table, row) to its shard.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShardMap {
    shard_rows: u32,
    /// First shard id of each table, plus one past the last.
    offsets: Vec<ShardId>,
}

impl ShardMap {
    /// `table_rows[t]` rows in table t, cut into shards of `shard_rows` rows.
    pub fn new(table_rows: &[u32], shard_rows: u32) -> Self {
        let shard_rows = shard_rows.max(1);
        let mut offsets = Vec::with_capacity(table_rows.len() + 1);
        let mut next = 0u32;
        offsets.push(0);
        for &rows in table_rows {
            next += rows.div_ceil(shard_rows);
            offsets.push(next);
        }
        Self {
            shard_rows,
            offsets,
        }
    }

    pub fn shard_rows(&self) -> u32 {
        self.shard_rows
    }

    pub fn num_shards(&self) -> u32 {
        *self.offsets.last().unwrap_or(&0)
    }

    /// The shard holding (table, row).
    pub fn shard_of(&self, table: u16, row: u32) -> ShardId {
        self.offsets[table as usize] + row / self.shard_rows
    }

    /// The table and row range of a shard (the range of a table's last shard
    /// may run past the table's end).
    pub fn rows_of(&self, shard: ShardId) -> (u16, std::ops::Range<u32>) {
        // offsets[t] <= shard < offsets[t + 1]
        let table = self.offsets.partition_point(|&o| o <= shard) - 1;
        let start = (shard - self.offsets[table]) * self.shard_rows;
        (table as u16, start..start + self.shard_rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_laid_out_one_after_another() {
        let m = ShardMap::new(&[100, 10], 32);
        assert_eq!(m.num_shards(), 4 + 1);
        assert_eq!(m.shard_of(0, 0), 0);
        assert_eq!(m.shard_of(0, 99), 3);
        assert_eq!(m.shard_of(1, 9), 4);
        assert_eq!(m.rows_of(0), (0, 0..32));
        assert_eq!(m.rows_of(3), (0, 96..128));
        assert_eq!(m.rows_of(4), (1, 0..32));
    }
}

//! Loading a trace's side tables (users, items, metadata), which every
//! worker holds in full. Unlike requests, a bad row here is an error: a
//! history or catalog with holes would silently change every request.

use std::collections::BTreeSet;
use std::path::Path;

use grflow_traces::columnar::{
    DecodeError, ITEM_COLUMNS, ITEMS_FILE, META_KEY, USER_COLUMNS, USERS_FILE, decode_items,
    decode_users, meta_from_json,
};
use grflow_traces::{Item, TraceMeta, UserHistory};

use super::SourceError;
use super::files::{CheckedFile, open_checked};

/// The side tables of a trace.
#[derive(Clone, Debug, PartialEq)]
pub struct SideTables {
    pub meta: TraceMeta,
    /// In file order (the generators and importers write them by user_id).
    pub users: Vec<UserHistory>,
    /// In file order (by item_id).
    pub items: Vec<Item>,
}

/// Reads and checks users.parquet and items.parquet (with the trace
/// metadata) of the trace directory `dir`.
pub fn load_side_tables(dir: &Path) -> Result<SideTables, SourceError> {
    let users_file = open_checked(dir, USERS_FILE, &USER_COLUMNS)?;
    let items_file = open_checked(dir, ITEMS_FILE, &ITEM_COLUMNS)?;
    let meta = read_meta(&items_file)?;
    let users = read_all(&users_file, decode_users)?;
    let items = read_all(&items_file, decode_items)?;
    if items.is_empty() {
        return Err(SourceError::NoRows {
            file: items_file.path.clone(),
            why: "a catalog without items would serve every candidate as out of vocabulary",
        });
    }

    let mut seen = BTreeSet::new();
    for (row, u) in users.iter().enumerate() {
        if !seen.insert(u.user_id) {
            return Err(bad_row(
                &users_file,
                row,
                "user_id",
                format!("duplicate user_id {}", u.user_id),
            ));
        }
    }
    let mut seen = BTreeSet::new();
    // Retrieval decodes a semantic ID to one item: a second item with the
    // same ID could never be retrieved.
    let mut sids = std::collections::HashMap::new();
    for (row, it) in items.iter().enumerate() {
        if let Some(other) = sids.insert(it.sid, it.item_id) {
            let reason = format!(
                "sid {:?} is item {other}'s too: semantic IDs must be unique",
                it.sid
            );
            return Err(bad_row(&items_file, row, "sid", reason));
        }
        if !seen.insert(it.item_id) {
            return Err(bad_row(
                &items_file,
                row,
                "item_id",
                format!("duplicate item_id {}", it.item_id),
            ));
        }
        if it.feature_ids.len() != meta.n_tables as usize {
            let reason = format!(
                "{} feature ids, the trace has {} tables",
                it.feature_ids.len(),
                meta.n_tables
            );
            return Err(bad_row(&items_file, row, "feature_ids", reason));
        }
        if let Some((t, f)) = it
            .feature_ids
            .iter()
            .enumerate()
            .find(|&(t, &f)| f >= meta.table_rows[t])
        {
            let reason = format!(
                "feature id {f} of table {t} is out of range (table_rows {})",
                meta.table_rows[t]
            );
            return Err(bad_row(&items_file, row, "feature_ids", reason));
        }
        if let Some(c) = it.sid.iter().find(|&&c| c >= meta.codebook_size) {
            let reason = format!("code {c} is not below codebook_size {}", meta.codebook_size);
            return Err(bad_row(&items_file, row, "sid", reason));
        }
    }
    Ok(SideTables { meta, users, items })
}

fn bad_row(file: &CheckedFile, row: usize, column: &'static str, reason: String) -> SourceError {
    SourceError::BadRow {
        file: file.path.clone(),
        row: row as u64,
        column,
        reason,
    }
}

fn read_meta(file: &CheckedFile) -> Result<TraceMeta, SourceError> {
    let err = |reason: String| SourceError::Meta {
        file: file.path.clone(),
        key: META_KEY,
        reason,
    };
    let kv = file
        .metadata
        .metadata()
        .file_metadata()
        .key_value_metadata();
    let json = kv
        .and_then(|kv| kv.iter().find(|e| e.key == META_KEY))
        .and_then(|e| e.value.as_deref())
        .ok_or_else(|| err("missing".into()))?;
    let meta = meta_from_json(json).map_err(|e| err(e.to_string()))?;
    if meta.table_rows.len() != meta.n_tables as usize || meta.n_tables == 0 {
        return Err(err(format!(
            "n_tables {} but {} table_rows",
            meta.n_tables,
            meta.table_rows.len()
        )));
    }
    // Every row of every table is held in host memory: u32::MAX rows
    // wrapped a row index and panicked the nodes.
    if let Some((t, r)) = meta
        .table_rows
        .iter()
        .enumerate()
        .find(|&(_, &r)| !(1..=MAX_TABLE_ROWS).contains(&r))
    {
        return Err(err(format!(
            "table_rows[{t}] = {r}: must be in 1..={MAX_TABLE_ROWS}"
        )));
    }
    Ok(meta)
}

/// The most rows a trace's embedding table may have: the generator's
/// largest catalog.
const MAX_TABLE_ROWS: u32 = grflow_traces::generate::MAX_ITEMS;

fn read_all<T>(
    file: &CheckedFile,
    decode: fn(&arrow::array::RecordBatch) -> Result<Vec<T>, DecodeError>,
) -> Result<Vec<T>, SourceError> {
    let batches = file.read(None).map_err(|message| SourceError::Corrupt {
        file: file.path.clone(),
        message,
    })?;
    let mut out = Vec::new();
    for batch in &batches {
        let offset = out.len();
        match decode(batch) {
            Ok(rows) => out.extend(rows),
            Err(DecodeError::Column(e)) => {
                return Err(SourceError::Schema {
                    file: file.path.clone(),
                    column: e.column(),
                    problem: e.to_string(),
                });
            }
            Err(DecodeError::Row { row, error }) => {
                return Err(bad_row(file, offset + row, error.column, error.reason));
            }
        }
    }
    Ok(out)
}

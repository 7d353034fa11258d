//! Trained weights for the nodes: a `grflow train` model directory, checked
//! against the catalog of the trace being served before any node is built.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use grflow_kernels::ModelConfig;
use grflow_operators::node::TrainedWeights;
use grflow_traces::{Item, TraceMeta};
use grflow_train::artifact::{
    ITEMS_FILE, MODEL_JSON, ModelDir, WEIGHTS_FILE, items_hash, load_model_dir,
};

/// Why a model directory cannot serve this trace; `path` is the file at
/// fault.
#[derive(Debug, thiserror::Error)]
#[error("{}: {reason}", path.display())]
pub struct WeightsError {
    pub path: PathBuf,
    pub reason: String,
}

/// What the node parameters take from a model directory.
#[derive(Debug)]
pub struct Trained {
    pub config: ModelConfig,
    pub weights: Arc<TrainedWeights>,
}

/// A check's finding: the file of the model directory at fault, and why.
type Fault = (&'static str, String);

/// Loads `dir` for a trace whose catalog is `items` (`meta` its tables):
/// the item space must be the catalog's exactly, the arch a preset, the
/// vocabulary table 0 only, and every tensor of the documented shape.
pub fn load(dir: &Path, meta: &TraceMeta, items: &[Item]) -> Result<Trained, WeightsError> {
    let bad = |(file, reason): Fault| WeightsError {
        path: dir.join(file),
        reason,
    };
    // Tensor names and shapes are checked here (the error names the tensor).
    let m = load_model_dir(dir).map_err(|e| match e {
        grflow_train::TrainError::Model { path, reason } => WeightsError { path, reason },
        grflow_train::TrainError::Io { path, source } => WeightsError {
            path,
            reason: source.to_string(),
        },
        other => bad((WEIGHTS_FILE, other.to_string())),
    })?;
    check_description(&m).map_err(bad)?;
    check_catalog(&m.items, items).map_err(bad)?;
    let tables = embedding_tables(&m, meta).map_err(bad)?;
    let safetensors = m.params.to_safetensors();
    // Fails here, before any node, if the kernels cannot load it.
    grflow_kernels::GrModel::from_safetensors(&safetensors)
        .map_err(|e| bad((WEIGHTS_FILE, e.to_string())))?;
    // Retrieve requests decode semantic IDs of the trace's codebook.
    if m.params.cfg.codebook_size != meta.codebook_size as usize {
        return Err(bad((
            WEIGHTS_FILE,
            format!(
                "codebook_size {} but the trace's semantic IDs use {}",
                m.params.cfg.codebook_size, meta.codebook_size
            ),
        )));
    }
    // Last, so that a file broken in a way named above says so: the files
    // must be the ones the version was made from (a directory still being
    // copied, or one mixing two models, would serve one model's weights
    // under another's version).
    let json = &m.json;
    if json.model_version != m.files_version {
        return Err(bad((
            MODEL_JSON,
            format!(
                "model_version {} does not match the files, which hash to {}: a directory \
                 still being copied, or files of different models",
                json.model_version, m.files_version
            ),
        )));
    }
    // The config stays the file's: beam search checks it against the model.
    Ok(Trained {
        config: m.params.cfg.clone(),
        weights: Arc::new(TrainedWeights {
            safetensors,
            tables,
            model_version: json.model_version.clone(),
            max_history: json.max_history,
        }),
    })
}

/// model.json against the weights and items beside it: a served arch, the
/// weights' own config, the item id as the only vocabulary table, and the
/// item count.
fn check_description(m: &ModelDir) -> Result<(), Fault> {
    let json = &m.json;
    if ModelConfig::preset(&json.arch).is_none() {
        return Err((
            MODEL_JSON,
            format!(
                "arch {:?} is not one grflow serves (small, hstu-3l, hstu-6l)",
                json.arch
            ),
        ));
    }
    if json.model_config != m.params.cfg {
        return Err((
            MODEL_JSON,
            format!(
                "model_config {:?} differs from {WEIGHTS_FILE}'s {:?}",
                json.model_config, m.params.cfg
            ),
        ));
    }
    if json.vocabulary.tables != [0] {
        return Err((
            MODEL_JSON,
            format!(
                "vocabulary.tables {:?}: only table 0 (the item id) can be served",
                json.vocabulary.tables
            ),
        ));
    }
    if json.vocabulary.items != m.items.len() {
        return Err((
            MODEL_JSON,
            format!(
                "vocabulary.items {} but {ITEMS_FILE} has {}",
                json.vocabulary.items,
                m.items.len()
            ),
        ));
    }
    Ok(())
}

/// The model's items (`model`) must be the trace's catalog (`trace`) row
/// for row, and item i must sit at row i with table-0 feature i.
fn check_catalog(model: &[Item], trace: &[Item]) -> Result<(), Fault> {
    let (model_hash, trace_hash) = (items_hash(model), items_hash(trace));
    if model.len() != trace.len() || model_hash != trace_hash {
        let first = model
            .iter()
            .zip(trace)
            .position(|(a, b)| a.item_id != b.item_id)
            .map(|i| format!("; first difference at row {i}"))
            .unwrap_or_default();
        return Err((
            ITEMS_FILE,
            format!(
                "{} items (hash {model_hash}) but the trace's catalog has {} (hash {trace_hash}){first}",
                model.len(),
                trace.len()
            ),
        ));
    }
    // Equal ids say only that the catalogs have one size (ids are 0..n):
    // another dataset of the same size would pass, and every item would
    // take another's embedding. Its features, length and semantic ID too.
    if let Some((row, (a, b))) = model
        .iter()
        .zip(trace)
        .enumerate()
        .find(|(_, (a, b))| a != b)
    {
        return Err((
            ITEMS_FILE,
            format!(
                "row {row}: the model's item {} (feature ids {:?}, {} tokens, semantic ID {:?}) differs \
                 from the trace's (feature ids {:?}, {} tokens, semantic ID {:?}): the model was \
                 trained on another catalog",
                a.item_id, a.feature_ids, a.token_len, a.sid, b.feature_ids, b.token_len, b.sid
            ),
        ));
    }
    // The trainer's row i is item i; serving reads table 0 at an item's
    // first feature id, so the two must agree.
    if let Some((row, it)) = trace
        .iter()
        .enumerate()
        .find(|(i, it)| it.item_id as usize != *i || it.feature_ids.first() != Some(&it.item_id))
    {
        return Err((
            ITEMS_FILE,
            format!(
                "row {row}: item {} with feature ids {:?}; serving needs item i at row i with table-0 feature i",
                it.item_id, it.feature_ids
            ),
        ));
    }
    Ok(())
}

/// One embedding table per trace table: table 0 holds the trained item
/// embeddings; its rows past the catalog and the untrained side tables are
/// zeros, adding nothing to a token, as in training.
fn embedding_tables(m: &ModelDir, meta: &TraceMeta) -> Result<Vec<Vec<f32>>, Fault> {
    let d = m.params.cfg.d_model;
    let mut tables = Vec::with_capacity(meta.table_rows.len());
    for (t, &rows) in meta.table_rows.iter().enumerate() {
        let mut v = vec![0f32; rows as usize * d];
        if t == 0 {
            if (rows as usize) < m.params.n_items() {
                return Err((
                    ITEMS_FILE,
                    format!(
                        "{} items but the trace's table 0 has {rows} rows",
                        m.params.n_items()
                    ),
                ));
            }
            v[..m.params.emb.len()].copy_from_slice(&m.params.emb);
        }
        tables.push(v);
    }
    Ok(tables)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog(n: u32) -> Vec<Item> {
        (0..n)
            .map(|i| Item {
                item_id: i,
                feature_ids: vec![i, i % 3],
                token_len: 1,
                sid: [0, 1, i as u16],
            })
            .collect()
    }

    #[test]
    fn the_same_catalog_passes() {
        assert!(check_catalog(&catalog(5), &catalog(5)).is_ok());
    }

    #[test]
    fn another_size_names_the_counts_and_the_first_differing_row() {
        let (file, why) = check_catalog(&catalog(4), &catalog(5)).unwrap_err();
        assert_eq!(file, ITEMS_FILE);
        assert!(
            why.starts_with("4 items") && why.contains("catalog has 5"),
            "{why}"
        );
        let mut shuffled = catalog(5);
        shuffled.swap(1, 2);
        let (_, why) = check_catalog(&shuffled, &catalog(5)).unwrap_err();
        assert!(why.ends_with("first difference at row 1"), "{why}");
    }

    #[test]
    fn equal_ids_with_other_features_name_the_row() {
        let mut other = catalog(5);
        other[3].feature_ids[1] = 9;
        let (file, why) = check_catalog(&other, &catalog(5)).unwrap_err();
        assert_eq!(file, ITEMS_FILE);
        // The hash covers the ids only: the row-by-row check names it.
        assert!(
            why.starts_with("row 3: the model's item 3 (feature ids [3, 9]")
                && why.contains("another catalog"),
            "{why}"
        );
    }

    #[test]
    fn an_item_off_its_row_or_table_zero_id_is_refused() {
        let mut trace = catalog(3);
        trace[2].feature_ids[0] = 0;
        let (file, why) = check_catalog(&trace, &trace).unwrap_err();
        assert_eq!(file, ITEMS_FILE);
        assert!(why.starts_with("row 2: item 2"), "{why}");
    }
}

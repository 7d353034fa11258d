//! Trained weights for the nodes: a `grflow train` model directory, checked
//! against the catalog of the trace being served before any node is built.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use grflow_kernels::ModelConfig;
use grflow_operators::node::TrainedWeights;
use grflow_traces::{Item, TraceMeta};
use grflow_train::artifact::{ITEMS_FILE, MODEL_JSON, WEIGHTS_FILE, items_hash, load_model_dir};

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

/// Loads `dir` for a trace whose catalog is `items` (`meta` its tables):
/// the item space must be the catalog's exactly, the arch a preset, the
/// vocabulary table 0 only, and every tensor of the documented shape.
pub fn load(dir: &Path, meta: &TraceMeta, items: &[Item]) -> Result<Trained, WeightsError> {
    let bad = |file: &str, reason: String| WeightsError {
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
        other => bad(WEIGHTS_FILE, other.to_string()),
    })?;
    let json = &m.json;
    if ModelConfig::preset(&json.arch).is_none() {
        return Err(bad(
            MODEL_JSON,
            format!(
                "arch {:?} is not one grflow serves (small, hstu-3l, hstu-6l)",
                json.arch
            ),
        ));
    }
    if json.model_config != m.params.cfg {
        return Err(bad(
            MODEL_JSON,
            format!(
                "model_config {:?} differs from {WEIGHTS_FILE}'s {:?}",
                json.model_config, m.params.cfg
            ),
        ));
    }
    if json.vocabulary.tables != [0] {
        return Err(bad(
            MODEL_JSON,
            format!(
                "vocabulary.tables {:?}: only table 0 (the item id) can be served",
                json.vocabulary.tables
            ),
        ));
    }
    if json.vocabulary.items != m.items.len() {
        return Err(bad(
            MODEL_JSON,
            format!(
                "vocabulary.items {} but {ITEMS_FILE} has {}",
                json.vocabulary.items,
                m.items.len()
            ),
        ));
    }
    let (model_hash, trace_hash) = (items_hash(&m.items), items_hash(items));
    if m.items.len() != items.len() || model_hash != trace_hash {
        let first = m
            .items
            .iter()
            .zip(items)
            .position(|(a, b)| a.item_id != b.item_id)
            .map(|i| format!("; first difference at row {i}"))
            .unwrap_or_default();
        return Err(bad(
            ITEMS_FILE,
            format!(
                "{} items (hash {model_hash}) but the trace's catalog has {} (hash {trace_hash}){first}",
                m.items.len(),
                items.len()
            ),
        ));
    }
    // Equal ids say only that the catalogs have one size (ids are 0..n):
    // another dataset of the same size would pass, and every item would
    // take another's embedding. Its features, length and semantic ID too.
    if let Some((row, (a, b))) = m
        .items
        .iter()
        .zip(items)
        .enumerate()
        .find(|(_, (a, b))| a != b)
    {
        return Err(bad(
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
    if let Some((row, it)) = items
        .iter()
        .enumerate()
        .find(|(i, it)| it.item_id as usize != *i || it.feature_ids.first() != Some(&it.item_id))
    {
        return Err(bad(
            ITEMS_FILE,
            format!(
                "row {row}: item {} with feature ids {:?}; serving needs item i at row i with table-0 feature i",
                it.item_id, it.feature_ids
            ),
        ));
    }
    let d = m.params.cfg.d_model;
    let mut tables = Vec::with_capacity(meta.table_rows.len());
    for (t, &rows) in meta.table_rows.iter().enumerate() {
        // Table 0 rows past the catalog and the untrained side tables add
        // nothing to a token, as in training.
        let mut v = vec![0f32; rows as usize * d];
        if t == 0 {
            if (rows as usize) < m.params.n_items() {
                return Err(bad(
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
    let safetensors = m.params.to_safetensors();
    // Fails here, before any node, if the kernels cannot load it.
    grflow_kernels::GrModel::from_safetensors(&safetensors)
        .map_err(|e| bad(WEIGHTS_FILE, e.to_string()))?;
    // Retrieve requests decode semantic IDs of the trace's codebook.
    if m.params.cfg.codebook_size != meta.codebook_size as usize {
        return Err(bad(
            WEIGHTS_FILE,
            format!(
                "codebook_size {} but the trace's semantic IDs use {}",
                m.params.cfg.codebook_size, meta.codebook_size
            ),
        ));
    }
    // Last, so that a file broken in a way named above says so: the files
    // must be the ones the version was made from (a directory still being
    // copied, or one mixing two models, would serve one model's weights
    // under another's version).
    if json.model_version != m.files_version {
        return Err(bad(
            MODEL_JSON,
            format!(
                "model_version {} does not match the files, which hash to {}: a directory \
                 still being copied, or files of different models",
                json.model_version, m.files_version
            ),
        ));
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

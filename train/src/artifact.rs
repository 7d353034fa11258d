//! The model directory `grflow train` writes and `grflow eval` reads:
//! `model.safetensors`, `items.parquet` and `model.json`.

use std::fs::File;
use std::path::Path;

use grflow_traces::Item;
use grflow_traces::columnar::{META_KEY, decode_items, items_to_batch, meta_to_json};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use serde::{Deserialize, Serialize};

use crate::checkpoint::write_atomic;
use crate::error::TrainError;
use crate::fit::{EpochReport, TrainConfig};
use crate::metrics::RankMetrics;
use crate::params::Params;

pub const WEIGHTS_FILE: &str = "model.safetensors";
pub const ITEMS_FILE: &str = "items.parquet";
pub const MODEL_JSON: &str = "model.json";

/// The item space a model was trained on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Vocabulary {
    pub items: usize,
    /// FNV-1a of the item id list in table-0 row order.
    pub items_hash: String,
    /// Embedding tables trained (0 = item id); the random side tables of
    /// imported traces are not used.
    pub tables: Vec<usize>,
}

/// `model.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelJson {
    /// Content hash of model.safetensors, items.parquet and the rest of
    /// this file.
    pub model_version: String,
    pub arch: String,
    pub model_config: grflow_kernels::ModelConfig,
    /// Histories are cut to their most recent `max_history` items.
    pub max_history: usize,
    pub vocabulary: Vocabulary,
    pub dataset: DatasetInfo,
    pub seed: u64,
    pub hyper_parameters: TrainConfig,
    pub commit: String,
    pub epochs: usize,
    pub best_epoch: usize,
    /// Validation metrics of the best epoch.
    pub valid: RankMetrics,
    pub history: Vec<EpochReport>,
    pub training_secs: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DatasetInfo {
    pub trace: String,
    pub fingerprint: String,
    pub users: usize,
}

pub(crate) fn fnv(bytes: impl IntoIterator<Item = u8>, mut h: u64) -> u64 {
    for b in bytes {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

pub(crate) const FNV0: u64 = 0xcbf2_9ce4_8422_2325;

/// The hash recorded in [`Vocabulary::items_hash`].
pub fn items_hash(items: &[Item]) -> String {
    format!(
        "{:016x}",
        fnv(items.iter().flat_map(|i| i.item_id.to_le_bytes()), FNV0)
    )
}

fn items_parquet(items: &[Item]) -> Result<Vec<u8>, String> {
    let batch = items_to_batch(items);
    let meta = grflow_traces::TraceMeta {
        n_tables: items.first().map_or(1, |i| i.feature_ids.len() as u16),
        table_rows: Vec::new(),
        codebook_size: 0,
        source: "grflow train".into(),
    };
    let props = WriterProperties::builder()
        .set_key_value_metadata(Some(vec![KeyValue::new(
            META_KEY.to_string(),
            meta_to_json(&meta),
        )]))
        .build();
    let mut buf = Vec::new();
    let mut w =
        ArrowWriter::try_new(&mut buf, batch.schema(), Some(props)).map_err(|e| e.to_string())?;
    w.write(&batch).map_err(|e| e.to_string())?;
    w.close().map_err(|e| e.to_string())?;
    Ok(buf)
}

/// The model version of a directory's files: a hash of the weights, the
/// items file and model.json without its `model_version`.
fn files_version(params: &Params, weights: &[u8], items_bytes: &[u8], json: &ModelJson) -> String {
    let mut unversioned = json.clone();
    unversioned.model_version = String::new();
    let body = serde_json::to_vec(&unversioned).expect("model.json serialises");
    let h = fnv(
        body,
        fnv(
            items_bytes.iter().copied(),
            fnv(weights.iter().copied(), FNV0),
        ),
    );
    format!(
        "gr-{}d{}l-{h:016x}",
        params.cfg.d_model, params.cfg.n_layers
    )
}

/// Writes the model directory and returns the model version.
pub fn write_model_dir(
    dir: &Path,
    params: &Params,
    items: &[Item],
    mut json: ModelJson,
) -> Result<String, TrainError> {
    std::fs::create_dir_all(dir).map_err(TrainError::io(dir))?;
    let weights = params.to_safetensors();
    let items_bytes = items_parquet(items).map_err(|reason| TrainError::Model {
        path: dir.join(ITEMS_FILE),
        reason,
    })?;
    json.model_version = files_version(params, &weights, &items_bytes, &json);
    // Each file is renamed into place and model.json goes last: a reader
    // never sees half a file, and one that reads while the three are
    // replaced finds files that do not hash to `model_version` and refuses
    // them (serving and `grflow eval` both check).
    let write = |name: &str, bytes: &[u8]| write_atomic(&dir.join(name), bytes);
    write(WEIGHTS_FILE, &weights)?;
    write(ITEMS_FILE, &items_bytes)?;
    write(
        MODEL_JSON,
        &serde_json::to_vec_pretty(&json).expect("model.json serialises"),
    )?;
    Ok(json.model_version)
}

/// A model directory read back.
#[derive(Clone, Debug)]
pub struct ModelDir {
    pub params: Params,
    pub items: Vec<Item>,
    pub json: ModelJson,
    /// The version the files hash to; not `json.model_version` when the
    /// directory is being copied or mixes files of different models.
    pub files_version: String,
}

pub fn load_model_dir(dir: &Path) -> Result<ModelDir, TrainError> {
    let wpath = dir.join(WEIGHTS_FILE);
    let bytes = std::fs::read(&wpath).map_err(TrainError::io(&wpath))?;
    let params = Params::from_safetensors(&bytes, &wpath.display().to_string())?;
    let jpath = dir.join(MODEL_JSON);
    let jbytes = std::fs::read(&jpath).map_err(TrainError::io(&jpath))?;
    let json: ModelJson = serde_json::from_slice(&jbytes).map_err(|e| TrainError::Model {
        path: jpath.clone(),
        reason: e.to_string(),
    })?;
    let ipath = dir.join(ITEMS_FILE);
    let bad = |reason: String| TrainError::Model {
        path: ipath.clone(),
        reason,
    };
    let items_bytes = std::fs::read(&ipath).map_err(TrainError::io(&ipath))?;
    let file = File::open(&ipath).map_err(TrainError::io(&ipath))?;
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
        .and_then(|b| b.build())
        .map_err(|e| bad(e.to_string()))?;
    let mut items = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| bad(e.to_string()))?;
        items.extend(decode_items(&batch).map_err(|e| bad(e.to_string()))?);
    }
    if items.len() != params.n_items() || items_hash(&items) != json.vocabulary.items_hash {
        return Err(bad(format!(
            "{} items (hash {}), the weights have {} rows and model.json says hash {}",
            items.len(),
            items_hash(&items),
            params.n_items(),
            json.vocabulary.items_hash
        )));
    }
    let files_version = files_version(&params, &bytes, &items_bytes, &json);
    Ok(ModelDir {
        params,
        items,
        json,
        files_version,
    })
}

//! The model directory `grflow train` writes and `grflow eval` reads:
//! `model.safetensors`, `items.parquet` and `model.json`.

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
    /// The history bound: a longer history loses its oldest items in whole
    /// steps (`grflow_kernels::history::HistoryCut`), so it may keep fewer
    /// than `max_history`.
    pub max_history: usize,
    pub vocabulary: Vocabulary,
    pub dataset: DatasetInfo,
    pub seed: u64,
    pub hyper_parameters: TrainConfig,
    /// The build that wrote the model.
    pub commit: String,
    /// The builds that trained its epochs, oldest first: more than one
    /// when a checkpoint was resumed by another build. Absent in models
    /// written before it was recorded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trained_by_commits: Vec<String>,
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
/// items file and model.json without its `model_version` (compact JSON,
/// fields in the order written).
fn files_version(params: &Params, weights: &[u8], items_bytes: &[u8], json: &ModelJson) -> String {
    let mut unversioned = json.clone();
    unversioned.model_version = String::new();
    let body = serde_json::to_vec(&unversioned).expect("model.json serialises");
    version_of(params, weights, items_bytes, &body)
}

fn version_of(params: &Params, weights: &[u8], items_bytes: &[u8], body: &[u8]) -> String {
    let h = fnv(
        body.iter().copied(),
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

/// What [`files_version`] hashed, recovered from model.json's own bytes
/// rather than from the parsed struct: a field added to [`ModelJson`] later
/// (with a serde default) would otherwise change the hash of every older
/// directory. The file is pretty JSON of the compact text hashed, so
/// dropping whitespace outside strings gives that text back; the version
/// (the first field) is then blanked. `None` for a file of another shape.
fn unversioned_body(json_bytes: &[u8]) -> Option<Vec<u8>> {
    let mut compact = Vec::with_capacity(json_bytes.len());
    let (mut in_string, mut escaped) = (false, false);
    for &b in json_bytes {
        if in_string {
            compact.push(b);
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
        } else if !b.is_ascii_whitespace() {
            in_string = b == b'"';
            compact.push(b);
        }
    }
    const KEY: &[u8] = b"{\"model_version\":\"";
    let rest = compact.strip_prefix(KEY)?;
    let end = rest.iter().position(|&b| b == b'"' || b == b'\\')?;
    (rest[end] == b'"').then(|| [KEY, &rest[end..]].concat())
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
    // Decoded from the bytes that are hashed into the version: a second
    // read could see a file replaced in between.
    let items_bytes = bytes::Bytes::from(std::fs::read(&ipath).map_err(TrainError::io(&ipath))?);
    let reader = ParquetRecordBatchReaderBuilder::try_new(items_bytes.clone())
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
    let files_version = match unversioned_body(&jbytes) {
        Some(body) => version_of(&params, &bytes, &items_bytes, &body),
        None => files_version(&params, &bytes, &items_bytes, &json),
    };
    Ok(ModelDir {
        params,
        items,
        json,
        files_version,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory, removed when dropped.
    struct Scratch(std::path::PathBuf);

    impl Scratch {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("grflow-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            Self(dir)
        }

        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn tiny_dir(dir: &Path) -> String {
        let mut cfg = TrainConfig::defaults(1);
        cfg.model.d_model = 8;
        cfg.model.n_heads = 1;
        cfg.model.n_layers = 1;
        let items: Vec<Item> = (0..4)
            .map(|i| Item {
                item_id: 10 + i,
                feature_ids: vec![i],
                token_len: 1,
                sid: [0, 0, 0],
            })
            .collect();
        let params = Params::init(cfg.model.clone(), items.len(), 1).unwrap();
        let json = ModelJson {
            model_version: String::new(),
            arch: "small".into(),
            model_config: cfg.model.clone(),
            max_history: 50,
            vocabulary: Vocabulary {
                items: items.len(),
                items_hash: items_hash(&items),
                tables: vec![0],
            },
            dataset: DatasetInfo {
                trace: "t \"quoted\" \\ name".into(),
                fingerprint: "f".into(),
                users: 3,
            },
            seed: 1,
            hyper_parameters: cfg,
            commit: "c".into(),
            trained_by_commits: vec!["c".into()],
            epochs: 1,
            best_epoch: 0,
            valid: RankMetrics::default(),
            history: Vec::new(),
            training_secs: 0.125,
        };
        write_model_dir(dir, &params, &items, json).unwrap()
    }

    #[test]
    fn a_written_directory_hashes_to_its_version() {
        let dir = Scratch::new("artifact-version");
        let version = tiny_dir(dir.path());
        let m = load_model_dir(dir.path()).unwrap();
        assert_eq!(
            (m.files_version.as_str(), m.json.model_version.as_str()),
            (version.as_str(), version.as_str())
        );
        // Any change to model.json's content changes the hash.
        let path = dir.path().join(MODEL_JSON);
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replace("\"users\": 3", "\"users\": 4")).unwrap();
        assert_ne!(load_model_dir(dir.path()).unwrap().files_version, version);
    }

    /// A directory written before a defaulted field (here `dropout`) was
    /// added to model.json still hashes to its version.
    #[test]
    fn an_older_directory_without_a_later_field_keeps_its_version() {
        let dir = Scratch::new("artifact-older");
        tiny_dir(dir.path());
        let path = dir.path().join(MODEL_JSON);
        let text = std::fs::read_to_string(&path).unwrap();
        let old: String = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("\"dropout\""))
            .collect::<Vec<_>>()
            .join("\n");
        assert_ne!(old, text, "dropout was written");
        // What that older grflow recorded: the hash of its own file.
        let m = load_model_dir(dir.path()).unwrap();
        let weights = std::fs::read(dir.path().join(WEIGHTS_FILE)).unwrap();
        let items = std::fs::read(dir.path().join(ITEMS_FILE)).unwrap();
        let body = unversioned_body(old.as_bytes()).unwrap();
        let version = version_of(&m.params, &weights, &items, &body);
        let old = old.replacen(&m.json.model_version, &version, 1);
        std::fs::write(&path, old).unwrap();
        let m = load_model_dir(dir.path()).unwrap();
        assert_eq!(m.json.hyper_parameters.dropout, 0.0, "defaulted");
        assert_eq!(m.files_version, version);
        assert_eq!(m.json.model_version, version);
    }

    #[test]
    fn the_unversioned_body_is_the_compact_text_with_the_version_blanked() {
        let pretty = b"{\n  \"model_version\": \"gr-1\",\n  \"a\": \"x y\\\" z\",\n  \"b\": [\n    1,\n    2.5\n  ]\n}";
        assert_eq!(
            unversioned_body(pretty).unwrap(),
            b"{\"model_version\":\"\",\"a\":\"x y\\\" z\",\"b\":[1,2.5]}".to_vec()
        );
        assert!(unversioned_body(b"{\"arch\": \"x\"}").is_none());
    }
}

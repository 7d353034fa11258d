//! `grflow.schema_version`: what write_trace stamps on every file is what
//! `check_schema_version` accepts; another version is refused by name, and
//! a file without the key (another tool's) is accepted.

use std::fs::File;
use std::path::{Path, PathBuf};

use grflow_traces::columnar::{
    ITEMS_FILE, REQUESTS_FILE, SCHEMA_VERSION, USERS_FILE, VERSION_KEY, check_schema_version,
    users_to_batch,
};
use grflow_traces::{GenConfig, UserHistory, WriteOptions, generate, write_trace};
use parquet::arrow::ArrowWriter;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use parquet::file::reader::{FileReader, SerializedFileReader};

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("grflow-version-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn check(path: &Path) -> Result<(), String> {
    let reader = SerializedFileReader::new(File::open(path).unwrap()).unwrap();
    check_schema_version(reader.metadata().file_metadata()).map_err(|e| e.to_string())
}

/// A users table with the given key-value metadata.
fn users_file(path: &Path, kv: Option<Vec<KeyValue>>) {
    let batch = users_to_batch(&[UserHistory {
        user_id: 0,
        items: vec![1, 2],
    }]);
    let props = WriterProperties::builder()
        .set_key_value_metadata(kv)
        .build();
    let mut w =
        ArrowWriter::try_new(File::create(path).unwrap(), batch.schema(), Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

#[test]
fn written_traces_pass_and_other_versions_are_refused() {
    let dir = tmp("check");
    let trace = generate(&GenConfig {
        users: 50,
        items: 500,
        requests: 100,
        ..GenConfig::default()
    });
    write_trace(&dir, &trace, &WriteOptions::default()).unwrap();
    for f in [REQUESTS_FILE, USERS_FILE, ITEMS_FILE] {
        assert_eq!(check(&dir.join(f)), Ok(()), "{f}");
    }

    let other = dir.join("other-tool.parquet");
    users_file(&other, None);
    assert_eq!(check(&other), Ok(()), "no key: another tool's file");

    let newer = dir.join("newer.parquet");
    users_file(
        &newer,
        Some(vec![KeyValue::new(VERSION_KEY.into(), "2".to_string())]),
    );
    let err = check(&newer).unwrap_err();
    assert_eq!(SCHEMA_VERSION, "1");
    assert!(
        err.contains("version \"2\"") && err.contains("reads version \"1\""),
        "names both versions: {err}"
    );

    let empty = dir.join("empty.parquet");
    users_file(
        &empty,
        Some(vec![KeyValue {
            key: VERSION_KEY.into(),
            value: None,
        }]),
    );
    assert!(check(&empty).unwrap_err().contains("(no value)"));
    std::fs::remove_dir_all(&dir).unwrap();
}

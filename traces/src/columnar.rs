//! The trace schema as Arrow: column definitions of the three trace tables,
//! conversion of in-memory rows to record batches, and checked decoding back.
//!
//! Decoding is split in two so that readers can tell a wrong file from a bad
//! row: [`check_columns`] rejects a table whose columns are missing or have
//! the wrong type; the `decode_*` functions then report each bad row (a null
//! in a required column, an unknown mode, ...) on its own.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, ListArray, ListBuilder, RecordBatch, StringArray, StringBuilder,
    UInt8Array, UInt16Builder, UInt32Array, UInt32Builder, UInt64Array, new_null_array,
};
use arrow::datatypes::{
    DataType, Field, Schema, SchemaRef, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};

use crate::schema::{Item, Mode, Request, TraceMeta, UserHistory};

/// File names inside a trace directory.
pub const REQUESTS_FILE: &str = "requests.parquet";
pub const USERS_FILE: &str = "users.parquet";
pub const ITEMS_FILE: &str = "items.parquet";
/// Parquet key-value metadata key holding [`TraceMeta`] as JSON (items.parquet).
pub const META_KEY: &str = "grflow.trace_meta";
/// Parquet key-value metadata key holding the schema version (every file).
pub const VERSION_KEY: &str = "grflow.schema_version";
/// Version of the layout documented in traces/README.md.
pub const SCHEMA_VERSION: &str = "1";

/// A column of a trace table: name, Arrow type, whether nulls are allowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ColumnSpec {
    pub name: &'static str,
    pub kind: ColumnKind,
    pub nullable: bool,
}

/// The Arrow types the trace schema uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColumnKind {
    U8,
    U32,
    U64,
    Utf8,
    ListU16,
    ListU32,
}

impl ColumnKind {
    fn data_type(self) -> DataType {
        match self {
            ColumnKind::U8 => DataType::UInt8,
            ColumnKind::U32 => DataType::UInt32,
            ColumnKind::U64 => DataType::UInt64,
            ColumnKind::Utf8 => DataType::Utf8,
            ColumnKind::ListU16 => DataType::List(list_item(DataType::UInt16)),
            ColumnKind::ListU32 => DataType::List(list_item(DataType::UInt32)),
        }
    }

    /// The item type of a list kind.
    fn item(self) -> Option<DataType> {
        match self {
            ColumnKind::ListU16 => Some(DataType::UInt16),
            ColumnKind::ListU32 => Some(DataType::UInt32),
            _ => None,
        }
    }

    /// Whether `dt` holds this kind's data: the type itself, or for
    /// strings and lists another Arrow layout of the same values (Large*,
    /// *View, a dictionary of strings), read by casting. List item names
    /// and nullability are not significant.
    fn accepts(self, dt: &DataType) -> bool {
        match (self, dt) {
            (ColumnKind::Utf8, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View) => true,
            (ColumnKind::Utf8, DataType::Dictionary(key, values)) => {
                key.is_dictionary_key_type()
                    && matches!(
                        values.as_ref(),
                        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
                    )
            }
            (
                ColumnKind::ListU16 | ColumnKind::ListU32,
                DataType::List(f)
                | DataType::LargeList(f)
                | DataType::ListView(f)
                | DataType::LargeListView(f),
            ) => self.item().as_ref() == Some(f.data_type()),
            (kind, dt) => &kind.data_type() == dt,
        }
    }

    /// `array` (of a type [`Self::accepts`]) in this kind's own type, which
    /// the decoders read: other layouts are cast, list items as nullable
    /// (a null item is a row error, found per row).
    fn read(self, array: &ArrayRef) -> Result<ArrayRef, String> {
        let target = match (self.item(), array.data_type()) {
            (Some(_), DataType::List(_)) => return Ok(array.clone()),
            (Some(item), _) => DataType::List(Arc::new(Field::new("item", item, true))),
            (None, dt) if dt == &self.data_type() => return Ok(array.clone()),
            (None, _) => self.data_type(),
        };
        arrow::compute::cast(array, &target).map_err(|e| e.to_string())
    }

    fn describe(self) -> &'static str {
        match self {
            ColumnKind::U8 => "UInt8",
            ColumnKind::U32 => "UInt32",
            ColumnKind::U64 => "UInt64",
            ColumnKind::Utf8 => "Utf8 (or LargeUtf8, Utf8View)",
            ColumnKind::ListU16 => "List<UInt16> (or LargeList, ListView)",
            ColumnKind::ListU32 => "List<UInt32> (or LargeList, ListView)",
        }
    }
}

fn list_item(dt: DataType) -> Arc<Field> {
    Arc::new(Field::new("item", dt, false))
}

const fn col(name: &'static str, kind: ColumnKind, nullable: bool) -> ColumnSpec {
    ColumnSpec {
        name,
        kind,
        nullable,
    }
}

/// Columns of requests.parquet, in file order.
pub const REQUEST_COLUMNS: [ColumnSpec; 7] = [
    col("ts_ms", ColumnKind::U64, false),
    col("req_id", ColumnKind::U64, false),
    col("user_id", ColumnKind::U64, false),
    col("hist_len", ColumnKind::U32, false),
    col("candidates", ColumnKind::ListU32, false),
    col("mode", ColumnKind::Utf8, false),
    col("label", ColumnKind::U32, true),
];

/// Columns of users.parquet.
pub const USER_COLUMNS: [ColumnSpec; 2] = [
    col("user_id", ColumnKind::U64, false),
    col("items", ColumnKind::ListU32, false),
];

/// Columns of items.parquet.
pub const ITEM_COLUMNS: [ColumnSpec; 4] = [
    col("item_id", ColumnKind::U32, false),
    col("feature_ids", ColumnKind::ListU32, false),
    col("token_len", ColumnKind::U8, false),
    col("sid", ColumnKind::ListU16, false),
];

fn schema_of(columns: &[ColumnSpec]) -> SchemaRef {
    Arc::new(Schema::new(
        columns
            .iter()
            .map(|c| Field::new(c.name, c.kind.data_type(), c.nullable))
            .collect::<Vec<_>>(),
    ))
}

/// Arrow schema of requests.parquet.
pub fn requests_schema() -> SchemaRef {
    schema_of(&REQUEST_COLUMNS)
}

/// Arrow schema of users.parquet.
pub fn users_schema() -> SchemaRef {
    schema_of(&USER_COLUMNS)
}

/// Arrow schema of items.parquet.
pub fn items_schema() -> SchemaRef {
    schema_of(&ITEM_COLUMNS)
}

/// A table whose columns do not match the trace schema.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ColumnError {
    #[error("missing column `{column}` (expected {expected})")]
    Missing {
        column: &'static str,
        expected: &'static str,
    },
    #[error("column `{column}` has type {found}, expected {expected}")]
    WrongType {
        column: &'static str,
        expected: &'static str,
        found: String,
    },
    #[error("column `{column}`: cannot read {found} as {expected}: {reason}")]
    Cast {
        column: &'static str,
        expected: &'static str,
        found: String,
        reason: String,
    },
}

impl ColumnError {
    /// The column the error is about.
    pub fn column(&self) -> &'static str {
        match self {
            ColumnError::Missing { column, .. }
            | ColumnError::WrongType { column, .. }
            | ColumnError::Cast { column, .. } => column,
        }
    }
}

/// Checks that `schema` has every required column of `columns` with a
/// readable type. Extra columns are allowed; a missing nullable column
/// (requests' `label`) reads as all null; nullability is checked per row
/// when decoding.
pub fn check_columns(schema: &Schema, columns: &[ColumnSpec]) -> Result<(), ColumnError> {
    for c in columns {
        let Ok(field) = schema.field_with_name(c.name) else {
            if c.nullable {
                continue;
            }
            return Err(ColumnError::Missing {
                column: c.name,
                expected: c.kind.describe(),
            });
        };
        if !c.kind.accepts(field.data_type()) {
            return Err(ColumnError::WrongType {
                column: c.name,
                expected: c.kind.describe(),
                found: field.data_type().to_string(),
            });
        }
    }
    Ok(())
}

/// A row that cannot be decoded: which column and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("column `{column}`: {reason}")]
pub struct RowError {
    pub column: &'static str,
    pub reason: String,
    /// The row's `req_id` when that column could be read: a refused
    /// request stays joinable to what its client sent.
    pub req_id: Option<u64>,
}

fn null(column: &'static str) -> RowError {
    RowError {
        column,
        reason: "null in a required column".into(),
        req_id: None,
    }
}

/// Typed access to the columns of one batch, each in its kind's own type
/// (cast where the file uses another layout, all null where a nullable
/// column is missing).
struct Columns {
    arrays: Vec<(&'static str, ArrayRef)>,
}

impl Columns {
    fn new(batch: &RecordBatch, columns: &[ColumnSpec]) -> Result<Self, ColumnError> {
        check_columns(batch.schema_ref(), columns)?;
        let arrays = columns
            .iter()
            .map(|c| {
                let Some(array) = batch.column_by_name(c.name) else {
                    // check_columns lets only a nullable column be missing.
                    return Ok((
                        c.name,
                        new_null_array(&c.kind.data_type(), batch.num_rows()),
                    ));
                };
                let array = c.kind.read(array).map_err(|reason| ColumnError::Cast {
                    column: c.name,
                    expected: c.kind.describe(),
                    found: array.data_type().to_string(),
                    reason,
                })?;
                Ok((c.name, array))
            })
            .collect::<Result<_, ColumnError>>()?;
        Ok(Self { arrays })
    }

    fn get(&self, name: &'static str) -> &ArrayRef {
        &self
            .arrays
            .iter()
            .find(|(n, _)| *n == name)
            .expect("a column of the spec")
            .1
    }
    fn u64(&self, name: &'static str) -> &UInt64Array {
        self.get(name).as_primitive::<UInt64Type>()
    }
    fn u32(&self, name: &'static str) -> &UInt32Array {
        self.get(name).as_primitive::<UInt32Type>()
    }
    fn u8(&self, name: &'static str) -> &UInt8Array {
        self.get(name).as_primitive::<UInt8Type>()
    }
    fn utf8(&self, name: &'static str) -> &StringArray {
        self.get(name).as_string::<i32>()
    }
    fn list(&self, name: &'static str) -> &ListArray {
        self.get(name).as_list::<i32>()
    }
}

fn req<T: arrow::array::ArrowPrimitiveType>(
    a: &arrow::array::PrimitiveArray<T>,
    row: usize,
    column: &'static str,
) -> Result<T::Native, RowError> {
    if a.is_null(row) {
        Err(null(column))
    } else {
        Ok(a.value(row))
    }
}

/// The u32 items of list `row`, refusing a null list or a null item.
fn list_u32(list: &ListArray, row: usize, column: &'static str) -> Result<Vec<u32>, RowError> {
    if list.is_null(row) {
        return Err(null(column));
    }
    let offsets = list.value_offsets();
    let (start, end) = (offsets[row] as usize, offsets[row + 1] as usize);
    let values = list.values().as_primitive::<UInt32Type>();
    if values.null_count() > 0 && (start..end).any(|i| values.is_null(i)) {
        return Err(RowError {
            column,
            reason: "null item in the list".into(),
            req_id: None,
        });
    }
    Ok(values.values()[start..end].to_vec())
}

fn list_u16(list: &ListArray, row: usize, column: &'static str) -> Result<Vec<u16>, RowError> {
    if list.is_null(row) {
        return Err(null(column));
    }
    let offsets = list.value_offsets();
    let (start, end) = (offsets[row] as usize, offsets[row + 1] as usize);
    let values = list.values().as_primitive::<UInt16Type>();
    if values.null_count() > 0 && (start..end).any(|i| values.is_null(i)) {
        return Err(RowError {
            column,
            reason: "null item in the list".into(),
            req_id: None,
        });
    }
    Ok(values.values()[start..end].to_vec())
}

fn u32_list_builder() -> ListBuilder<UInt32Builder> {
    ListBuilder::new(UInt32Builder::new()).with_field(list_item(DataType::UInt32))
}

/// Request rows as one record batch of [`requests_schema`].
pub fn requests_to_batch(rows: &[Request]) -> RecordBatch {
    let mut candidates = u32_list_builder();
    let mut mode = StringBuilder::new();
    for r in rows {
        candidates.values().append_slice(&r.candidates);
        candidates.append(true);
        mode.append_value(r.mode.as_str());
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.ts_ms))),
        Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.req_id))),
        Arc::new(UInt64Array::from_iter_values(
            rows.iter().map(|r| r.user_id),
        )),
        Arc::new(UInt32Array::from_iter_values(
            rows.iter().map(|r| r.hist_len),
        )),
        Arc::new(candidates.finish()),
        Arc::new(mode.finish()),
        Arc::new(UInt32Array::from_iter(rows.iter().map(|r| r.label))),
    ];
    RecordBatch::try_new(requests_schema(), columns).expect("columns match the schema")
}

/// The latest event time a request may carry: 9999-12-31T23:59:59.999Z.
pub const MAX_TS_MS: u64 = 253_402_300_799_999;

/// Decodes every row of a requests batch; a bad row becomes an `Err` in
/// its slot so the caller can keep its position.
pub fn decode_requests(batch: &RecordBatch) -> Result<Vec<Result<Request, RowError>>, ColumnError> {
    let c = Columns::new(batch, &REQUEST_COLUMNS)?;
    let (ts, req_id, user, hist) = (
        c.u64("ts_ms"),
        c.u64("req_id"),
        c.u64("user_id"),
        c.u32("hist_len"),
    );
    let (cands, modes, label) = (c.list("candidates"), c.utf8("mode"), c.u32("label"));
    let decode = |i: usize| -> Result<Request, RowError> {
        if modes.is_null(i) {
            return Err(null("mode"));
        }
        let mode = modes.value(i).parse::<Mode>().map_err(|reason| RowError {
            column: "mode",
            reason,
            req_id: None,
        })?;
        let candidates = list_u32(cands, i, "candidates")?;
        if candidates.is_empty() && mode == Mode::Rank {
            return Err(RowError {
                column: "candidates",
                reason: "a rank request needs candidates".into(),
                req_id: None,
            });
        }
        let ts_ms = req(ts, i, "ts_ms")?;
        // Pacing and windows add to event times: a stamp near u64::MAX held
        // a paced replay forever and moved every later request to its time.
        if ts_ms > MAX_TS_MS {
            return Err(RowError {
                column: "ts_ms",
                reason: format!("{ts_ms} is after the year 9999 ({MAX_TS_MS} ms since 1970)"),
                req_id: None,
            });
        }
        Ok(Request {
            ts_ms,
            req_id: req(req_id, i, "req_id")?,
            user_id: req(user, i, "user_id")?,
            hist_len: req(hist, i, "hist_len")?,
            candidates,
            mode,
            label: (!label.is_null(i)).then(|| label.value(i)),
        })
    };
    Ok((0..batch.num_rows())
        .map(|i| {
            decode(i).map_err(|e| RowError {
                req_id: (!req_id.is_null(i)).then(|| req_id.value(i)),
                ..e
            })
        })
        .collect())
}

/// User histories as one record batch of [`users_schema`].
pub fn users_to_batch(rows: &[UserHistory]) -> RecordBatch {
    let mut items = u32_list_builder();
    for u in rows {
        items.values().append_slice(&u.items);
        items.append(true);
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(UInt64Array::from_iter_values(
            rows.iter().map(|u| u.user_id),
        )),
        Arc::new(items.finish()),
    ];
    RecordBatch::try_new(users_schema(), columns).expect("columns match the schema")
}

/// Decodes a users batch; side tables must be whole, so the first bad row
/// is returned with its index in the batch.
pub fn decode_users(batch: &RecordBatch) -> Result<Vec<UserHistory>, DecodeError> {
    let c = Columns::new(batch, &USER_COLUMNS)?;
    let (user, items) = (c.u64("user_id"), c.list("items"));
    (0..batch.num_rows())
        .map(|i| {
            let row = || -> Result<UserHistory, RowError> {
                Ok(UserHistory {
                    user_id: req(user, i, "user_id")?,
                    items: list_u32(items, i, "items")?,
                })
            };
            row().map_err(|error| DecodeError::Row { row: i, error })
        })
        .collect()
}

/// Items as one record batch of [`items_schema`].
pub fn items_to_batch(rows: &[Item]) -> RecordBatch {
    let mut features = u32_list_builder();
    let mut sid = ListBuilder::new(UInt16Builder::new()).with_field(list_item(DataType::UInt16));
    for it in rows {
        features.values().append_slice(&it.feature_ids);
        features.append(true);
        sid.values().append_slice(&it.sid);
        sid.append(true);
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(UInt32Array::from_iter_values(
            rows.iter().map(|it| it.item_id),
        )),
        Arc::new(features.finish()),
        Arc::new(UInt8Array::from_iter_values(
            rows.iter().map(|it| it.token_len),
        )),
        Arc::new(sid.finish()),
    ];
    RecordBatch::try_new(items_schema(), columns).expect("columns match the schema")
}

/// Decodes an items batch; the first bad row is an error.
pub fn decode_items(batch: &RecordBatch) -> Result<Vec<Item>, DecodeError> {
    let c = Columns::new(batch, &ITEM_COLUMNS)?;
    let (id, features, token_len, sid) = (
        c.u32("item_id"),
        c.list("feature_ids"),
        c.u8("token_len"),
        c.list("sid"),
    );
    (0..batch.num_rows())
        .map(|i| {
            let row = || -> Result<Item, RowError> {
                let s = list_u16(sid, i, "sid")?;
                let sid: [u16; 3] = s.as_slice().try_into().map_err(|_| RowError {
                    column: "sid",
                    reason: format!("expected a triplet, found {} codes", s.len()),
                    req_id: None,
                })?;
                Ok(Item {
                    item_id: req(id, i, "item_id")?,
                    feature_ids: list_u32(features, i, "feature_ids")?,
                    token_len: req(token_len, i, "token_len")?,
                    sid,
                })
            };
            row().map_err(|error| DecodeError::Row { row: i, error })
        })
        .collect()
}

/// A side table that cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error(transparent)]
    Column(#[from] ColumnError),
    #[error("row {row}: {error}")]
    Row { row: usize, error: RowError },
}

/// A trace file written with another layout than [`SCHEMA_VERSION`]: its
/// columns may mean something else, so it is refused by name rather than
/// misread. Readers report it with the file and [`VERSION_KEY`] (in
/// grflow-connectors, `SourceError::Meta`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "trace schema version {found}, but this grflow reads version \"{SCHEMA_VERSION}\" only \
     (rewrite the trace with this grflow's gen-trace or import)"
)]
pub struct SchemaVersionError {
    /// The file's value, quoted (`(no value)` for a key without one).
    pub found: String,
}

/// Checks a trace file's [`VERSION_KEY`]: a value other than
/// [`SCHEMA_VERSION`] is refused; a file without the key (written by
/// another tool) is accepted and checked by its columns alone.
pub fn check_schema_version(
    meta: &parquet::file::metadata::FileMetaData,
) -> Result<(), SchemaVersionError> {
    let Some(kv) = meta
        .key_value_metadata()
        .and_then(|kv| kv.iter().find(|kv| kv.key == VERSION_KEY))
    else {
        return Ok(());
    };
    match kv.value.as_deref() {
        Some(SCHEMA_VERSION) => Ok(()),
        Some(other) => Err(SchemaVersionError {
            found: format!("{other:?}"),
        }),
        None => Err(SchemaVersionError {
            found: "(no value)".into(),
        }),
    }
}

/// [`TraceMeta`] as the JSON stored under [`META_KEY`].
pub fn meta_to_json(meta: &TraceMeta) -> String {
    serde_json::to_string(meta).expect("TraceMeta serialises")
}

/// Parses the JSON stored under [`META_KEY`].
pub fn meta_from_json(json: &str) -> Result<TraceMeta, serde_json::Error> {
    serde_json::from_str(json)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(i: u64) -> Request {
        Request {
            ts_ms: 10 * i,
            req_id: i,
            user_id: i % 3,
            hist_len: i as u32,
            candidates: vec![i as u32, 7, 9],
            mode: if i.is_multiple_of(2) {
                Mode::Rank
            } else {
                Mode::Retrieve
            },
            label: (!i.is_multiple_of(4)).then_some(i as u32),
        }
    }

    #[test]
    fn requests_round_trip() {
        let rows: Vec<Request> = (0..10).map(request).collect();
        let back: Vec<Request> = decode_requests(&requests_to_batch(&rows))
            .unwrap()
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert_eq!(back, rows);
    }

    #[test]
    fn side_tables_round_trip() {
        let users = vec![
            UserHistory {
                user_id: 0,
                items: vec![1, 2],
            },
            UserHistory {
                user_id: 1,
                items: vec![],
            },
        ];
        assert_eq!(decode_users(&users_to_batch(&users)).unwrap(), users);
        let items = vec![Item {
            item_id: 0,
            feature_ids: vec![0, 3],
            token_len: 1,
            sid: [1, 2, 3],
        }];
        assert_eq!(decode_items(&items_to_batch(&items)).unwrap(), items);
    }

    #[test]
    fn null_and_unknown_values_are_row_errors() {
        let schema = Arc::new(Schema::new(
            REQUEST_COLUMNS
                .iter()
                .map(|c| Field::new(c.name, c.kind.data_type(), true))
                .collect::<Vec<_>>(),
        ));
        let good = requests_to_batch(&[request(1), request(2), request(3)]);
        let mut columns = good.columns().to_vec();
        columns[0] = Arc::new(UInt64Array::from(vec![Some(1), None, Some(3)]));
        columns[5] = Arc::new(StringArray::from(vec!["rank", "rank", "browse"]));
        let batch = RecordBatch::try_new(schema, columns).unwrap();
        let rows = decode_requests(&batch).unwrap();
        assert!(rows[0].is_ok());
        assert_eq!(rows[1].as_ref().unwrap_err().column, "ts_ms");
        assert_eq!(rows[2].as_ref().unwrap_err().column, "mode");
        // A stamp past any calendar date is a bad row, not a request.
        let mut columns = good.columns().to_vec();
        columns[0] = Arc::new(UInt64Array::from(vec![1, u64::MAX, MAX_TS_MS]));
        let rows = decode_requests(&RecordBatch::try_new(good.schema(), columns).unwrap()).unwrap();
        let err = rows[1].as_ref().unwrap_err();
        assert_eq!(err.column, "ts_ms");
        assert!(err.reason.contains("year 9999"), "{}", err.reason);
        assert!(rows[0].is_ok() && rows[2].is_ok());
    }

    /// `batch` with column `name` replaced by `array` (its field nullable).
    fn with_column(batch: &RecordBatch, name: &str, array: ArrayRef) -> RecordBatch {
        let i = batch.schema().index_of(name).unwrap();
        let mut fields: Vec<Field> = batch
            .schema()
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        fields[i] = Field::new(name, array.data_type().clone(), true);
        let mut columns = batch.columns().to_vec();
        columns[i] = array;
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
    }

    /// Strings and lists in another Arrow layout (what pyarrow or polars
    /// write for large_string, large_list, views) decode as the plain ones.
    #[test]
    fn large_view_and_dictionary_layouts_decode_like_the_plain_ones() {
        use arrow::compute::cast;
        let rows: Vec<Request> = (0..10).map(request).collect();
        let plain = requests_to_batch(&rows);
        let item = |dt| Arc::new(Field::new("element", dt, true));
        let layouts = [
            ("mode", DataType::LargeUtf8),
            ("mode", DataType::Utf8View),
            (
                "mode",
                DataType::Dictionary(Box::new(DataType::Int8), Box::new(DataType::Utf8)),
            ),
            ("candidates", DataType::LargeList(item(DataType::UInt32))),
            ("candidates", DataType::ListView(item(DataType::UInt32))),
            (
                "candidates",
                DataType::LargeListView(item(DataType::UInt32)),
            ),
        ];
        for (name, dt) in layouts {
            let array = cast(plain.column_by_name(name).unwrap(), &dt).unwrap();
            let batch = with_column(&plain, name, array);
            check_columns(batch.schema_ref(), &REQUEST_COLUMNS).unwrap();
            let back: Vec<Request> = decode_requests(&batch)
                .unwrap_or_else(|e| panic!("{name} as {dt}: {e}"))
                .into_iter()
                .map(Result::unwrap)
                .collect();
            assert_eq!(back, rows, "{name} as {dt}");
        }
        // Side tables too: a LargeList sid.
        let items = vec![Item {
            item_id: 0,
            feature_ids: vec![0, 3],
            token_len: 1,
            sid: [1, 2, 3],
        }];
        let batch = items_to_batch(&items);
        let sid = cast(
            batch.column_by_name("sid").unwrap(),
            &DataType::LargeList(item(DataType::UInt16)),
        )
        .unwrap();
        assert_eq!(
            decode_items(&with_column(&batch, "sid", sid)).unwrap(),
            items
        );
        // A list of another item type is still refused, by name.
        let wrong = cast(
            plain.column_by_name("candidates").unwrap(),
            &DataType::LargeList(item(DataType::UInt64)),
        )
        .unwrap();
        let err = decode_requests(&with_column(&plain, "candidates", wrong)).unwrap_err();
        assert_eq!(err.column(), "candidates");
        assert!(err.to_string().contains("UInt64"), "{err}");
    }

    /// `label` is nullable and never read by serving: a table without it
    /// decodes with every label null; a required column stays required.
    #[test]
    fn a_missing_nullable_column_reads_as_null() {
        let rows: Vec<Request> = (0..10).map(request).collect();
        let plain = requests_to_batch(&rows);
        let without = |name: &str| {
            let mut batch = plain.clone();
            batch.remove_column(batch.schema().index_of(name).unwrap());
            batch
        };
        let back: Vec<Request> = decode_requests(&without("label"))
            .unwrap()
            .into_iter()
            .map(Result::unwrap)
            .collect();
        let unlabelled: Vec<Request> = rows
            .iter()
            .map(|r| Request {
                label: None,
                ..r.clone()
            })
            .collect();
        assert_eq!(back, unlabelled);
        let err = decode_requests(&without("user_id")).unwrap_err();
        assert!(
            matches!(
                err,
                ColumnError::Missing {
                    column: "user_id",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn wrong_columns_are_named() {
        let schema = Schema::new(vec![Field::new("ts_ms", DataType::Int64, false)]);
        let err = check_columns(&schema, &REQUEST_COLUMNS).unwrap_err();
        assert_eq!(err.column(), "ts_ms");
        assert!(err.to_string().contains("Int64"), "{err}");
        let schema = Schema::new(vec![Field::new("ts_ms", DataType::UInt64, false)]);
        assert_eq!(
            check_columns(&schema, &REQUEST_COLUMNS)
                .unwrap_err()
                .column(),
            "req_id"
        );
    }
}

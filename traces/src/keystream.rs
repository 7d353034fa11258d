//! Key streams of real traces for cache benchmarks: the sequence of keys a
//! cache sees, one per access, in trace order.
//!
//! - `mooncake`: JSONL; every element of every line's `hash_ids` is one
//!   access of one KV block, in file order.
//! - `recbole`: RecBole atomic `.inter` file (tab-separated, typed header
//!   such as `user_id:token item_id:token rating:float timestamp:float`);
//!   keys are item ids ordered by (timestamp, user_id, item_id).
//! - `movielens`: GroupLens `ratings.csv` (`userId,movieId,rating,timestamp`);
//!   item ids ordered the same way.
//! - `seq`: `user item` per line (SASRec style), items in file order.
//!
//! Ids are numbers; a non-numeric token becomes a stable 64-bit hash of its
//! text (and then orders by that hash). Mooncake accesses also carry their
//! place in the line's prompt (a predictor feature).
//!
//! Lines and CSV fields are split by the importer's helpers, so a file reads
//! here as `grflow import` reads it: a leading UTF-8 byte order mark is
//! skipped, CRLF line ends are accepted and `ratings.csv` fields may be
//! double-quoted.

use std::borrow::Cow;
use std::path::Path;
use std::str::FromStr;

use crate::import::{fnv1a, lines, split_csv};

/// A key stream's source format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyFormat {
    Mooncake,
    Recbole,
    Movielens,
    Seq,
}

impl FromStr for KeyFormat {
    type Err = KeyStreamError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "mooncake" => Self::Mooncake,
            "recbole" => Self::Recbole,
            "movielens" => Self::Movielens,
            "seq" => Self::Seq,
            other => return Err(KeyStreamError::Format(other.to_string())),
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum KeyStreamError {
    #[error("unknown trace format {0:?} (known: mooncake, recbole, movielens, seq)")]
    Format(String),
    #[error("{file}: {source}")]
    Io {
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}:{line}: field {field}: {msg}")]
    Parse {
        file: String,
        line: usize,
        field: String,
        msg: String,
    },
    #[error("{file}: no accesses in the trace")]
    Empty { file: String },
}

/// Where an access sits in its request: block `position` (from 0) of a
/// prompt of `request_len` blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    pub position: u32,
    pub request_len: u32,
}

/// A trace's accesses in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyStream {
    pub keys: Vec<u64>,
    /// One per key for formats with requests of several keys (mooncake);
    /// empty otherwise.
    pub places: Vec<Place>,
}

/// Reads `path` and returns its key stream.
pub fn read_stream(path: &Path, format: KeyFormat) -> Result<KeyStream, KeyStreamError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| KeyStreamError::Io {
        file: file.clone(),
        source,
    })?;
    parse_stream(&text, format, &file)
}

/// Parses trace text; `file` names the source in errors.
pub fn parse_stream(
    text: &str,
    format: KeyFormat,
    file: &str,
) -> Result<KeyStream, KeyStreamError> {
    let stream = match format {
        KeyFormat::Mooncake => mooncake(text, file)?,
        KeyFormat::Recbole => {
            ratings(text, file, split_tabs, ["user_id", "item_id", "timestamp"])?.into()
        }
        KeyFormat::Movielens => {
            ratings(text, file, split_csv, ["userId", "movieId", "timestamp"])?.into()
        }
        KeyFormat::Seq => seq(text, file)?.into(),
    };
    if stream.keys.is_empty() {
        return Err(KeyStreamError::Empty {
            file: file.to_string(),
        });
    }
    Ok(stream)
}

impl From<Vec<u64>> for KeyStream {
    fn from(keys: Vec<u64>) -> Self {
        Self {
            keys,
            places: Vec::new(),
        }
    }
}

fn err(file: &str, line: usize, field: &str, msg: impl Into<String>) -> KeyStreamError {
    KeyStreamError::Parse {
        file: file.to_string(),
        line,
        field: field.to_string(),
        msg: msg.into(),
    }
}

/// A numeric id, or a stable FNV-1a hash of a textual token.
fn id(token: &str) -> u64 {
    token
        .parse::<u64>()
        .unwrap_or_else(|_| fnv1a(token.as_bytes()))
}

fn mooncake(text: &str, file: &str) -> Result<KeyStream, KeyStreamError> {
    let mut keys = Vec::new();
    let mut places = Vec::new();
    for (n, line) in lines(text) {
        let v: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| err(file, n, "(record)", format!("not JSON: {e}")))?;
        let ids = v
            .get("hash_ids")
            .ok_or_else(|| err(file, n, "hash_ids", "missing"))?
            .as_array()
            .ok_or_else(|| err(file, n, "hash_ids", "not an array"))?;
        for (j, h) in ids.iter().enumerate() {
            let k = h.as_u64().ok_or_else(|| {
                err(
                    file,
                    n,
                    &format!("hash_ids[{j}]"),
                    format!("not a non-negative integer: {h}"),
                )
            })?;
            keys.push(k);
            places.push(Place {
                position: j as u32,
                request_len: ids.len() as u32,
            });
        }
    }
    Ok(KeyStream { keys, places })
}

/// One line's fields, or the 0-based index of a bad field and why.
type Fields<'a> = Result<Vec<Cow<'a, str>>, (usize, String)>;

/// RecBole `.inter` fields: tab-separated, unquoted (as `import` reads them).
fn split_tabs(line: &str) -> Fields<'_> {
    Ok(line.split('\t').map(Cow::Borrowed).collect())
}

fn ratings(
    text: &str,
    file: &str,
    split: fn(&str) -> Fields<'_>,
    names: [&str; 3],
) -> Result<Vec<u64>, KeyStreamError> {
    let mut it = lines(text);
    let (hline, header) = it.next().ok_or_else(|| KeyStreamError::Empty {
        file: file.to_string(),
    })?;
    let column = |col: usize| format!("column {}", col + 1);
    // RecBole headers carry types (`item_id:token`); match the name part.
    let cols: Vec<String> = split(header)
        .map_err(|(col, why)| err(file, hline, &column(col), why))?
        .iter()
        .map(|c| c.split(':').next().unwrap_or(c).trim().to_string())
        .collect();
    let mut at = [0usize; 3];
    for (slot, name) in at.iter_mut().zip(names) {
        *slot = cols
            .iter()
            .position(|c| c == name)
            .ok_or_else(|| err(file, hline, name, "column missing from the header"))?;
    }
    let mut rows: Vec<(f64, u64, u64)> = Vec::new();
    for (n, line) in it {
        let fields = split(line).map_err(|(col, why)| {
            let field = cols.get(col).cloned().unwrap_or_else(|| column(col));
            err(file, n, &field, why)
        })?;
        let get = |k: usize| {
            fields
                .get(at[k])
                .map(|s| s.trim())
                .filter(|s| !s.is_empty())
                .ok_or_else(|| err(file, n, names[k], "missing"))
        };
        let ts_text = get(2)?;
        let ts: f64 = ts_text
            .parse()
            .map_err(|_| err(file, n, names[2], format!("not a number: {ts_text:?}")))?;
        rows.push((ts, id(get(0)?), id(get(1)?)));
    }
    // Stable: equal (timestamp, user, item) keep file order.
    rows.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    Ok(rows.into_iter().map(|r| r.2).collect())
}

fn seq(text: &str, file: &str) -> Result<Vec<u64>, KeyStreamError> {
    let mut keys = Vec::new();
    for (n, line) in lines(text) {
        // `lines` skips blank lines, so field 0 (the user, not a key) exists.
        let item = line
            .split_whitespace()
            .nth(1)
            .ok_or_else(|| err(file, n, "item", "missing"))?;
        keys.push(id(item));
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_keys(text: &str, format: KeyFormat, file: &str) -> Result<Vec<u64>, KeyStreamError> {
        parse_stream(text, format, file).map(|s| s.keys)
    }

    #[test]
    fn mooncake_keys_in_file_order() {
        let t = "{\"timestamp\":0,\"hash_ids\":[3,1]}\n\n{\"timestamp\":5,\"hash_ids\":[3,9,2]}\n";
        let s = parse_stream(t, KeyFormat::Mooncake, "m").unwrap();
        assert_eq!(s.keys, vec![3, 1, 3, 9, 2]);
        let places: Vec<(u32, u32)> = s
            .places
            .iter()
            .map(|p| (p.position, p.request_len))
            .collect();
        assert_eq!(places, vec![(0, 2), (1, 2), (0, 3), (1, 3), (2, 3)]);
    }

    #[test]
    fn mooncake_errors_name_file_line_and_field() {
        let t = "{\"hash_ids\":[1]}\n{\"hash_ids\":[1,\"x\"]}\n";
        let e = parse_keys(t, KeyFormat::Mooncake, "m.jsonl")
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "m.jsonl:2: field hash_ids[1]: not a non-negative integer: \"x\""
        );
        let e = parse_keys("{}\n", KeyFormat::Mooncake, "m.jsonl")
            .unwrap_err()
            .to_string();
        assert!(e.contains("m.jsonl:1: field hash_ids: missing"), "{e}");
    }

    #[test]
    fn recbole_orders_by_timestamp_user_item() {
        let t = "user_id:token\titem_id:token\trating:float\ttimestamp:float\n\
                 2\t50\t3\t100\n1\t60\t3\t100\n1\t40\t3\t100\n9\t7\t1\t50\n";
        assert_eq!(
            parse_keys(t, KeyFormat::Recbole, "r").unwrap(),
            vec![7, 40, 60, 50]
        );
        let bad = "user_id:token\titem_id:token\ttimestamp:float\n1\t2\tsoon\n";
        let e = parse_keys(bad, KeyFormat::Recbole, "r.inter")
            .unwrap_err()
            .to_string();
        assert_eq!(e, "r.inter:2: field timestamp: not a number: \"soon\"");
    }

    #[test]
    fn movielens_csv_and_seq() {
        let t = "userId,movieId,rating,timestamp\n1,5,4.0,20\n1,6,4.0,10\n";
        assert_eq!(
            parse_keys(t, KeyFormat::Movielens, "m").unwrap(),
            vec![6, 5]
        );
        assert_eq!(
            parse_keys("1 4\n1 5\n2 4\n", KeyFormat::Seq, "s").unwrap(),
            vec![4, 5, 4]
        );
        let e = parse_keys("1\n", KeyFormat::Seq, "s.txt")
            .unwrap_err()
            .to_string();
        assert_eq!(e, "s.txt:1: field item: missing");
        assert!(matches!(
            "csv".parse::<KeyFormat>(),
            Err(KeyStreamError::Format(_))
        ));
    }

    /// The same text with a byte order mark and CRLF line ends.
    fn bom_crlf(plain: &str) -> String {
        format!("\u{feff}{}", plain.replace('\n', "\r\n"))
    }

    #[test]
    fn bom_crlf_and_quoted_fields_read_as_the_plain_twin() {
        // Used to fail: the mark made the header's first column
        // "\u{feff}userId", and quotes became part of the ids.
        let plain = "userId,movieId,rating,timestamp\n1,5,4.5,20\n1,6,4,10\nu,b,3,30\n";
        let quoted = "\"userId\",movieId,\"rating\",timestamp\n\
                      1,\"5\",\"4,5\",20\n\"1\", 6 ,4,\"10\"\n\"u\",\"b\",3,30\n";
        let want = parse_stream(plain, KeyFormat::Movielens, "m").unwrap();
        assert_eq!(want.keys[..2], [6, 5]);
        assert_eq!(
            parse_stream(&bom_crlf(quoted), KeyFormat::Movielens, "m").unwrap(),
            want
        );
        for (format, plain) in [
            (
                KeyFormat::Recbole,
                "user_id:token\titem_id:token\ttimestamp:float\n1\t2\t9\n1\t3\t8\n",
            ),
            (KeyFormat::Seq, "u1 4\nu1 5\nu2 x\n"),
            (
                KeyFormat::Mooncake,
                "{\"hash_ids\":[3,1]}\n{\"hash_ids\":[7]}\n",
            ),
        ] {
            assert_eq!(
                parse_stream(&bom_crlf(plain), format, "f").unwrap(),
                parse_stream(plain, format, "f").unwrap(),
                "{format:?}"
            );
        }
    }

    #[test]
    fn textual_ids_hash_as_the_importer_does() {
        let t = "userId,movieId,timestamp\n1,a,1\n1,\"foobar\",2\n";
        assert_eq!(
            parse_keys(t, KeyFormat::Movielens, "m").unwrap(),
            vec![fnv1a(b"a"), fnv1a(b"foobar")]
        );
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn bad_quoting_names_file_line_and_field() {
        let e = parse_keys(
            "userId,movieId,timestamp\n1,2,3\n1,\"2,3\n",
            KeyFormat::Movielens,
            "r.csv",
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "r.csv:3: field movieId: quoted field has no closing quote"
        );
        let e = parse_keys("\"userId\"x,movieId\n", KeyFormat::Movielens, "r.csv")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("r.csv:1: field column 1: text after the closing quote"),
            "{e}"
        );
        // Line numbers count the blank lines that are skipped.
        let e = parse_keys(
            "\r\nuserId,item,timestamp\r\n",
            KeyFormat::Movielens,
            "r.csv",
        )
        .unwrap_err()
        .to_string();
        assert_eq!(e, "r.csv:2: field movieId: column missing from the header");
    }
}

//! Line parsers of the three input formats. They only tokenise and check
//! fields; ordering and id remapping happen in `build`.

use std::borrow::Cow;
use std::collections::HashMap;

use super::ImportError;
use crate::columnar::MAX_TS_MS;

/// Interactions as read: raw ids interned in order of first appearance.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct RawEvents {
    /// Raw user ids; events refer to them by index.
    pub users: Vec<String>,
    /// Raw item ids; events refer to them by index.
    pub items: Vec<String>,
    /// (ts_ms, user index, item index), in file order.
    pub events: Vec<(u64, u32, u32)>,
    /// Whether timestamps came from the file (false: synthesized).
    pub timed: bool,
}

#[derive(Default)]
struct Interner {
    index: HashMap<String, u32>,
    names: Vec<String>,
}

impl Interner {
    fn get(&mut self, raw: &str) -> u32 {
        if let Some(&i) = self.index.get(raw) {
            return i;
        }
        let i = self.names.len() as u32;
        self.index.insert(raw.to_string(), i);
        self.names.push(raw.to_string());
        i
    }
}

struct Collector<'a> {
    file: &'a str,
    users: Interner,
    items: Interner,
    events: Vec<(u64, u32, u32)>,
}

impl<'a> Collector<'a> {
    fn new(file: &'a str) -> Self {
        Self {
            file,
            users: Interner::default(),
            items: Interner::default(),
            events: Vec::new(),
        }
    }

    fn err(&self, line: usize, field: &str, reason: impl Into<String>) -> ImportError {
        ImportError::Parse {
            file: self.file.to_string(),
            line,
            field: field.to_string(),
            reason: reason.into(),
        }
    }

    fn id<'t>(
        &self,
        line: usize,
        field: &str,
        value: Option<&'t str>,
    ) -> Result<&'t str, ImportError> {
        match value.map(str::trim) {
            Some(v) if !v.is_empty() => Ok(v),
            _ => Err(self.err(line, field, "missing value")),
        }
    }

    /// Seconds (integer or decimal) to milliseconds.
    fn seconds(&self, line: usize, field: &str, value: Option<&str>) -> Result<u64, ImportError> {
        let v = self.id(line, field, value)?;
        let s: f64 = v
            .parse()
            .map_err(|_| self.err(line, field, format!("not a number: {v:?}")))?;
        if !(s.is_finite() && s >= 0.0) {
            return Err(self.err(
                line,
                field,
                format!("not a valid timestamp in seconds: {v:?}"),
            ));
        }
        let ms = (s * 1000.0).round();
        // Readers drop rows after MAX_TS_MS, so a stamp past it would import
        // fine and then turn every replayed row bad. Such values are almost
        // always milliseconds (e.g. RetailRocket) under a seconds header.
        if ms > MAX_TS_MS as f64 {
            return Err(self.err(
                line,
                field,
                format!("{v} seconds is after the year 9999; are the timestamps in milliseconds?"),
            ));
        }
        Ok(ms as u64)
    }

    fn push(&mut self, ts_ms: u64, user: &str, item: &str) {
        let (u, i) = (self.users.get(user), self.items.get(item));
        self.events.push((ts_ms, u, i));
    }

    fn finish(self, timed: bool, untimed_step_ms: u64) -> Result<RawEvents, ImportError> {
        if self.events.is_empty() {
            return Err(ImportError::Empty {
                file: self.file.to_string(),
            });
        }
        let mut raw = RawEvents {
            users: self.users.names,
            items: self.items.names,
            events: self.events,
            timed,
        };
        if !timed {
            synthesize_timestamps(&mut raw, untimed_step_ms);
        }
        Ok(raw)
    }
}

/// Timestamps for files without them. The k-th of a user's n interactions
/// (file order) gets ts = ⌊(k + φ_u) / n · span⌋ with span = lines × step
/// and φ_u ∈ [0, 1) a hash of the raw user id: every user's sequence is
/// spread over the whole span in its own order, so users interleave as in a
/// live stream and busier users send more often, instead of one user's
/// whole sequence following the previous user's.
fn synthesize_timestamps(raw: &mut RawEvents, step_ms: u64) {
    let span = raw.events.len() as f64 * step_ms as f64;
    let mut total = vec![0u64; raw.users.len()];
    for &(_, u, _) in &raw.events {
        total[u as usize] += 1;
    }
    let phase: Vec<f64> = raw
        .users
        .iter()
        .map(|name| (fnv1a(name.as_bytes()) >> 11) as f64 / (1u64 << 53) as f64)
        .collect();
    let mut seen = vec![0u64; raw.users.len()];
    for e in &mut raw.events {
        let u = e.1 as usize;
        let k = seen[u] as f64;
        seen[u] += 1;
        e.0 = ((k + phase[u]) / total[u] as f64 * span) as u64;
    }
}

/// FNV-1a, 64-bit: the crate's one stable hash of raw ids (also the key of
/// textual ids in `keystream`), so a token hashes the same everywhere.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Lines with their 1-based numbers, skipping blank lines. A UTF-8 byte
/// order mark at the start (as spreadsheet tools write) is not part of the
/// first field.
pub(crate) fn lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    text.lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim_end_matches('\r')))
        .filter(|(_, l)| !l.trim().is_empty())
}

/// RecBole `.inter`: a header of `name:type` columns; `user_id` and
/// `item_id` are required, `timestamp` is used when present.
pub fn parse_recbole(
    text: &str,
    file: &str,
    untimed_step_ms: u64,
) -> Result<RawEvents, ImportError> {
    let mut c = Collector::new(file);
    let mut it = lines(text);
    let Some((hline, header)) = it.next() else {
        return Err(ImportError::Empty {
            file: file.to_string(),
        });
    };
    let names: Vec<&str> = header
        .split('\t')
        .map(|h| h.split(':').next().unwrap_or("").trim())
        .collect();
    let find = |name: &str| names.iter().position(|&n| n == name);
    let user_col =
        find("user_id").ok_or_else(|| c.err(hline, "user_id", "header has no user_id column"))?;
    let item_col =
        find("item_id").ok_or_else(|| c.err(hline, "item_id", "header has no item_id column"))?;
    let ts_col = find("timestamp");
    for (n, line) in it {
        let fields: Vec<&str> = line.split('\t').collect();
        if fields.len() != names.len() {
            return Err(c.err(
                n,
                "line",
                format!("{} fields, the header has {}", fields.len(), names.len()),
            ));
        }
        let ts = match ts_col {
            Some(col) => c.seconds(n, "timestamp", fields.get(col).copied())?,
            None => 0,
        };
        let user = c.id(n, "user_id", fields.get(user_col).copied())?;
        let item = c.id(n, "item_id", fields.get(item_col).copied())?;
        c.push(ts, user, item);
    }
    c.finish(ts_col.is_some(), untimed_step_ms)
}

/// GroupLens `ratings.csv`: header `userId,movieId,rating,timestamp`
/// (columns found by name), timestamps in seconds.
pub fn parse_movielens(text: &str, file: &str) -> Result<RawEvents, ImportError> {
    let mut c = Collector::new(file);
    let mut it = lines(text);
    let Some((hline, header)) = it.next() else {
        return Err(ImportError::Empty {
            file: file.to_string(),
        });
    };
    let names: Vec<String> = split_csv(header)
        .map_err(|(col, why)| c.err(hline, &format!("column {}", col + 1), why))?
        .iter()
        .map(|h| h.trim().to_string())
        .collect();
    let find = |name: &str| {
        names
            .iter()
            .position(|n| n == name)
            .ok_or_else(|| c.err(hline, name, format!("header has no {name} column")))
    };
    let (user_col, item_col, ts_col) = (find("userId")?, find("movieId")?, find("timestamp")?);
    for (n, line) in it {
        let fields = split_csv(line).map_err(|(col, why)| {
            let field = names
                .get(col)
                .map_or_else(|| format!("column {}", col + 1), Clone::clone);
            c.err(n, &field, why)
        })?;
        if fields.len() != names.len() {
            return Err(c.err(
                n,
                "line",
                format!("{} fields, the header has {}", fields.len(), names.len()),
            ));
        }
        let ts = c.seconds(n, "timestamp", fields.get(ts_col).map(|f| &**f))?;
        let user = c.id(n, "userId", fields.get(user_col).map(|f| &**f))?;
        let item = c.id(n, "movieId", fields.get(item_col).map(|f| &**f))?;
        c.push(ts, user, item);
    }
    c.finish(true, 0)
}

/// The fields of one CSV line, with RFC 4180 quoting: `"1","2"` reads as
/// `1` and `2`, a comma inside quotes is text and `""` inside quotes is a
/// quote. An unquoted field is taken as it stands. Errors give the 0-based
/// field index and why (an unterminated quote, text after a closing one).
pub(crate) fn split_csv(line: &str) -> Result<Vec<Cow<'_, str>>, (usize, String)> {
    let mut fields = Vec::new();
    let mut rest = line;
    loop {
        let Some(quoted) = rest.trim_start().strip_prefix('"') else {
            match rest.find(',') {
                Some(i) => {
                    fields.push(Cow::Borrowed(&rest[..i]));
                    rest = &rest[i + 1..];
                    continue;
                }
                None => {
                    fields.push(Cow::Borrowed(rest));
                    return Ok(fields);
                }
            }
        };
        let col = fields.len();
        let mut value = String::new();
        let mut chars = quoted.char_indices();
        let mut end = None;
        while let Some((i, ch)) = chars.next() {
            if ch != '"' {
                value.push(ch);
            } else if quoted[i + 1..].starts_with('"') {
                value.push('"');
                chars.next();
            } else {
                end = Some(i + 1);
                break;
            }
        }
        let Some(end) = end else {
            return Err((col, "quoted field has no closing quote".into()));
        };
        fields.push(Cow::Owned(value));
        let after = quoted[end..].trim_start();
        match after.strip_prefix(',') {
            Some(next) => rest = next,
            None if after.is_empty() => return Ok(fields),
            None => {
                return Err((col, format!("text after the closing quote: {after:?}")));
            }
        }
    }
}

/// SASRec-style lines `user item` (whitespace-separated), each user's lines
/// in time order; timestamps are synthesized (see `synthesize_timestamps`).
pub fn parse_seq(text: &str, file: &str, untimed_step_ms: u64) -> Result<RawEvents, ImportError> {
    let mut c = Collector::new(file);
    for (n, line) in lines(text) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() != 2 {
            return Err(c.err(
                n,
                "line",
                format!("expected `user item`, found {} fields", fields.len()),
            ));
        }
        c.push(0, fields[0], fields[1]);
    }
    c.finish(false, untimed_step_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_published_vectors() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn recbole_reads_typed_header_columns() {
        let text = "user_id:token\titem_id:token\trating:float\ttimestamp:float\n7\t3\t4\t100\n7\t5\t3\t99.5\n";
        let raw = parse_recbole(text, "x.inter", 10).unwrap();
        assert_eq!(raw.users, ["7"]);
        assert_eq!(raw.items, ["3", "5"]);
        assert_eq!(raw.events, [(100_000, 0, 0), (99_500, 0, 1)]);
    }

    #[test]
    fn errors_name_file_line_and_field() {
        let text = "user_id:token\titem_id:token\ttimestamp:float\n1\t2\t3\n1\t2\tsoon\n";
        let err = parse_recbole(text, "x.inter", 10).unwrap_err().to_string();
        assert_eq!(
            err,
            "x.inter: line 3: field `timestamp`: not a number: \"soon\""
        );
        let err = parse_movielens("userId,rating,timestamp\n1,2,3\n", "r.csv")
            .unwrap_err()
            .to_string();
        assert!(err.contains("r.csv: line 1: field `movieId`"), "{err}");
        let err = parse_seq("1 2\n1 2 3\n", "s.txt", 10)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("s.txt: line 2: field `line`"), "{err}");
        let err = parse_movielens("userId,movieId,rating,timestamp\n1,,4,5\n", "r.csv")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("line 2: field `movieId`: missing value"),
            "{err}"
        );
    }

    #[test]
    fn a_byte_order_mark_is_not_part_of_the_first_field() {
        let plain = "userId,movieId,rating,timestamp\n1,2,4,5\n1,3,4,6\n";
        let bom = format!("\u{feff}{plain}");
        assert_eq!(
            parse_movielens(&bom, "r.csv").unwrap(),
            parse_movielens(plain, "r.csv").unwrap(),
            "used to fail: header has no userId column"
        );
        let inter = "user_id:token\titem_id:token\ttimestamp:float\n1\t2\t3\n";
        assert_eq!(
            parse_recbole(&format!("\u{feff}{inter}"), "x.inter", 10).unwrap(),
            parse_recbole(inter, "x.inter", 10).unwrap()
        );
        // seq has no header: the mark would have made user "\u{feff}u1".
        let seq = "u1 a\nu1 b\n";
        let raw = parse_seq(&format!("\u{feff}{seq}"), "s.txt", 10).unwrap();
        assert_eq!(raw.users, ["u1"]);
        assert_eq!(raw, parse_seq(seq, "s.txt", 10).unwrap());
    }

    #[test]
    fn quoted_csv_fields_read_as_their_contents() {
        let plain = "userId,movieId,rating,timestamp\n1,2,4,5\n1,3,4.5,6\n";
        let quoted = "\"userId\",\"movieId\",\"rating\",\"timestamp\"\n\
            \"1\",\"2\",\"4\",\"5\"\n\"1\", \"3\" ,\"4,5\",6\n";
        assert_eq!(
            parse_movielens(quoted, "r.csv").unwrap(),
            parse_movielens(plain, "r.csv").unwrap(),
            "quotes used to become part of the ids; a quoted comma split a field"
        );
        // A doubled quote inside quotes is a quote.
        let raw =
            parse_movielens("userId,movieId,timestamp\n\"a\"\"b\",\"x,y\",1\n", "r.csv").unwrap();
        assert_eq!(
            (raw.users[0].as_str(), raw.items[0].as_str()),
            ("a\"b", "x,y")
        );
        let err = parse_movielens("userId,movieId,timestamp\n1,\"2,3\n", "r.csv")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "r.csv: line 2: field `movieId`: quoted field has no closing quote"
        );
        let err = parse_movielens("userId,movieId,timestamp\n\"1\"x,2,3\n", "r.csv")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("r.csv: line 2: field `userId`: text after the closing quote"),
            "{err}"
        );
    }

    #[test]
    fn millisecond_timestamps_are_rejected_with_a_hint() {
        let text = "user_id:token\titem_id:token\ttimestamp:float\n1\t2\t1600000000000\n";
        let err = parse_recbole(text, "x.inter", 10).unwrap_err().to_string();
        assert!(err.contains("line 2: field `timestamp`"), "{err}");
        assert!(err.contains("milliseconds"), "{err}");
        let err = parse_movielens(
            "userId,movieId,rating,timestamp\n1,2,4,1433221332117\n",
            "r.csv",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("line 2: field `timestamp`"), "{err}");
        // The last millisecond of 9999 still imports.
        let text = "user_id:token\titem_id:token\ttimestamp:float\n1\t2\t253402300799.999\n";
        let raw = parse_recbole(text, "x.inter", 10).unwrap();
        assert_eq!(raw.events[0].0, MAX_TS_MS);
    }

    #[test]
    fn seq_timestamps_keep_each_users_order_and_interleave_users() {
        let text = "a 1\na 2\na 3\nb 4\nb 5\nb 6\n";
        let raw = parse_seq(text, "s.txt", 10).unwrap();
        let ts = |u: u32| {
            raw.events
                .iter()
                .filter(|e| e.1 == u)
                .map(|e| e.0)
                .collect::<Vec<_>>()
        };
        for u in 0..2 {
            assert!(ts(u).windows(2).all(|w| w[0] < w[1]), "per-user order kept");
            assert!(
                ts(u).iter().all(|&t| t < 60),
                "within the span of 6 lines × 10 ms"
            );
        }
        assert!(ts(1)[0] < ts(0)[2], "users interleave");
        assert_eq!(raw, parse_seq(text, "s.txt", 10).unwrap(), "deterministic");
    }
}

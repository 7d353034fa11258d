//! The JSON records on Kafka topics: requests in, responses out, and dead
//! letters for what could not be decoded. Schema: connectors/README.md.
//!
//! Requests are decoded field by field (not with a derive) so that a bad
//! message names the field, array index and JSON type that were wrong.

use grflow_operators::history::{CommonCut, HistoryLimits, Task};
use grflow_traces::schema::Mode;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Default cap on a request message's size (1 MiB, Kafka's default
/// `message.max.bytes`).
pub const MAX_MESSAGE_BYTES: usize = 1 << 20;
/// Bytes of a bad payload kept in its dead letter.
const DEAD_LETTER_PAYLOAD_BYTES: usize = 1024;
/// Default cap on candidates per request (`model.max_candidates`).
pub const MAX_CANDIDATES: usize = 1_000;

/// Bounds a request is held to while it is decoded, before any cache or
/// model work: its size, its candidates, and the history it is served with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeLimits {
    pub max_message_bytes: usize,
    /// More candidates than this is an error (`too_many_candidates`).
    pub max_candidates: usize,
    /// Inline histories keep only their most recent items (at least what
    /// the nodes keep), so a long history never reaches a cache.
    pub history: CommonCut,
}

impl DecodeLimits {
    /// Only the message size is bounded.
    pub fn bytes_only(max_message_bytes: usize) -> Self {
        Self {
            max_message_bytes,
            max_candidates: usize::MAX,
            history: HistoryLimits::unbounded().into(),
        }
    }
}

/// The user's history: sent inline, or a prefix of the users table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum History {
    /// Item ids, oldest first.
    Inline(Vec<u32>),
    /// The first `n` interactions of the user in the configured users table.
    Prefix(u32),
}

/// A decoded request.
#[derive(Clone, Debug, PartialEq)]
pub struct WireRequest {
    pub req_id: u64,
    pub user_id: u64,
    pub ts_ms: u64,
    pub candidates: Vec<u32>,
    pub history: History,
    pub mode: Mode,
    /// Oldest inline-history items dropped by the history limit.
    pub history_dropped: usize,
}

/// Why a message is not a request. Every variant names the field at fault.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("message of {bytes} bytes exceeds the limit of {limit} bytes")]
    Oversized { bytes: usize, limit: usize },
    #[error("malformed JSON at line {line}, column {column}: {message}")]
    Malformed {
        line: usize,
        column: usize,
        message: String,
    },
    #[error("expected a JSON object, found {found}")]
    NotAnObject { found: &'static str },
    #[error("missing field `{field}`")]
    Missing { field: &'static str },
    #[error("field `{field}`: expected {expected}, found {found}")]
    WrongType {
        field: String,
        expected: &'static str,
        found: String,
    },
    #[error("fields `history` and `hist_len` both present; send one")]
    TwoHistories,
    #[error("field `candidates`: a rank request needs at least one candidate")]
    NoCandidates,
    #[error(
        "field `candidates`: {count} candidates, more than the limit of {limit} (model.max_candidates)"
    )]
    TooManyCandidates { count: usize, limit: usize },
}

impl WireError {
    /// A stable, machine-readable name for counters and dead letters.
    pub fn kind(&self) -> &'static str {
        match self {
            WireError::Oversized { .. } => "oversized",
            WireError::Malformed { .. } => "malformed_json",
            WireError::NotAnObject { .. } => "not_an_object",
            WireError::Missing { .. } => "missing_field",
            WireError::WrongType { .. } => "wrong_type",
            WireError::TwoHistories => "two_histories",
            WireError::NoCandidates => "no_candidates",
            WireError::TooManyCandidates { .. } => "too_many_candidates",
        }
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_u64() => "a non-negative integer",
        Value::Number(n) if n.is_i64() => "a negative integer",
        Value::Number(_) => "a fraction",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// What was found, for errors: the type, and the value when it is short.
fn describe(v: &Value) -> String {
    match v {
        Value::Number(_) | Value::Bool(_) => format!("{} ({v})", type_name(v)),
        Value::String(s) if s.len() <= 32 => format!("{} ({v})", type_name(v)),
        _ => type_name(v).to_string(),
    }
}

fn wrong(field: impl Into<String>, expected: &'static str, found: &Value) -> WireError {
    WireError::WrongType {
        field: field.into(),
        expected,
        found: describe(found),
    }
}

fn required<'a>(obj: &'a Map<String, Value>, field: &'static str) -> Result<&'a Value, WireError> {
    match obj.get(field) {
        Some(Value::Null) | None => Err(WireError::Missing { field }),
        Some(v) => Ok(v),
    }
}

fn as_u64(v: &Value, field: &str) -> Result<u64, WireError> {
    v.as_u64()
        .ok_or_else(|| wrong(field, "a non-negative integer", v))
}

fn as_u32(v: &Value, field: &str) -> Result<u32, WireError> {
    v.as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| wrong(field, "an integer in 0..=4294967295", v))
}

/// The item ids of `v[skip..]`: items before `skip` are not looked at.
fn item_ids(v: &[Value], skip: usize, field: &'static str) -> Result<Vec<u32>, WireError> {
    v.iter()
        .enumerate()
        .skip(skip)
        .map(|(i, x)| as_u32(x, &format!("{field}[{i}]")))
        .collect()
}

fn item_array<'a>(v: &'a Value, field: &'static str) -> Result<&'a [Value], WireError> {
    v.as_array()
        .map(Vec::as_slice)
        .ok_or_else(|| wrong(field, "an array of item ids", v))
}

/// Decodes one request message; `limit` caps its size in bytes. Nothing
/// else is bounded: the job decodes with [`decode_request_within`].
pub fn decode_request(payload: &[u8], limit: usize) -> Result<WireRequest, WireError> {
    decode_request_within(payload, &DecodeLimits::bytes_only(limit))
}

/// Decodes one request message within `limits`: an oversized message or
/// too many candidates is an error, an inline history keeps its most
/// recent items that fit.
pub fn decode_request_within(
    payload: &[u8],
    limits: &DecodeLimits,
) -> Result<WireRequest, WireError> {
    let limit = limits.max_message_bytes;
    if payload.len() > limit {
        return Err(WireError::Oversized {
            bytes: payload.len(),
            limit,
        });
    }
    let value: Value = serde_json::from_slice(payload).map_err(|e| WireError::Malformed {
        line: e.line(),
        column: e.column(),
        message: e.to_string(),
    })?;
    let obj = value.as_object().ok_or(WireError::NotAnObject {
        found: type_name(&value),
    })?;
    let req_id = as_u64(required(obj, "req_id")?, "req_id")?;
    let user_id = as_u64(required(obj, "user_id")?, "user_id")?;
    let ts_ms = as_u64(required(obj, "ts_ms")?, "ts_ms")?;
    let mode = match obj.get("mode") {
        None | Some(Value::Null) => Mode::Rank,
        Some(Value::String(s)) if s == "rank" => Mode::Rank,
        Some(Value::String(s)) if s == "retrieve" => Mode::Retrieve,
        Some(v) => return Err(wrong("mode", "\"rank\" or \"retrieve\"", v)),
    };
    let candidates = match obj.get("candidates") {
        None | Some(Value::Null) if mode == Mode::Retrieve => Vec::new(),
        None | Some(Value::Null) => {
            return Err(WireError::Missing {
                field: "candidates",
            });
        }
        Some(v) => {
            let items = item_array(v, "candidates")?;
            if items.len() > limits.max_candidates {
                return Err(WireError::TooManyCandidates {
                    count: items.len(),
                    limit: limits.max_candidates,
                });
            }
            item_ids(items, 0, "candidates")?
        }
    };
    if mode == Mode::Rank && candidates.is_empty() {
        return Err(WireError::NoCandidates);
    }
    let task = match mode {
        Mode::Rank => Task::Rank,
        Mode::Retrieve => Task::Retrieve,
    };
    let mut history_dropped = 0;
    let history = match (
        obj.get("history").filter(|v| !v.is_null()),
        obj.get("hist_len").filter(|v| !v.is_null()),
    ) {
        (Some(_), Some(_)) => return Err(WireError::TwoHistories),
        (Some(h), None) => {
            let items = item_array(h, "history")?;
            history_dropped = limits.history.dropped(items.len(), task);
            History::Inline(item_ids(items, history_dropped, "history")?)
        }
        (None, Some(n)) => History::Prefix(as_u32(n, "hist_len")?),
        (None, None) => return Err(WireError::Missing { field: "history" }),
    };
    Ok(WireRequest {
        req_id,
        user_id,
        ts_ms,
        candidates,
        history,
        mode,
        history_dropped,
    })
}

/// The request message a producer writes for `r` (the inverse of
/// [`decode_request`]): what `grflow send` puts on the request topic.
pub fn encode_request(r: &WireRequest) -> Vec<u8> {
    let mut obj = Map::new();
    obj.insert("req_id".into(), r.req_id.into());
    obj.insert("user_id".into(), r.user_id.into());
    obj.insert("ts_ms".into(), r.ts_ms.into());
    let mode = match r.mode {
        Mode::Rank => "rank",
        Mode::Retrieve => "retrieve",
    };
    obj.insert("mode".into(), mode.into());
    if r.mode == Mode::Rank || !r.candidates.is_empty() {
        obj.insert("candidates".into(), r.candidates.clone().into());
    }
    match &r.history {
        History::Inline(items) => obj.insert("history".into(), items.clone().into()),
        History::Prefix(n) => obj.insert("hist_len".into(), (*n).into()),
    };
    serde_json::to_vec(&Value::Object(obj)).expect("a JSON object serialises")
}

/// Scores leave the job rounded to 1e-3 (see [`WireResponse::same_answer`]
/// for when two rounded answers count as the same).
pub fn round_score(score: f32) -> f64 {
    (score as f64 * 1e3).round() / 1e3
}

/// How far two scores of one request may lie apart *before* rounding and
/// still be the same answer. Scores are not bit-identical across cache
/// states: a history prefilled on top of cached prefix KV and one computed
/// in full round differently (the kernel tests bound that by 1e-4), so a
/// request answered twice around a crash may differ in the last digits.
pub const SCORE_TOLERANCE: f64 = 1e-3;

/// [`SCORE_TOLERANCE`] on the wire: each score is rounded to 1e-3, which
/// adds up to 1e-3 between two scores (plus slack for the binary
/// representation of decimal values).
pub const WIRE_SCORE_TOLERANCE: f64 = SCORE_TOLERANCE + 1e-3 + 1e-9;

/// Whether two rankings are the same answer (see
/// [`WireResponse::same_answer`]).
fn same_ranking(a_items: &[u32], a: &[f64], b_items: &[u32], b: &[f64]) -> bool {
    let near = |x: f64, y: f64| (x - y).abs() <= WIRE_SCORE_TOLERANCE;
    if a_items.len() != b_items.len()
        || a.len() != a_items.len()
        || b.len() != b_items.len()
        || !a.iter().zip(b).all(|(&x, &y)| near(x, y))
    {
        return false;
    }
    // An item at another rank than in `other` must be tied there with the
    // item it traded places with, or, when `other` does not list it, with
    // `other`'s last item (a near-tie at the top-k cut).
    let placed_alike = |items: &[u32], scores: &[f64], other: &[u32], other_scores: &[f64]| {
        items.iter().enumerate().all(|(i, item)| {
            if other[i] == *item {
                return true;
            }
            match other.iter().position(|o| o == item) {
                Some(j) => near(other_scores[j], other_scores[i]),
                None => other_scores
                    .last()
                    .is_some_and(|&last| near(scores[i], last)),
            }
        })
    };
    placed_alike(a_items, a, b_items, b) && placed_alike(b_items, b, a_items, a)
}

/// A response, keyed by `req_id` on the response topic: either a ranking
/// (`items`, `scores`) or, when the request could not be served in time or
/// at all, an `error` with empty `items` and `scores`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WireResponse {
    pub req_id: u64,
    pub items: Vec<u32>,
    /// Rounded with [`round_score`].
    pub scores: Vec<f64>,
    pub model_version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<AnswerError>,
    /// Serving node (timely worker).
    pub node: u32,
    /// The request's event time: the time it was served at.
    pub ts_ms: u64,
    /// The request's own `ts_ms` when the job served it at another time
    /// (a stamp too far ahead, clamped: `clamped_ts`); absent otherwise.
    /// Lets a client match the answer to what it sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent_ts_ms: Option<u64>,
    /// Time from consumption to response, milliseconds.
    pub latency_ms: f64,
    /// The request's topic, partition and offset: a restarted job reads
    /// these back to recognise requests it already answered. An empty
    /// topic (answers written before it was recorded) matches any.
    #[serde(default)]
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

/// Why a request got an error record instead of a ranking.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnswerError {
    /// `shed` (deadline passed before it was served), `stale` (produced
    /// longer ago than `kafka.max_age_ms`) or `unservable` (e.g. a history
    /// longer than the users table holds).
    pub kind: String,
    pub reason: String,
}

/// Where an answered request came from on the request topic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecordId {
    pub partition: i32,
    pub offset: i64,
}

/// A request the response topic answers: where it was read and its id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AnsweredRequest {
    pub source: RecordId,
    pub req_id: u64,
}

impl WireResponse {
    /// A ranking: scores are rounded here, once.
    pub fn ranking(
        source: RecordId,
        req_id: u64,
        items: Vec<u32>,
        scores: &[f32],
        model_version: String,
    ) -> Self {
        Self {
            req_id,
            items,
            scores: scores.iter().map(|&s| round_score(s)).collect(),
            model_version,
            error: None,
            node: 0,
            ts_ms: 0,
            sent_ts_ms: None,
            latency_ms: 0.0,
            topic: String::new(),
            partition: source.partition,
            offset: source.offset,
        }
    }

    /// An error record in place of a ranking.
    pub fn failed(source: RecordId, req_id: u64, kind: &str, reason: String) -> Self {
        Self {
            req_id,
            items: Vec::new(),
            scores: Vec::new(),
            model_version: String::new(),
            error: Some(AnswerError {
                kind: kind.to_string(),
                reason,
            }),
            node: 0,
            ts_ms: 0,
            sent_ts_ms: None,
            latency_ms: 0.0,
            topic: String::new(),
            partition: source.partition,
            offset: source.offset,
        }
    }

    /// Sets the timing fields.
    pub fn timed(mut self, node: u32, ts_ms: u64, latency_ms: f64) -> Self {
        self.node = node;
        self.ts_ms = ts_ms;
        self.latency_ms = latency_ms;
        self
    }

    /// Records the request topic the answered request came from.
    pub fn requested_on(mut self, topic: &str) -> Self {
        self.topic = topic.to_string();
        self
    }

    /// Whether this answers a request read from `request_topic`.
    pub fn answers_topic(&self, request_topic: &str) -> bool {
        self.topic.is_empty() || self.topic == request_topic
    }

    pub fn source(&self) -> RecordId {
        RecordId {
            partition: self.partition,
            offset: self.offset,
        }
    }

    /// Whether `other` is the same answer to the same request. Two error
    /// records are the same when their kinds are (the reason may differ);
    /// two rankings are the same when they rank the same number of items,
    /// the scores at each rank differ by at most [`SCORE_TOLERANCE`] before
    /// rounding ([`WIRE_SCORE_TOLERANCE`] on the wire), and the items come
    /// in the same order except that items tied within that tolerance may
    /// trade places (also across the top-k cut). An error record and a
    /// ranking always differ. Timing fields (`node`, `ts_ms`,
    /// `latency_ms`) may differ.
    pub fn same_answer(&self, other: &Self) -> bool {
        if self.req_id != other.req_id {
            return false;
        }
        match (&self.error, &other.error) {
            (Some(a), Some(b)) => a.kind == b.kind,
            (None, None) => same_ranking(&self.items, &self.scores, &other.items, &other.scores),
            _ => false,
        }
    }
}

/// A message that could not be served, on the dead-letter topic.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// [`WireError::kind`].
    pub kind: String,
    /// The error, for people.
    pub reason: String,
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    /// The payload's size and its first bytes (lossy UTF-8).
    pub payload_bytes: usize,
    pub payload_head: String,
}

impl DeadLetter {
    pub fn new(
        error: &WireError,
        topic: &str,
        partition: i32,
        offset: i64,
        payload: &[u8],
    ) -> Self {
        let head = &payload[..payload.len().min(DEAD_LETTER_PAYLOAD_BYTES)];
        Self {
            kind: error.kind().to_string(),
            reason: error.to_string(),
            topic: topic.to_string(),
            partition,
            offset,
            payload_bytes: payload.len(),
            payload_head: String::from_utf8_lossy(head).into_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_encoded_request_decodes_to_itself() {
        let rank = WireRequest {
            req_id: 9,
            user_id: u64::MAX,
            ts_ms: 1_700_000_000_123,
            candidates: vec![1, 2, u32::MAX],
            history: History::Prefix(12),
            mode: Mode::Rank,
            history_dropped: 0,
        };
        let retrieve = WireRequest {
            candidates: Vec::new(),
            history: History::Inline(vec![5, 6, 7]),
            mode: Mode::Retrieve,
            ..rank.clone()
        };
        for r in [rank, retrieve] {
            let bytes = encode_request(&r);
            assert_eq!(decode_request(&bytes, MAX_MESSAGE_BYTES).unwrap(), r);
        }
    }

    fn decode(s: &str) -> Result<WireRequest, WireError> {
        decode_request(s.as_bytes(), MAX_MESSAGE_BYTES)
    }

    #[test]
    fn a_rank_request_with_a_history_prefix() {
        let r = decode(r#"{"req_id":7,"user_id":3,"ts_ms":1000,"candidates":[5,6],"hist_len":12}"#)
            .unwrap();
        assert_eq!(
            r,
            WireRequest {
                req_id: 7,
                user_id: 3,
                ts_ms: 1000,
                candidates: vec![5, 6],
                history: History::Prefix(12),
                mode: Mode::Rank,
                history_dropped: 0,
            }
        );
    }

    #[test]
    fn a_retrieve_request_with_an_inline_history_needs_no_candidates() {
        let r = decode(
            r#"{"req_id":1,"user_id":2,"ts_ms":3,"history":[9,8],"mode":"retrieve","extra":true}"#,
        )
        .unwrap();
        assert_eq!(r.history, History::Inline(vec![9, 8]));
        assert_eq!((r.mode, r.candidates.len()), (Mode::Retrieve, 0));
    }

    #[test]
    fn every_bad_message_names_its_fault() {
        let cases: &[(&str, &str, &str)] = &[
            ("{\"req_id\": 1,", "malformed_json", "line 1, column 13"),
            ("[1,2]", "not_an_object", "an array"),
            (
                r#"{"user_id":2,"ts_ms":3,"candidates":[1],"hist_len":1}"#,
                "missing_field",
                "`req_id`",
            ),
            (
                r#"{"req_id":"x","user_id":2,"ts_ms":3,"candidates":[1],"hist_len":1}"#,
                "wrong_type",
                "field `req_id`: expected a non-negative integer, found a string (\"x\")",
            ),
            (
                r#"{"req_id":1,"user_id":-2,"ts_ms":3,"candidates":[1],"hist_len":1}"#,
                "wrong_type",
                "`user_id`",
            ),
            (
                r#"{"req_id":1,"user_id":2,"ts_ms":3,"candidates":[1,2.5],"hist_len":1}"#,
                "wrong_type",
                "`candidates[1]`: expected an integer in 0..=4294967295, found a fraction (2.5)",
            ),
            (
                r#"{"req_id":1,"user_id":2,"ts_ms":3,"candidates":[1,4294967296],"hist_len":1}"#,
                "wrong_type",
                "`candidates[1]`",
            ),
            (
                r#"{"req_id":1,"user_id":2,"ts_ms":3,"candidates":[],"hist_len":1}"#,
                "no_candidates",
                "candidates",
            ),
            (
                r#"{"req_id":1,"user_id":2,"ts_ms":3,"candidates":[1]}"#,
                "missing_field",
                "`history`",
            ),
            (
                r#"{"req_id":1,"user_id":2,"ts_ms":3,"candidates":[1],"history":[1],"hist_len":1}"#,
                "two_histories",
                "both",
            ),
            (
                r#"{"req_id":1,"user_id":2,"ts_ms":3,"candidates":[1],"hist_len":1,"mode":"rerank"}"#,
                "wrong_type",
                "`mode`",
            ),
            (
                r#"{"req_id":1,"user_id":2,"ts_ms":3,"candidates":{"a":1},"hist_len":1}"#,
                "wrong_type",
                "`candidates`: expected an array of item ids, found an object",
            ),
        ];
        for (msg, kind, says) in cases {
            let e = decode(msg).expect_err(msg);
            assert_eq!(e.kind(), *kind, "{msg}: {e}");
            assert!(e.to_string().contains(says), "{msg}: {e}");
        }
        let big = vec![b' '; 65];
        let e = decode_request(&big, 64).unwrap_err();
        assert_eq!(e.kind(), "oversized");
        assert_eq!(
            e.to_string(),
            "message of 65 bytes exceeds the limit of 64 bytes"
        );
        let e = decode_request(&[0xff, 0xfe], 64).unwrap_err();
        assert_eq!(e.kind(), "malformed_json");
    }

    fn limits() -> DecodeLimits {
        DecodeLimits {
            max_message_bytes: MAX_MESSAGE_BYTES,
            max_candidates: 3,
            history: HistoryLimits {
                rank: 10,
                retrieve: 8,
                chunk: 4,
            }
            .into(),
        }
    }

    fn message(candidates: usize, history: usize, mode: &str) -> String {
        let ids = |n: usize| (0..n).map(|i| i.to_string()).collect::<Vec<_>>().join(",");
        format!(
            r#"{{"req_id":1,"user_id":2,"ts_ms":3,"mode":"{mode}","candidates":[{}],"history":[{}]}}"#,
            ids(candidates),
            ids(history)
        )
    }

    #[test]
    fn too_many_candidates_is_rejected_by_name() {
        let e = decode_request_within(message(4, 2, "rank").as_bytes(), &limits()).unwrap_err();
        assert_eq!(e.kind(), "too_many_candidates");
        assert_eq!(
            e.to_string(),
            "field `candidates`: 4 candidates, more than the limit of 3 (model.max_candidates)"
        );
        assert!(decode_request_within(message(3, 2, "rank").as_bytes(), &limits()).is_ok());
        // Without limits the same message decodes.
        assert!(decode(&message(4, 2, "rank")).is_ok());
    }

    #[test]
    fn long_inline_histories_keep_their_most_recent_items() {
        let r = decode_request_within(message(1, 23, "rank").as_bytes(), &limits()).unwrap();
        // 23 items over a limit of 10: drop 16 (multiples of 4), keep 16..23.
        assert_eq!(r.history, History::Inline((16..23).collect()));
        assert_eq!(r.history_dropped, 16);
        let r = decode_request_within(message(0, 10, "retrieve").as_bytes(), &limits()).unwrap();
        assert_eq!(r.history, History::Inline((4..10).collect()));
        let r = decode_request_within(message(1, 10, "rank").as_bytes(), &limits()).unwrap();
        assert_eq!(
            (r.history_dropped, r.history),
            (0, History::Inline((0..10).collect()))
        );
        // Dropped items are not even decoded; kept ones are checked by index.
        let bad_old = r#"{"req_id":1,"user_id":2,"ts_ms":3,"candidates":[1],"history":["x",1,2,3,4,5,6,7,8,9,10,11]}"#;
        assert!(decode_request_within(bad_old.as_bytes(), &limits()).is_ok());
        let bad_new = r#"{"req_id":1,"user_id":2,"ts_ms":3,"candidates":[1],"history":[0,1,2,3,4,5,6,7,8,9,10,"x"]}"#;
        let e = decode_request_within(bad_new.as_bytes(), &limits()).unwrap_err();
        assert!(e.to_string().contains("`history[11]`"), "{e}");
    }

    #[test]
    fn responses_round_scores_and_compare_answers_only() {
        let source = RecordId {
            partition: 2,
            offset: 40,
        };
        let a = WireResponse::ranking(source, 5, vec![1, 2], &[0.123_45, -1.000_4], "v1".into())
            .timed(0, 10, 2.5);
        assert_eq!(a.scores, vec![0.123, -1.0]);
        let mut b = a.clone();
        b.latency_ms = 9.0;
        b.node = 1;
        assert!(a.same_answer(&b));
        b.scores[0] = 0.126;
        assert!(!a.same_answer(&b), "3e-3 apart on the wire");
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(serde_json::from_str::<WireResponse>(&json).unwrap(), a);
        assert!(!json.contains("error"), "{json}");
        assert_eq!(a.source(), source);
    }

    fn ranked(items: &[u32], raw: &[f32]) -> WireResponse {
        let source = RecordId {
            partition: 1,
            offset: 9,
        };
        WireResponse::ranking(source, 5, items.to_vec(), raw, "v1".into())
    }

    #[test]
    fn scores_that_round_apart_within_the_tolerance_are_the_same_answer() {
        // 0.2125 with and without prefix KV reuse: 3e-5 apart before
        // rounding, 1e-3 apart after it.
        let full = ranked(&[3, 8, 1], &[0.212_49, 0.1, -0.5]);
        let reused = ranked(&[3, 8, 1], &[0.212_52, 0.1, -0.5]);
        assert_ne!(full.scores, reused.scores, "rounding splits them");
        assert!(full.same_answer(&reused));
        assert!(reused.same_answer(&full));
        // 1e-3 apart before rounding is still the same; 3e-3 is not.
        assert!(ranked(&[3], &[0.2104]).same_answer(&ranked(&[3], &[0.2114])));
        assert!(!ranked(&[3], &[0.2100]).same_answer(&ranked(&[3], &[0.2130])));
        // Another request, another item, a missing item: different.
        let mut other_req = full.clone();
        other_req.req_id = 6;
        assert!(!full.same_answer(&other_req));
        assert!(!full.same_answer(&ranked(&[3, 9, 1], &[0.2125, 0.1, -0.5])));
        assert!(!full.same_answer(&ranked(&[3, 8], &[0.2125, 0.1])));
    }

    #[test]
    fn near_ties_may_trade_places_but_clear_orders_may_not() {
        let a = ranked(&[4, 7, 2], &[0.300_2, 0.300_0, 0.1]);
        let b = ranked(&[7, 4, 2], &[0.300_1, 0.300_1, 0.1]);
        assert!(a.same_answer(&b) && b.same_answer(&a));
        let c = ranked(&[7, 4, 2], &[0.31, 0.30, 0.1]);
        assert!(!a.same_answer(&c), "a 1e-2 lead is an order");
        // At the top-k cut: item 2 and item 5 tie for the last place.
        let cut_a = ranked(&[4, 2], &[0.5, 0.100_0]);
        let cut_b = ranked(&[4, 5], &[0.5, 0.100_2]);
        assert!(cut_a.same_answer(&cut_b) && cut_b.same_answer(&cut_a));
        let cut_c = ranked(&[4, 5], &[0.5, 0.09]);
        assert!(!cut_a.same_answer(&cut_c));
    }

    #[test]
    fn error_records_differ_from_rankings() {
        let source = RecordId {
            partition: 0,
            offset: 1,
        };
        let shed = WireResponse::failed(source, 5, "shed", "deadline 100 ms passed".into());
        let ranked = WireResponse::ranking(source, 5, vec![], &[], String::new());
        assert!(!shed.same_answer(&ranked));
        let json = serde_json::to_string(&shed).unwrap();
        assert!(json.contains(r#""error":{"kind":"shed""#), "{json}");
        assert_eq!(serde_json::from_str::<WireResponse>(&json).unwrap(), shed);
    }

    #[test]
    fn dead_letters_keep_the_source_and_a_bounded_payload_head() {
        let payload = vec![b'x'; 5000];
        let e = WireError::Missing { field: "req_id" };
        let d = DeadLetter::new(&e, "requests", 3, 41, &payload);
        assert_eq!((d.partition, d.offset, d.payload_bytes), (3, 41, 5000));
        assert_eq!(d.payload_head.len(), DEAD_LETTER_PAYLOAD_BYTES);
        assert_eq!(d.reason, "missing field `req_id`");
        assert_eq!(d.kind, "missing_field");
    }
}

//! What every request source is: a worker's share of a stream of requests,
//! read without blocking, with a watermark (no record this worker reads
//! later is older). Parquet traces and Kafka topics implement it; the
//! pipeline's timely wrappers pace, stamp and emit what it returns.

use grflow_traces::Request;

use crate::error::SourceError;
use crate::records::SourcePosition;

/// One record of the stream: a good request, or a record that could not be
/// decoded (counted and reported, never fatal).
#[derive(Clone, Debug, PartialEq)]
pub enum SourceRecord {
    Request {
        request: Request,
        position: SourcePosition,
        /// The user's history when the record carried it inline (Kafka);
        /// `None` means the first `hist_len` items of the users table.
        inline_history: Option<Vec<u32>>,
        /// The record was in the log when the job started: a previous
        /// incarnation may have answered it already (Kafka restarts).
        recovered: bool,
        /// The inline history lost its oldest items at decode (to the
        /// longest history a served model takes).
        history_cut: bool,
    },
    Bad {
        position: SourcePosition,
        reason: String,
        /// The row's `req_id` where it was readable (a row refused for
        /// what it asks, such as too many candidates), so that its error
        /// row joins back to the request.
        req_id: Option<u64>,
    },
}

impl SourceRecord {
    /// A request read from a table (no inline history, not recovered).
    pub fn request(request: Request, position: SourcePosition) -> Self {
        SourceRecord::Request {
            request,
            position,
            inline_history: None,
            recovered: false,
            history_cut: false,
        }
    }

    pub fn position(&self) -> &SourcePosition {
        match self {
            SourceRecord::Request { position, .. } | SourceRecord::Bad { position, .. } => position,
        }
    }
}

/// Whether a source has more to give.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceState {
    /// More records may be ready now: poll again at once.
    Ready,
    /// Nothing more right now (a live stream): poll again shortly.
    Idle,
    /// This worker's share is read to the end.
    Exhausted,
}

/// What one [`RequestSource::poll`] read.
#[derive(Clone, Debug, PartialEq)]
pub struct Polled {
    pub records: Vec<SourceRecord>,
    /// Every later request of this worker has `ts_ms >= watermark_ms`;
    /// `u64::MAX` when nothing is left.
    pub watermark_ms: u64,
    pub state: SourceState,
}

impl Polled {
    /// Nothing left, nothing read.
    pub fn exhausted() -> Self {
        Self {
            records: Vec::new(),
            watermark_ms: u64::MAX,
            state: SourceState::Exhausted,
        }
    }
}

/// A worker's share of a request stream.
pub trait RequestSource {
    /// Reads up to `max` records that are ready now, without blocking.
    /// `floor_ms` is the earliest event time the caller can still emit at
    /// (a live source counts a record older than that as late).
    ///
    /// An `Err` is an unreadable part of the input whose records are
    /// unknown: the caller may report it and poll again to go on with the
    /// rest. A record that is unreadable on its own comes back as
    /// [`SourceRecord::Bad`], or is dead-lettered by the source itself
    /// where the stream has a place for it (Kafka).
    fn poll(&mut self, max: usize, floor_ms: u64) -> Result<Polled, SourceError>;
}

//! `[run]`: workers, pacing, latency objectives, the clock and the release
//! policy.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Latency objectives (ms), one per request kind: beam search does more
/// work per request than ranking, so it gets its own.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct SloMs {
    pub rank: f64,
    pub retrieve: f64,
}

impl SloMs {
    /// The same objective for both kinds.
    pub fn both(ms: f64) -> Self {
        Self {
            rank: ms,
            retrieve: ms,
        }
    }

    pub fn for_mode(&self, mode: grflow_traces::Mode) -> f64 {
        match mode {
            grflow_traces::Mode::Rank => self.rank,
            grflow_traces::Mode::Retrieve => self.retrieve,
        }
    }
}

impl<'de> Deserialize<'de> for SloMs {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        /// A number for both kinds, or a table with one per kind.
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Both(f64),
            Each(Each),
        }
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Each {
            rank: f64,
            retrieve: f64,
        }
        match Written::deserialize(d).map_err(|_| {
            serde::de::Error::custom(
                "slo_ms must be a number or a table { rank = MS, retrieve = MS }",
            )
        })? {
            Written::Both(ms) => Ok(SloMs::both(ms)),
            Written::Each(e) => Ok(SloMs {
                rank: e.rank,
                retrieve: e.retrieve,
            }),
        }
    }
}

/// How the job runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunConfig {
    /// Timely workers in this process; one worker is one serving node.
    pub workers: usize,
    /// Pacing of event time against wall time: "max", "1x", "4x", "0.5x".
    pub speed: String,
    /// Latency objectives for slo_satisfaction: `slo_ms = 30.0` for both
    /// request kinds, or `slo_ms = { rank = 30.0, retrieve = 50.0 }`.
    pub slo_ms: SloMs,
    /// What latency_ms measures: "wall" (on this machine, from the
    /// request's due time in a paced replay, else its admission, to the
    /// response), "event" (the node's event-time service model) or
    /// "virtual" (a fitted cost model charged on each node's timeline).
    pub clock: Clock,
    /// When router and nodes handle a request: "complete" (once every input
    /// has passed its event time; deterministic), "arrival" (as it arrives,
    /// with the state known so far) or "auto" (complete with clock = "event",
    /// arrival with clock = "wall" and in `grflow serve`).
    pub release: ReleaseSetting,
    /// With speed = "max": how far (event ms) the source may run ahead of
    /// the oldest event time not yet answered. Bounds the requests in
    /// flight (memory) and the times timely tracks; paced runs are not
    /// held back, so an overloaded node shows its queue as latency.
    pub max_ahead_ms: u64,
}

impl Default for RunConfig {
    fn default() -> Self {
        Self {
            workers: 2,
            speed: "1x".into(),
            slo_ms: SloMs {
                rank: 30.0,
                retrieve: 50.0,
            },
            clock: Clock::Wall,
            release: ReleaseSetting::Auto,
            max_ahead_ms: 2_000,
        }
    }
}

impl RunConfig {
    /// The release policy of `grflow replay`: `auto` follows the clock.
    pub fn replay_release(&self) -> Release {
        match self.release {
            ReleaseSetting::Complete => Release::Complete,
            ReleaseSetting::Arrival => Release::Arrival,
            ReleaseSetting::Auto => match self.clock {
                Clock::Event | Clock::Virtual => Release::Complete,
                Clock::Wall => Release::Arrival,
            },
        }
    }

    /// The release policy of `grflow serve`: `auto` is arrival (a live
    /// service does not hold requests back for its slowest partition).
    pub fn serve_release(&self) -> Release {
        match self.release {
            ReleaseSetting::Complete => Release::Complete,
            ReleaseSetting::Arrival | ReleaseSetting::Auto => Release::Arrival,
        }
    }
}

/// `run.release` as written in the config.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReleaseSetting {
    #[default]
    Auto,
    Complete,
    Arrival,
}

impl std::str::FromStr for ReleaseSetting {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "complete" => Ok(Self::Complete),
            "arrival" => Ok(Self::Arrival),
            _ => Err(format!("release {s:?} is not complete, arrival or auto")),
        }
    }
}

/// When a stateful operator handles the data of an event time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Release {
    /// Once every input's frontier has passed the time: control and data of
    /// one time are handled together, in time order. Deterministic.
    Complete,
    /// As data arrives, with the state known so far (HLEM's asynchronous
    /// state sync); frontiers only tell the operator a time is over.
    Arrival,
}

impl Release {
    pub fn as_str(self) -> &'static str {
        match self {
            Release::Complete => "complete",
            Release::Arrival => "arrival",
        }
    }
}

/// The clock latency is measured on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Clock {
    /// Wall time from a request's admission by the source to its response:
    /// what this machine actually delivered.
    #[default]
    Wall,
    /// The serving node's event-time model (backlog over service rate plus
    /// link time): deterministic, the same on any machine and at any speed.
    Event,
    /// Model work is not run but charged from a cost model fitted on a
    /// machine (`grflow calibrate`), each node on its own timeline: a
    /// request waits for the node's earlier work, then its link transfers
    /// and its compute. Deterministic, and fast (no model runs).
    Virtual,
}

impl Clock {
    pub fn as_str(self) -> &'static str {
        match self {
            Clock::Wall => "wall",
            Clock::Event => "event",
            Clock::Virtual => "virtual",
        }
    }
}

impl std::str::FromStr for Clock {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "wall" => Ok(Clock::Wall),
            "event" => Ok(Clock::Event),
            "virtual" => Ok(Clock::Virtual),
            _ => Err(format!("clock {s:?} is not wall, event or virtual")),
        }
    }
}

/// Event time against wall time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Speed {
    /// As fast as the job can go.
    Max,
    /// `factor` ms of event time per ms of wall time.
    Factor(f64),
}

impl Speed {
    /// Wall time after which `event_ms` of event time is due: `None`
    /// unpaced. A due time past what a Duration holds saturates (never).
    pub fn wall_time(self, event_ms: u64) -> Option<Duration> {
        match self {
            Speed::Max => None,
            Speed::Factor(f) => Some(
                Duration::try_from_secs_f64(event_ms as f64 / f / 1000.0).unwrap_or(Duration::MAX),
            ),
        }
    }
}

/// The slowest and fastest pacing factors.
const MIN_SPEED: f64 = 1e-6;
const MAX_SPEED: f64 = 1e6;

impl std::str::FromStr for Speed {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "max" {
            return Ok(Speed::Max);
        }
        // Bounded: 1e-6x paces one event-time second over 11 days, and
        // past 1e6x pacing is `max` in all but name.
        let factor = s
            .strip_suffix('x')
            .and_then(|f| f.parse::<f64>().ok())
            .filter(|f| (MIN_SPEED..=MAX_SPEED).contains(f))
            .ok_or_else(|| {
                format!(
                    "speed {s:?} is not max or a factor like 1x, 4x, 0.5x \
                     (from {MIN_SPEED}x to {MAX_SPEED}x)"
                )
            })?;
        Ok(Speed::Factor(factor))
    }
}

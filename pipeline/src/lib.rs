//! The grflow dataflow: builds the timely graph from a Config, runs it on
//! the workers, and gathers what it produced.
//!
//! Nothing here decides anything about serving: the decisions live in
//! `grflow_operators`; these are thin timely wrappers and the job runner.

pub mod admin;
pub mod cluster;
pub mod config;
pub mod dataflow;
pub mod events;
pub mod handshake;
pub mod http;
pub mod job;
pub mod models;
pub mod ops;
pub mod params;
pub mod plot;
pub mod replay;
pub mod run_charts;
pub mod serve;
pub mod serving_setup;
pub mod side;
pub mod stop;
pub mod summary;
pub mod trained;
pub mod window_log;
pub mod worker_failure;

pub use config::{Clock, Config, ConfigError, Release, ReleaseSetting, SloMs, Speed};
pub use replay::{ReplayError, ReplayOptions, ReplayOutput, TraceInput, replay};
pub use serve::check::check as check_serve;
pub use serve::{CheckReport, ServeError, ServeOptions, ServeSummary, kafka_settings, serve};
pub use stop::{StopRequest, on_signals};
pub use summary::Summary;

//! Operations endpoints of a running job, on a small HTTP/1.1 server
//! (`crate::http`: one listener thread, a thread per connection): Prometheus metrics at `/metrics` (every name prefixed
//! `grflow_`, recorded through the `metrics` facade), liveness at
//! `/healthz`, readiness at `/readyz` and the job's state, running config
//! and model version at `/status`. A scrape is small, and nothing here
//! is on the serving path.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// Why the ops server could not start.
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    #[error("--metrics-addr {addr:?}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("--metrics-addr {0:?}: not HOST:PORT or \"none\"")]
    Addr(String),
}

/// What the endpoints report, updated by the job. Readiness is the
/// conjunction of separate conditions, each set by its owner, so that one
/// coming back (the broker answering again) cannot hide another (the
/// dataflow not started yet, a fatal stop).
#[derive(Debug, Default)]
pub struct OpsState {
    /// The dataflow runs: model, catalog and inputs loaded and, in a
    /// cluster, every process connected.
    started: AtomicBool,
    draining: AtomicBool,
    /// A fatal error stops the job: why.
    stopping: Mutex<Option<String>>,
    /// The broker has not answered for too long: why.
    broker_down: Mutex<Option<String>>,
    /// The `/status` document (config, model version, ...).
    status: Mutex<serde_json::Value>,
}

impl OpsState {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// The dataflow runs (model, catalog and inputs loaded, peers connected).
    pub fn set_started(&self) {
        self.started.store(true, Ordering::Relaxed);
    }

    /// A fatal error stops the job: not ready from now on, and why.
    pub fn set_stopping(&self, reason: impl Into<String>) {
        *self.stopping.lock().expect("ops lock") = Some(reason.into());
    }

    /// The broker watcher's verdict: `Some(why)` while it is unreachable.
    pub fn set_broker_down(&self, reason: Option<String>) {
        *self.broker_down.lock().expect("ops lock") = reason;
    }

    /// Shutting down: not ready any more, still alive.
    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// The `/status` document; secrets in it (librdkafka passwords, keys)
    /// are replaced by `"***"`. Its `state`, `version`, `ready` and
    /// `not_ready` are the endpoint's own (see `OpsState::status_document`).
    pub fn set_status(&self, mut status: serde_json::Value) {
        redact(&mut status);
        *self.status.lock().expect("ops lock") = status;
    }

    /// Sets one top-level field of the `/status` document.
    pub fn set_status_field(&self, key: &str, mut value: serde_json::Value) {
        redact(&mut value);
        let mut status = self.status.lock().expect("ops lock");
        if !status.is_object() {
            *status = serde_json::json!({});
        }
        status[key] = value;
    }

    /// Where the job is in its life, most lasting first.
    fn phase(&self) -> Phase {
        if let Some(why) = self.stopping.lock().expect("ops lock").as_ref() {
            return Phase::Stopping(why.clone());
        }
        if self.draining.load(Ordering::Relaxed) {
            Phase::Draining
        } else if !self.started.load(Ordering::Relaxed) {
            Phase::Starting
        } else {
            Phase::Running
        }
    }

    /// Why a command (an α pin, a model swap) would not be applied now:
    /// the job stopped taking input, and its command source with it.
    pub fn refuses_commands(&self) -> Option<String> {
        match self.phase() {
            Phase::Draining => Some("draining".into()),
            Phase::Stopping(why) => Some(format!("stopping: {why}")),
            Phase::Starting | Phase::Running => None,
        }
    }

    /// Ready, or the first reason not to be, most lasting first.
    fn readiness(&self) -> Result<(), String> {
        self.readiness_in(self.phase())
    }

    /// Readiness in `phase` (read once, so that /status's state and
    /// readiness agree).
    fn readiness_in(&self, phase: Phase) -> Result<(), String> {
        match phase {
            Phase::Stopping(why) => Err(format!("stopping: {why}")),
            Phase::Draining => Err("draining".into()),
            Phase::Starting => Err("starting".into()),
            Phase::Running => match self.broker_down.lock().expect("ops lock").as_ref() {
                Some(why) => Err(why.clone()),
                None => Ok(()),
            },
        }
    }

    /// The `/status` body: the job's document with its state added, an
    /// object from the first request on (the job publishes its document
    /// only once the model and inputs are loaded, which may take minutes).
    fn status_document(&self) -> serde_json::Value {
        let mut doc = match &*self.status.lock().expect("ops lock") {
            serde_json::Value::Object(map) => map.clone(),
            _ => serde_json::Map::new(),
        };
        // Computed here, not stored, so that a later `set_status` cannot
        // leave a stale state behind.
        let phase = self.phase();
        doc.insert("state".into(), phase.name().into());
        doc.insert("version".into(), env!("CARGO_PKG_VERSION").into());
        let readiness = self.readiness_in(phase);
        doc.insert("ready".into(), readiness.is_ok().into());
        if let Err(why) = readiness {
            doc.insert("not_ready".into(), why.into());
        }
        serde_json::Value::Object(doc)
    }
}

/// The job's lifecycle as `/status` reports it: starting → running →
/// draining, or stopping on a fatal error.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// Model, catalog or inputs still loading, or peers still connecting.
    Starting,
    Running,
    /// Stopped reading (a signal): answering what was read.
    Draining,
    /// A fatal error stops the job: why.
    Stopping(String),
}

impl Phase {
    fn name(&self) -> &'static str {
        match self {
            Self::Starting => "starting",
            Self::Running => "running",
            Self::Draining => "draining",
            Self::Stopping(_) => "stopping",
        }
    }
}

/// Replaces the values of keys that name secrets.
fn redact(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                let k = k.to_ascii_lowercase();
                // sasl.oauthbearer.config may carry a token or SASL extensions.
                let secret = [
                    "password",
                    "secret",
                    "ssl.key",
                    "private",
                    "oauthbearer.config",
                ]
                .iter()
                .any(|s| k.contains(s));
                if secret {
                    *v = serde_json::Value::String("***".into());
                } else {
                    redact(v);
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(redact),
        _ => {}
    }
}

/// The job's state as the endpoints see it: one per process, like the
/// metrics recorder, so that `replay` and `serve` report without being
/// handed anything.
pub fn state() -> &'static Arc<OpsState> {
    static STATE: OnceLock<Arc<OpsState>> = OnceLock::new();
    STATE.get_or_init(OpsState::new)
}

/// Upper bounds (ms) of `grflow_latency_ms`'s histogram buckets.
pub const LATENCY_BUCKETS_MS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 50.0, 100.0, 200.0, 500.0, 1_000.0, 2_000.0, 5_000.0,
];

/// The process's Prometheus recorder, installed on first use (the
/// `metrics` facade has one global recorder per process).
pub fn metrics_handle() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        // Latency as a Prometheus histogram with fixed buckets (ms), so
        // that dashboards can aggregate over nodes and processes; the
        // buckets bracket the 30 ms rank and 200 ms hstu-3l objectives.
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(
                metrics_exporter_prometheus::Matcher::Full("grflow_latency_ms".into()),
                LATENCY_BUCKETS_MS,
            )
            .expect("non-empty buckets")
            .build_recorder();
        let handle = recorder.handle();
        // Another recorder installed first (an embedding program's): ours
        // still renders what was recorded through it, which is nothing.
        let _ = metrics::set_global_recorder(recorder);
        // Histogram samples wait in a buffer until a scrape or an upkeep
        // folds them into the buckets: a job nobody scrapes (or whose
        // endpoint could not bind) would keep every latency it recorded.
        let upkeep = handle.clone();
        let spawned = std::thread::Builder::new()
            .name("grflow-metrics-upkeep".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(UPKEEP_EVERY);
                    upkeep.run_upkeep();
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("no metrics upkeep thread ({e}): scrape /metrics to bound its memory");
        }
        handle
    })
}

/// How often recorded histogram samples are folded into their buckets.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// A response: status line, content type, body.
#[derive(Debug, PartialEq)]
pub struct Reply {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
}

fn reply(status: u16, content_type: &'static str, body: impl Into<String>) -> Reply {
    Reply {
        status,
        content_type,
        body: body.into(),
    }
}

/// Answers one request line (`GET /path HTTP/1.1`).
pub fn route(request_line: &str, state: &OpsState, metrics: &dyn Fn() -> String) -> Reply {
    let mut parts = request_line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    if method != "GET" && method != "HEAD" {
        return reply(405, "text/plain", "only GET\n");
    }
    match path {
        "/metrics" => reply(200, "text/plain; version=0.0.4", metrics()),
        "/healthz" => reply(200, "text/plain", "ok\n"),
        "/readyz" => match state.readiness() {
            Ok(()) => reply(200, "text/plain", "ready\n"),
            Err(why) => reply(503, "text/plain", format!("not ready: {why}\n")),
        },
        "/status" => {
            let body = serde_json::to_string_pretty(&state.status_document()).unwrap_or_default();
            reply(200, "application/json", body + "\n")
        }
        _ => reply(
            404,
            "text/plain",
            "not found: try /metrics, /healthz, /readyz, /status\n",
        ),
    }
}

/// The running server; stops when dropped.
#[derive(Debug)]
pub struct OpsServer {
    listener: crate::http::Listener,
}

impl OpsServer {
    /// Serves on `addr` (`HOST:PORT`; port 0 picks one), or nothing for
    /// `"none"`.
    pub fn start(addr: &str, state: Arc<OpsState>) -> Result<Option<Self>, OpsError> {
        if addr == "none" {
            return Ok(None);
        }
        let parsed: SocketAddr = addr.parse().map_err(|_| OpsError::Addr(addr.into()))?;
        let handle = metrics_handle();
        let render = move || handle.render();
        let listener = crate::http::Listener::spawn("grflow-ops", parsed, move |stream, _| {
            answer(stream, &state, &render)
        })
        .map_err(|source| OpsError::Bind {
            addr: addr.into(),
            source,
        })?;
        tracing::info!(addr = %listener.local_addr(), "metrics, health and status endpoints");
        Ok(Some(Self { listener }))
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr()
    }
}

fn answer(
    stream: TcpStream,
    state: &OpsState,
    metrics: &dyn Fn() -> String,
) -> std::io::Result<()> {
    stream.set_write_timeout(Some(Duration::from_secs(2)))?;
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    let (r, head_only) = match crate::http::read_head(&stream, deadline) {
        Ok((head, _)) => (
            route(&format!("{} {}", head.method, head.path), state, metrics),
            head.method == "HEAD",
        ),
        Err(crate::http::HeadError::Io(e)) => return Err(e),
        Err(e) => (reply(400, "text/plain", format!("{e}\n")), false),
    };
    let reason = match r.status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Service Unavailable",
    };
    let mut stream = stream;
    write!(
        stream,
        "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        r.status,
        r.content_type,
        r.body.len()
    )?;
    if !head_only {
        stream.write_all(r.body.as_bytes())?;
    }
    stream.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn routes_answer_by_path_and_readiness_follows_the_state() {
        let state = OpsState::new();
        let metrics = || "grflow_x 1\n".to_string();
        assert_eq!(route("GET /healthz HTTP/1.1", &state, &metrics).status, 200);
        let r = route("GET /readyz HTTP/1.1", &state, &metrics);
        assert_eq!((r.status, r.body.as_str()), (503, "not ready: starting\n"));
        // The broker answering again before the dataflow runs (a cluster
        // still connecting) is not ready yet.
        state.set_broker_down(Some("broker unreachable for 30 s".into()));
        state.set_broker_down(None);
        assert_eq!(route("GET /readyz", &state, &metrics).status, 503);
        state.set_started();
        assert_eq!(route("GET /readyz HTTP/1.1", &state, &metrics).status, 200);
        state.set_broker_down(Some("broker unreachable for 30 s".into()));
        assert!(
            route("GET /readyz", &state, &metrics)
                .body
                .contains("broker")
        );
        state.set_broker_down(None);
        assert_eq!(route("GET /readyz", &state, &metrics).status, 200);
        // A fatal stop outlasts the broker's return.
        let fatal = OpsState::new();
        fatal.set_started();
        fatal.set_stopping("dead letters unwritable");
        fatal.set_broker_down(None);
        assert_eq!(
            route("GET /readyz", &fatal, &metrics).body,
            "not ready: stopping: dead letters unwritable\n"
        );
        state.set_draining();
        assert_eq!(
            route("GET /readyz", &state, &metrics).body,
            "not ready: draining\n"
        );
        let m = route("GET /metrics?x=1 HTTP/1.1", &state, &metrics);
        assert_eq!((m.status, m.body.as_str()), (200, "grflow_x 1\n"));
        state.set_status(serde_json::json!({
            "model_version": "gr-1",
            "kafka": {"librdkafka": {
                "sasl.password": "hunter2",
                "ssl.key.password": "x",
                "sasl.oauthbearer.config": "principal=grflow extension_token=t0ken",
                "sasl.oauthbearer.client.secret": "s3cr3t",
                "sasl.mechanism": "OAUTHBEARER"
            }}
        }));
        let status = route("GET /status", &state, &metrics).body;
        assert!(status.contains("gr-1") && status.contains("OAUTHBEARER"));
        assert!(
            !status.contains("hunter2")
                && !status.contains("t0ken")
                && !status.contains("s3cr3t")
                && status.contains("***"),
            "{status}"
        );
        assert_eq!(
            route("POST /metrics HTTP/1.1", &state, &metrics).status,
            405
        );
        assert_eq!(route("GET /nope HTTP/1.1", &state, &metrics).status, 404);
    }

    /// Before the job published its document /status answered `null`;
    /// a user polling it through a long startup now reads "starting".
    #[test]
    fn status_is_an_object_with_the_jobs_state_from_the_first_request() {
        let state = OpsState::new();
        let metrics = String::new;
        let status = |state: &OpsState| -> serde_json::Value {
            let r = route("GET /status HTTP/1.1", state, &metrics);
            assert_eq!((r.status, r.content_type), (200, "application/json"));
            serde_json::from_str(&r.body).unwrap()
        };
        let first = status(&state);
        assert_eq!(first["state"], "starting", "{first}");
        assert_eq!(first["version"], env!("CARGO_PKG_VERSION"));
        assert_eq!(first["ready"], false);
        assert_eq!(first["not_ready"], "starting");
        // A field set before the document (a model loaded first) shows
        // beside the state.
        state.set_status_field("models", serde_json::json!({"serving": {}}));
        let early = status(&state);
        assert_eq!(early["state"], "starting");
        assert!(early["models"].is_object(), "{early}");
        state.set_status(serde_json::json!({"command": "serve", "model_version": "gr-1"}));
        state.set_started();
        let running = status(&state);
        assert_eq!(
            (&running["state"], &running["command"], &running["ready"]),
            (&"running".into(), &"serve".into(), &true.into()),
            "{running}"
        );
        assert!(running.get("not_ready").is_none(), "{running}");
        // Running but not ready: the state stays, the reason shows.
        state.set_broker_down(Some("broker unreachable for 30 s".into()));
        let down = status(&state);
        assert_eq!(
            (&down["state"], &down["ready"]),
            (&"running".into(), &false.into())
        );
        assert_eq!(down["not_ready"], "broker unreachable for 30 s");
        assert_eq!(state.refuses_commands(), None, "running takes commands");
        state.set_draining();
        assert_eq!(status(&state)["state"], "draining");
        // The command source has closed: an admin command would be lost.
        assert_eq!(state.refuses_commands().as_deref(), Some("draining"));
        state.set_stopping("dead letters unwritable");
        assert_eq!(
            state.refuses_commands().as_deref(),
            Some("stopping: dead letters unwritable")
        );
        let stopping = status(&state);
        assert_eq!(stopping["state"], "stopping");
        assert_eq!(stopping["not_ready"], "stopping: dead letters unwritable");
        assert_eq!(stopping["model_version"], "gr-1");
    }

    #[test]
    fn the_server_answers_over_tcp_and_stops_when_dropped() {
        let state = OpsState::new();
        state.set_started();
        let server = OpsServer::start("127.0.0.1:0", state).unwrap().unwrap();
        let addr = server.local_addr();
        let get = |path: &str| {
            let mut s = TcpStream::connect(addr).unwrap();
            write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).unwrap();
            out
        };
        let ready = get("/readyz");
        assert!(ready.starts_with("HTTP/1.1 200 OK"), "{ready}");
        assert!(ready.ends_with("ready\n"));
        assert!(get("/nope").starts_with("HTTP/1.1 404"));
        drop(server);
        assert!(TcpStream::connect(addr).is_err(), "closed after drop");
        assert!(OpsServer::start("none", OpsState::new()).unwrap().is_none());
        assert!(matches!(
            OpsServer::start("nonsense", OpsState::new()),
            Err(OpsError::Addr(_))
        ));
    }
}

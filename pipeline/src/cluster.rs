//! Timely's own cluster mode: N processes × W worker threads behave as N·W
//! serving nodes. Every per-node index (node id, source shard, Kafka
//! partition ownership, offset book) is the global worker index
//! `process × W + local`; process 0 gathers the job's outputs.
//!
//! Timely's membership is fixed when the processes connect: it retries a
//! missing peer forever (grflow gives up after `cluster.connect_timeout_s`)
//! and a connection lost later panics every process. Recovery is a restart
//! of the whole job (see README, "Cluster mode").

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use timely::communication::WorkerGuards;
use timely::worker::Worker;

use crate::handshake::{self, Fingerprint, HandshakeError};

/// `[cluster]`: which processes make up the job and which one this is.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterSection {
    /// `host:port` of every process in process order (process 0 first);
    /// empty = a single process. `hostfile` replaces it when set.
    pub hosts: Vec<String>,
    /// A file with one `host:port` per line (blank lines and `#` comments
    /// ignored), timely's hostfile format; `--hostfile` sets it.
    pub hostfile: Option<PathBuf>,
    /// This process's index into the hosts; `--process` sets it.
    pub process: usize,
    /// Give up when the other processes are not all connected after this
    /// many seconds (timely itself retries forever); 0 = wait forever.
    pub connect_timeout_s: u64,
}

impl Default for ClusterSection {
    fn default() -> Self {
        Self {
            hosts: Vec::new(),
            hostfile: None,
            process: 0,
            connect_timeout_s: 300,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ClusterError {
    #[error("cluster.hostfile {path}: {reason}")]
    Hostfile { path: String, reason: String },
    #[error("{at} = {host:?}: expected host:port")]
    BadHost { at: HostAt, host: String },
    #[error("{at} = {host:?} appears twice")]
    Duplicate { at: HostAt, host: String },
    #[error("cluster.process = {process}, but there are only {hosts} hosts (0..{hosts})")]
    ProcessOutOfRange { process: usize, hosts: usize },
    #[error("run.workers must be >= 1")]
    NoWorkers,
}

/// Where a host of the job was given: typed, so that a caller that set
/// `cluster.hostfile` from a flag can name the flag instead of the key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostAt {
    /// `cluster.hosts[index]`.
    Hosts { index: usize },
    /// Line `line` (1-based) of the hostfile at `path`.
    Hostfile { path: String, line: usize },
}

impl std::fmt::Display for HostAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Hosts { index } => write!(f, "cluster.hosts[{index}]"),
            Self::Hostfile { path, line } => write!(f, "cluster.hostfile {path} line {line}"),
        }
    }
}

/// Where this process sits among the job's workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Topology {
    pub processes: usize,
    pub process: usize,
    /// Worker threads per process (timely needs the same count everywhere).
    pub threads: usize,
}

impl Topology {
    pub fn single(threads: usize) -> Self {
        Self {
            processes: 1,
            process: 0,
            threads,
        }
    }

    /// Workers (= serving nodes) of the whole job.
    pub fn total(&self) -> usize {
        self.processes * self.threads
    }

    /// Global indices of this process's workers.
    pub fn local_workers(&self) -> Range<usize> {
        let first = self.process * self.threads;
        first..first + self.threads
    }

    /// This process's slot for a global worker index, if it runs it.
    pub fn local(&self, global: usize) -> Option<usize> {
        self.local_workers()
            .contains(&global)
            .then(|| global - self.process * self.threads)
    }

    /// Process 0 writes the job's combined outputs.
    pub fn is_leader(&self) -> bool {
        self.process == 0
    }

    pub fn is_cluster(&self) -> bool {
        self.processes > 1
    }
}

/// A resolved cluster: the topology and every process's address.
#[derive(Clone, Debug, PartialEq)]
pub struct Cluster {
    pub topology: Topology,
    pub addresses: Vec<String>,
    pub connect_timeout: Option<Duration>,
    /// What every process must agree on besides the topology (config
    /// sections, the trace), by digest: checked before timely connects.
    pub parts: BTreeMap<String, u64>,
}

/// Why [`Cluster::execute`] did not start the workers.
#[derive(Debug, thiserror::Error)]
pub enum ExecuteError {
    /// The processes are not one job (worker counts, hosts, config): the
    /// user's to fix.
    #[error("{0}")]
    Mismatch(String),
    #[error("{0}")]
    Timely(String),
}

impl ClusterSection {
    /// Reads the hostfile (if any) and checks the section against
    /// `threads` workers per process.
    pub fn resolve(&self, threads: usize) -> Result<Cluster, ClusterError> {
        if threads == 0 {
            return Err(ClusterError::NoWorkers);
        }
        // Each host with where it was given, for errors.
        let (hosts, places): (Vec<String>, Vec<HostAt>) = match &self.hostfile {
            Some(path) => read_hostfile(path)?
                .into_iter()
                .map(|(line, host)| {
                    let path = path.display().to_string();
                    (host, HostAt::Hostfile { path, line })
                })
                .unzip(),
            None => self
                .hosts
                .iter()
                .enumerate()
                .map(|(index, h)| (h.clone(), HostAt::Hosts { index }))
                .unzip(),
        };
        for (index, host) in hosts.iter().enumerate() {
            let ok = host
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
            if !ok {
                return Err(ClusterError::BadHost {
                    at: places[index].clone(),
                    host: host.clone(),
                });
            }
            if hosts[..index].contains(host) {
                return Err(ClusterError::Duplicate {
                    at: places[index].clone(),
                    host: host.clone(),
                });
            }
        }
        let processes = hosts.len().max(1);
        if self.process >= processes {
            return Err(ClusterError::ProcessOutOfRange {
                process: self.process,
                hosts: hosts.len(),
            });
        }
        Ok(Cluster {
            topology: Topology {
                processes,
                process: self.process,
                threads,
            },
            addresses: hosts,
            connect_timeout: (self.connect_timeout_s > 0)
                .then(|| Duration::from_secs(self.connect_timeout_s)),
            parts: BTreeMap::new(),
        })
    }
}

/// One `host:port` per line; blank lines and `#` comments are skipped.
/// Each host comes with its 1-based line number.
pub fn read_hostfile(path: &Path) -> Result<Vec<(usize, String)>, ClusterError> {
    let text = std::fs::read_to_string(path).map_err(|e| ClusterError::Hostfile {
        path: path.display().to_string(),
        reason: e.to_string(),
    })?;
    let hosts = parse_hostfile(&text);
    if hosts.is_empty() {
        return Err(ClusterError::Hostfile {
            path: path.display().to_string(),
            reason: "no host:port line".into(),
        });
    }
    Ok(hosts)
}

fn parse_hostfile(text: &str) -> Vec<(usize, String)> {
    text.lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.split('#').next().unwrap_or("").trim()))
        .filter(|(_, l)| !l.is_empty())
        .map(|(i, l)| (i, l.to_string()))
        .collect()
}

impl Cluster {
    fn timely_config(&self) -> timely::Config {
        let t = self.topology;
        if !t.is_cluster() {
            return timely::Config::process(t.threads);
        }
        timely::Config {
            communication: timely::CommunicationConfig::Cluster {
                threads: t.threads,
                process: t.process,
                addresses: self.addresses.clone(),
                report: false,
                zerocopy: false,
            },
            worker: timely::WorkerConfig::default(),
        }
    }

    /// Checks with process 0 that every process runs the same job
    /// ([`crate::handshake`]).
    fn handshake(&self) -> Result<(), HandshakeError> {
        let t = self.topology;
        let own = Fingerprint {
            process: t.process,
            version: handshake::BUILD.to_string(),
            threads: t.threads,
            hosts: self.addresses.clone(),
            parts: self.parts.clone(),
        };
        if t.is_leader() {
            handshake::lead(&self.addresses[0], &own, t.processes)
        } else {
            handshake::follow(&self.addresses[0], &own)
        }
    }

    /// `timely::execute` on this topology. In cluster mode it first
    /// connects to every other process: timely prints its connection
    /// messages on stdout, which would corrupt a JSON summary there, so
    /// stdout points at stderr until the connections are made; a watchdog
    /// ends the process if they are not made within the connect timeout,
    /// or as soon as `stop` is set meanwhile (a SIGTERM while waiting for
    /// peers: nothing was read yet, so there is nothing to drain).
    pub fn execute<T, F>(
        &self,
        func: F,
        stop: Option<Arc<AtomicBool>>,
    ) -> Result<WorkerGuards<T>, ExecuteError>
    where
        T: Send + 'static,
        F: Fn(&mut Worker) -> T + Send + Sync + 'static,
    {
        let config = self.timely_config();
        if !self.topology.is_cluster() {
            return timely::execute(config, func).map_err(ExecuteError::Timely);
        }
        tracing::info!(
            process = self.topology.process,
            processes = self.topology.processes,
            threads = self.topology.threads,
            addresses = ?self.addresses,
            "connecting to the other processes"
        );
        let connected = Arc::new(AtomicBool::new(false));
        if self.connect_timeout.is_some() || stop.is_some() {
            let connected = connected.clone();
            let addresses = self.addresses.clone();
            let timeout = self.connect_timeout;
            let started = std::time::Instant::now();
            std::thread::spawn(move || {
                while !connected.load(Ordering::SeqCst) {
                    if stop.as_ref().is_some_and(|s| s.load(Ordering::SeqCst)) {
                        eprintln!(
                            "cluster: stopped while waiting for the other processes \
                             (hosts {addresses:?}); nothing was read"
                        );
                        std::process::exit(0);
                    }
                    if let Some(t) = timeout
                        && started.elapsed() >= t
                    {
                        eprintln!(
                            "error: cluster: not every process connected within {} s \
                             (cluster.connect_timeout_s); hosts {addresses:?}",
                            t.as_secs()
                        );
                        std::process::exit(3);
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            });
        }
        // One job or none: timely panics in its network threads when the
        // worker counts differ (the watchdog above bounds the wait).
        if let Err(e) = self.handshake() {
            // Done waiting: the watchdog must not end the caller later.
            connected.store(true, Ordering::SeqCst);
            return Err(match e {
                HandshakeError::Mismatch(_) => ExecuteError::Mismatch(e.to_string()),
                HandshakeError::Io { .. } => ExecuteError::Timely(e.to_string()),
            });
        }
        install_lost_peer_hook();
        let redirect = StdoutToStderr::begin();
        let guards = timely::execute(config, func).map_err(ExecuteError::Timely);
        drop(redirect);
        connected.store(true, Ordering::SeqCst);
        if guards.is_ok() {
            tracing::info!(process = self.topology.process, "cluster connected");
        }
        guards
    }
}

/// Exit code of a process that lost its connection to another process.
pub const LOST_PEER_EXIT: i32 = 4;

/// The process whose connection failed, when a panic is timely's network
/// thread reporting it: the thread is named `timely:send-P` or
/// `timely:recv-P` and its message starts with "timely communication
/// error:" (which timely keeps stable for callers that look for it).
fn lost_peer(thread: Option<&str>, message: &str) -> Option<usize> {
    let peer = thread?
        .strip_prefix("timely:send-")
        .or_else(|| thread?.strip_prefix("timely:recv-"))?;
    if !message.starts_with("timely communication error:") {
        return None;
    }
    peer.parse().ok()
}

/// What the process says when it stops for a lost peer.
fn lost_peer_message(peer: usize, cause: &str) -> String {
    format!(
        "error: cluster: lost the connection to process {peer} ({cause}). A job's processes \
         are fixed when they connect, so this process stops too. Restart every process of the \
         job with the same hostfile (`serve` resumes at its committed offsets, behind which \
         every answer is durable)"
    )
}

/// Once a process is connected, a lost peer panics timely's network threads
/// and then, in cascade, the workers ("MergeQueue poisoned") and main: four
/// backtraces that do not say what happened. This hook turns the first such
/// panic into one line naming the peer and exits with [`LOST_PEER_EXIT`],
/// as a crash would (offsets are committed only behind durable answers, so
/// nothing is lost); any other panic goes to the hook that was there.
fn install_lost_peer_hook() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let message = info.payload_as_str().unwrap_or("");
            let thread = std::thread::current();
            match lost_peer(thread.name(), message) {
                Some(peer) => {
                    let cause = message.trim_start_matches("timely communication error: ");
                    eprintln!("{}", lost_peer_message(peer, cause));
                    std::process::exit(LOST_PEER_EXIT);
                }
                None => previous(info),
            }
        }));
    });
}

/// Cluster mode: every worker's `item` travels to worker 0 (as JSON: bincode
/// cannot read every summary field), which returns them all in no
/// particular order; the others return nothing. Worker 0 gives up after
/// `wait` (a peer that never sends) and returns what it has.
pub fn gather_to_worker_0<T>(worker: &mut Worker, item: &T, wait: Duration) -> Vec<T>
where
    T: Serialize + serde::de::DeserializeOwned,
{
    use std::cell::RefCell;
    use std::rc::Rc;
    use timely::dataflow::operators::vec::ToStream;
    use timely::dataflow::operators::{Exchange, Inspect, Probe};
    let json = serde_json::to_string(item).expect("a worker result serialises");
    let received: Rc<RefCell<Vec<String>>> = Rc::default();
    let sink = received.clone();
    let id = worker.next_dataflow_index();
    let probe = timely::dataflow::ProbeHandle::new();
    worker.dataflow::<u64, _, _>(|scope| {
        vec![json]
            .to_stream(scope)
            .exchange(|_| 0)
            .inspect(move |s: &String| sink.borrow_mut().push(s.clone()))
            .probe_with(&probe);
    });
    let deadline = std::time::Instant::now() + wait;
    // Until this dataflow is done (other dataflows may still be installed).
    while !probe.done() {
        worker.step_or_park(Some(Duration::from_millis(10)));
        if std::time::Instant::now() >= deadline {
            tracing::warn!(
                received = received.borrow().len(),
                "gathering the workers' results timed out; reporting what arrived"
            );
            worker.drop_dataflow(id);
            break;
        }
    }
    let received = std::mem::take(&mut *received.borrow_mut());
    received
        .iter()
        .filter_map(|s| serde_json::from_str(s).ok())
        .collect()
}

/// Points file descriptor 1 at file descriptor 2 until dropped.
struct StdoutToStderr {
    saved: Option<i32>,
}

impl StdoutToStderr {
    fn begin() -> Self {
        use std::io::Write;
        let _ = std::io::stdout().flush();
        // SAFETY: dup/dup2 on the process's own standard descriptors; a
        // failure leaves stdout as it was.
        let saved = unsafe {
            let saved = libc::dup(1);
            if saved >= 0 && libc::dup2(2, 1) < 0 {
                libc::close(saved);
                -1
            } else {
                saved
            }
        };
        Self {
            saved: (saved >= 0).then_some(saved),
        }
    }
}

impl Drop for StdoutToStderr {
    fn drop(&mut self) {
        use std::io::Write;
        let _ = std::io::stdout().flush();
        if let Some(saved) = self.saved {
            // SAFETY: `saved` is the descriptor dup'ed in `begin`.
            unsafe {
                libc::dup2(saved, 1);
                libc::close(saved);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_timely_network_errors_name_a_lost_peer() {
        let err = "timely communication error: reading data: Connection reset by peer";
        assert_eq!(lost_peer(Some("timely:recv-1"), err), Some(1));
        assert_eq!(lost_peer(Some("timely:send-12"), err), Some(12));
        // A worker's own panic, or another message on a network thread.
        assert_eq!(lost_peer(Some("timely:work-0"), err), None);
        assert_eq!(
            lost_peer(Some("timely:recv-1"), "MergeQueue poisoned."),
            None
        );
        assert_eq!(lost_peer(None, err), None);
        let said = lost_peer_message(1, "reading data: Connection reset by peer");
        assert!(said.contains("process 1 (reading data"), "{said}");
    }

    #[test]
    fn a_hostfile_skips_blank_lines_and_comments() {
        let hosts = parse_hostfile("# the job\n10.0.0.1:2101\n\n  10.0.0.2:2101  # second\n");
        assert_eq!(
            hosts,
            vec![(2, "10.0.0.1:2101".into()), (4, "10.0.0.2:2101".into())]
        );
    }

    #[test]
    fn global_indices_are_process_major() {
        let t = Topology {
            processes: 3,
            process: 1,
            threads: 2,
        };
        assert_eq!(t.total(), 6);
        assert_eq!(t.local_workers(), 2..4);
        assert_eq!(t.local(3), Some(1));
        assert_eq!(t.local(4), None);
        assert!(!t.is_leader());
    }

    #[test]
    fn no_hosts_is_one_process() {
        let c = ClusterSection::default().resolve(4).unwrap();
        assert_eq!(c.topology, Topology::single(4));
        assert!(!c.topology.is_cluster());
    }

    #[test]
    fn bad_sections_name_the_field() {
        let section = |hosts: &[&str], process| ClusterSection {
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            process,
            ..ClusterSection::default()
        };
        assert_eq!(
            section(&["a:1", "b"], 0).resolve(1),
            Err(ClusterError::BadHost {
                at: HostAt::Hosts { index: 1 },
                host: "b".into()
            })
        );
        assert_eq!(
            section(&["a:1", "a:1"], 0).resolve(1),
            Err(ClusterError::Duplicate {
                at: HostAt::Hosts { index: 1 },
                host: "a:1".into()
            })
        );
        assert_eq!(
            section(&["a:1", "b:2"], 2).resolve(1),
            Err(ClusterError::ProcessOutOfRange {
                process: 2,
                hosts: 2
            })
        );
        assert_eq!(
            section(&["a:1"], 0).resolve(0),
            Err(ClusterError::NoWorkers)
        );
        let missing = ClusterSection {
            hostfile: Some("/nonexistent/hosts".into()),
            ..ClusterSection::default()
        };
        assert!(matches!(
            missing.resolve(1),
            Err(ClusterError::Hostfile { .. })
        ));
    }

    #[test]
    fn a_bad_hostfile_line_is_named_by_file_and_line() {
        let dir = std::env::temp_dir().join(format!("grflow-hostfile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("hosts.txt");
        let section = ClusterSection {
            hostfile: Some(path.clone()),
            ..ClusterSection::default()
        };
        std::fs::write(&path, "# job\n10.0.0.1:2101\n\n10.0.0.2\n").unwrap();
        // Typed, for a caller that names its own flag for the file.
        assert_eq!(
            section.resolve(1).unwrap_err(),
            ClusterError::BadHost {
                at: HostAt::Hostfile {
                    path: path.display().to_string(),
                    line: 4
                },
                host: "10.0.0.2".into()
            }
        );
        let err = section.resolve(1).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "cluster.hostfile {} line 4 = \"10.0.0.2\": expected host:port",
                path.display()
            )
        );
        std::fs::write(&path, "10.0.0.1:2101\n10.0.0.1:2101 # again\n").unwrap();
        let err = section.resolve(1).unwrap_err().to_string();
        assert!(
            err.ends_with("line 2 = \"10.0.0.1:2101\" appears twice"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

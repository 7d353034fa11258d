//! Before timely connects a cluster's processes, every process checks with
//! process 0 that they are one job. Timely assumes equal worker counts and
//! otherwise panics in its network threads ("index out of bounds" in
//! tcp.rs, then "MergeQueue poisoned" everywhere); processes with
//! different configs would serve a job nobody asked for. Process 0
//! listens on its own timely address; every other process connects, sends
//! its [`Fingerprint`] as one JSON line and waits for the verdict line.
//! Process 0 closes the listener before it answers, so that timely can
//! bind the address and no peer's timely connection lands in a listener
//! about to close.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// This build of grflow: its version and the commit it was built from
/// (`pipeline/build.rs`; with `-dirty.` and a digest of the changes when
/// built from uncommitted code, "unknown" outside git). The version alone
/// never changes between commits, while a record the processes exchange
/// (`Routed`, `NodeReport`, `NodeControl`) may gain a field in any commit.
pub const BUILD: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("GRFLOW_BUILD_COMMIT"),
    ")"
);

/// What must be equal in every process of a job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Fingerprint {
    pub process: usize,
    /// The build ([`BUILD`]): version and commit. One string, so that a
    /// process 0 built before the commit was compared still refuses a
    /// process of another build (it compared the version string alone).
    pub version: String,
    /// Worker threads (`--workers`, `run.workers`).
    pub threads: usize,
    /// Every process's address, process 0 first (the hostfile).
    pub hosts: Vec<String>,
    /// Per part of the job (a config section, the trace), a digest of its
    /// settings.
    pub parts: BTreeMap<String, u64>,
}

impl Fingerprint {
    /// Why process `other` cannot join the job of this one (process 0),
    /// naming what differs; None when they match.
    pub fn mismatch(&self, other: &Fingerprint) -> Option<String> {
        let p = other.process;
        if other.version != self.version {
            return Some(format!(
                "process {p} runs grflow {}, process 0 runs grflow {} (deploy the same grflow \
                 binary to every process: builds of different code may exchange records in \
                 different layouts)",
                other.version, self.version
            ));
        }
        if other.threads != self.threads {
            return Some(format!(
                "process {p} runs {} workers, process 0 runs {} (timely needs the same \
                 --workers / run.workers in every process)",
                other.threads, self.threads
            ));
        }
        if other.hosts != self.hosts {
            return Some(format!(
                "process {p} has hosts {:?}, process 0 has {:?} (give every process the same \
                 hostfile)",
                other.hosts, self.hosts
            ));
        }
        let keys: std::collections::BTreeSet<&String> =
            self.parts.keys().chain(other.parts.keys()).collect();
        let differ: Vec<&str> = keys
            .into_iter()
            .filter(|k| self.parts.get(*k) != other.parts.get(*k))
            .map(String::as_str)
            .collect();
        (!differ.is_empty()).then(|| {
            format!(
                "process {p} differs from process 0 in {} (every process of a job needs the \
                 same config and trace)",
                differ.join(", ")
            )
        })
    }
}

/// Why the processes could not agree.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum HandshakeError {
    /// The processes are not one job: the user's to fix.
    #[error("cluster: {0}")]
    Mismatch(String),
    #[error("cluster handshake at {addr}: {reason}")]
    Io { addr: String, reason: String },
}

impl HandshakeError {
    fn io(addr: &str, e: impl std::fmt::Display) -> Self {
        Self::Io {
            addr: addr.to_string(),
            reason: e.to_string(),
        }
    }
}

/// The verdict line process 0 sends back.
#[derive(Debug, Serialize, Deserialize)]
struct Verdict {
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// How long one line may take to arrive once a peer has connected (a
/// stray client that sends nothing is dropped after it).
const LINE_WAIT: Duration = Duration::from_secs(10);

/// Process 0: waits at `addr` for every other process's fingerprint and
/// answers each. Returns when all matched; the first mismatch is answered
/// at once (to that process and to those already waiting) and returned.
/// Connections that send no fingerprint are dropped (a port scan, a
/// health check) and do not count.
pub fn lead(addr: &str, own: &Fingerprint, processes: usize) -> Result<(), HandshakeError> {
    let listener = TcpListener::bind(addr).map_err(|e| HandshakeError::io(addr, e))?;
    let mut waiting: BTreeMap<usize, TcpStream> = BTreeMap::new();
    while waiting.len() + 1 < processes {
        let (stream, _) = listener.accept().map_err(|e| HandshakeError::io(addr, e))?;
        let Some((stream, theirs)) = read_fingerprint(stream) else {
            continue;
        };
        // A process that sent its fingerprint and died (or was restarted)
        // gives its slot to the one asking for it now.
        if waiting.get(&theirs.process).is_some_and(hung_up) {
            tracing::info!(
                process = theirs.process,
                "cluster handshake: process {} reconnected after its first connection closed",
                theirs.process
            );
            waiting.remove(&theirs.process);
        }
        let problem = if theirs.process == 0 || theirs.process >= processes {
            Some(format!(
                "a process says it is process {} of a job of {processes} (cluster.process)",
                theirs.process
            ))
        } else if waiting.contains_key(&theirs.process) {
            Some(format!(
                "two processes say they are process {} (cluster.process)",
                theirs.process
            ))
        } else {
            own.mismatch(&theirs)
        };
        if let Some(problem) = problem {
            let mut stream = stream;
            send(&mut stream, Some(problem.clone()));
            for s in waiting.values_mut() {
                send(s, Some(problem.clone()));
            }
            return Err(HandshakeError::Mismatch(problem));
        }
        waiting.insert(theirs.process, stream);
    }
    // Closed before anyone is told to go on: their timely connects to this
    // address next.
    drop(listener);
    for s in waiting.values_mut() {
        send(s, None);
    }
    Ok(())
}

/// Any other process: sends `own` to process 0 at `leader` (retrying
/// until it listens; the caller's watchdog bounds the wait) and returns
/// its verdict.
pub fn follow(leader: &str, own: &Fingerprint) -> Result<(), HandshakeError> {
    let mut stream = loop {
        match TcpStream::connect(leader) {
            Ok(s) => break s,
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    };
    let mut line = serde_json::to_string(own).map_err(|e| HandshakeError::io(leader, e))?;
    line.push('\n');
    stream
        .write_all(line.as_bytes())
        .map_err(|e| HandshakeError::io(leader, e))?;
    // Process 0 answers once every process has connected: no timeout here.
    let mut reply = String::new();
    BufReader::new(stream)
        .read_line(&mut reply)
        .map_err(|e| HandshakeError::io(leader, e))?;
    if reply.is_empty() {
        return Err(HandshakeError::io(
            leader,
            "process 0 closed the connection without a verdict (see its log)",
        ));
    }
    let verdict: Verdict = serde_json::from_str(&reply).map_err(|e| {
        HandshakeError::io(
            leader,
            format!("not a grflow verdict ({e}): is another program at process 0's address?"),
        )
    })?;
    match verdict.error {
        Some(problem) => Err(HandshakeError::Mismatch(problem)),
        None => Ok(()),
    }
}

/// One fingerprint line from a connected peer, or None (nothing within
/// [`LINE_WAIT`], or not a fingerprint).
fn read_fingerprint(stream: TcpStream) -> Option<(TcpStream, Fingerprint)> {
    stream.set_read_timeout(Some(LINE_WAIT)).ok()?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let fingerprint = serde_json::from_str(&line).ok()?;
    let stream = reader.into_inner();
    stream.set_read_timeout(None).ok()?;
    Some((stream, fingerprint))
}

/// Whether the peer of a waiting connection has closed it (or it broke).
/// A waiting peer sends nothing more, so any readable byte is unexpected
/// and taken as alive.
fn hung_up(stream: &TcpStream) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return true;
    }
    let mut byte = [0u8; 1];
    let closed = match stream.peek(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    };
    closed || stream.set_nonblocking(false).is_err()
}

/// Best effort: a peer that went away learns nothing either way.
fn send(stream: &mut TcpStream, error: Option<String>) {
    if let Ok(mut line) = serde_json::to_string(&Verdict { error }) {
        line.push('\n');
        let _ = stream.write_all(line.as_bytes());
    }
}

/// FNV-1a of a part's settings as JSON (stable across processes: the
/// same build serialises a value the same way).
pub fn digest(value: &impl Serialize) -> u64 {
    let mut d = Digest::default();
    d.json(value);
    d.finish()
}

/// FNV-1a (as `fnv1a64`) over bytes written one piece after another: a
/// part too large to hold as one buffer (the side tables) is digested as
/// it is walked. [`digest`] is one value written as JSON.
#[derive(Clone, Copy, Debug)]
pub struct Digest(u64);

impl Default for Digest {
    fn default() -> Self {
        Self(grflow_connectors::kafka::assign::FNV1A64_BASIS)
    }
}

impl Digest {
    pub fn bytes(&mut self, bytes: &[u8]) {
        self.0 = grflow_connectors::kafka::assign::fnv1a64_extend(self.0, bytes);
    }

    /// `value` as JSON, as [`digest`] writes it.
    pub fn json(&mut self, value: &impl Serialize) {
        // Writing into a digest does not fail; a value that cannot be
        // serialised adds what it wrote before failing, the same in every
        // process.
        let _ = serde_json::to_writer(&mut *self, value);
    }

    pub fn finish(self) -> u64 {
        self.0
    }
}

impl Write for Digest {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.bytes(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fingerprint(process: usize, threads: usize) -> Fingerprint {
        Fingerprint {
            process,
            version: "0.1.0".into(),
            threads,
            hosts: vec!["a:1".into(), "b:2".into()],
            parts: BTreeMap::from([("[memory]".into(), 1), ("[run]".into(), 2)]),
        }
    }

    /// Two builds of one version from different commits (or from
    /// different uncommitted changes) are refused, naming both builds.
    #[test]
    fn builds_of_one_version_from_different_commits_mismatch() {
        let mut zero = fingerprint(0, 2);
        zero.version = "0.1.0 (commit 0123456789ab)".into();
        let mut one = fingerprint(1, 2);
        one.version = "0.1.0 (commit ba9876543210)".into();
        let m = zero.mismatch(&one).expect("different builds mismatch");
        assert!(
            m.contains(
                "process 1 runs grflow 0.1.0 (commit ba9876543210), process 0 runs grflow \
                 0.1.0 (commit 0123456789ab)"
            ),
            "{m}"
        );
        assert!(m.contains("deploy the same grflow binary"), "{m}");
        one.version = "0.1.0 (commit 0123456789ab-dirty.1a2b3c4d)".into();
        assert!(zero.mismatch(&one).unwrap().contains("-dirty.1a2b3c4d"));
        one.version = zero.version.clone();
        assert_eq!(zero.mismatch(&one), None);
        // This build names its version and commit.
        assert!(
            BUILD.starts_with(concat!(env!("CARGO_PKG_VERSION"), " (commit ")),
            "{BUILD}"
        );
        assert!(
            BUILD.ends_with(')') && !BUILD.contains("(commit )"),
            "{BUILD}"
        );
    }

    #[test]
    fn a_mismatch_names_what_differs() {
        let zero = fingerprint(0, 2);
        assert_eq!(zero.mismatch(&fingerprint(1, 2)), None);
        let workers = zero.mismatch(&fingerprint(1, 3)).unwrap();
        assert!(
            workers.contains("process 1 runs 3 workers, process 0 runs 2"),
            "{workers}"
        );
        let mut other = fingerprint(1, 2);
        other.version = "0.2.0".into();
        assert!(zero.mismatch(&other).unwrap().contains("grflow 0.2.0"));
        let mut other = fingerprint(1, 2);
        other.hosts.reverse();
        assert!(zero.mismatch(&other).unwrap().contains("same hostfile"));
        let mut other = fingerprint(1, 2);
        other.parts.insert("[memory]".into(), 9);
        other.parts.insert("trace".into(), 3);
        let parts = zero.mismatch(&other).unwrap();
        assert!(
            parts.contains("process 1 differs from process 0 in [memory], trace ("),
            "{parts}"
        );
        assert!(!parts.contains("[run]"), "{parts}");
    }

    /// Written in pieces or at once, a value digests as `fnv1a64` of its
    /// JSON, as it was before it could be written in pieces.
    #[test]
    fn a_digest_is_fnv1a_of_the_json_however_it_is_written() {
        let value = ("[memory]", 0.25_f64, vec![1_u32, 2, 3]);
        let json = serde_json::to_vec(&value).unwrap();
        let fnv = grflow_connectors::kafka::assign::fnv1a64(&json);
        assert_eq!(digest(&value), fnv);
        let mut pieces = Digest::default();
        for chunk in json.chunks(3) {
            pieces.bytes(chunk);
        }
        assert_eq!(pieces.finish(), fnv);
    }

    fn free_addr() -> String {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    }

    /// Process 0 of a job of `processes`, leading at a free address.
    fn spawn_leader(
        processes: usize,
    ) -> (String, std::thread::JoinHandle<Result<(), HandshakeError>>) {
        let addr = free_addr();
        let leader = {
            let addr = addr.clone();
            std::thread::spawn(move || lead(&addr, &fingerprint(0, 2), processes))
        };
        (addr, leader)
    }

    /// A raw connection to process 0, once it listens.
    fn connect(addr: &str) -> TcpStream {
        loop {
            if let Ok(s) = TcpStream::connect(addr) {
                return s;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Process 0 and `others` over loopback; their results, process 0's
    /// first.
    fn shake(others: Vec<Fingerprint>) -> (String, Vec<Result<(), HandshakeError>>) {
        let (addr, leader) = spawn_leader(others.len() + 1);
        let followers: Vec<_> = others
            .into_iter()
            .map(|f| {
                let addr = addr.clone();
                std::thread::spawn(move || follow(&addr, &f))
            })
            .collect();
        let mut out = vec![leader.join().unwrap()];
        out.extend(followers.into_iter().map(|f| f.join().unwrap()));
        (addr, out)
    }

    #[test]
    fn matching_processes_go_on_and_the_address_is_free_for_timely() {
        let (addr, results) = shake(vec![fingerprint(1, 2), fingerprint(2, 2)]);
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        TcpListener::bind(&addr).expect("process 0's address is free again");
    }

    #[test]
    fn unequal_worker_counts_stop_both_sides_with_the_reason() {
        let (_, results) = shake(vec![fingerprint(1, 3)]);
        for r in &results {
            match r {
                Err(HandshakeError::Mismatch(m)) => {
                    assert!(m.contains("runs 3 workers"), "{m}")
                }
                other => panic!("{other:?}"),
            }
        }
    }

    /// Process 1 sends its fingerprint and dies before the verdict; its
    /// restart takes the slot instead of being refused as a duplicate. A
    /// live duplicate is still refused.
    #[test]
    fn a_restarted_process_takes_its_dead_predecessors_slot() {
        let (addr, leader) = spawn_leader(3);
        let first = connect(&addr);
        writeln!(
            &first,
            "{}",
            serde_json::to_string(&fingerprint(1, 2)).unwrap()
        )
        .unwrap();
        // Let process 0 take the line before the process dies.
        std::thread::sleep(Duration::from_millis(200));
        drop(first);
        std::thread::sleep(Duration::from_millis(100));
        let restarted = {
            let addr = addr.clone();
            std::thread::spawn(move || follow(&addr, &fingerprint(1, 2)))
        };
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            !leader.is_finished(),
            "process 0 gave up: {:?}",
            leader.join().unwrap()
        );
        follow(&addr, &fingerprint(2, 2)).unwrap();
        restarted.join().unwrap().unwrap();
        leader.join().unwrap().unwrap();

        // Two live processes claiming process 1: refused.
        let (_, results) = shake(vec![fingerprint(1, 2), fingerprint(1, 2)]);
        assert!(
            results.iter().any(|r| matches!(r,
                Err(HandshakeError::Mismatch(m)) if m.contains("two processes say they are process 1"))),
            "{results:?}"
        );
    }

    #[test]
    fn a_stray_connection_is_ignored_and_a_bad_process_index_refused() {
        let (addr, leader) = spawn_leader(2);
        // A client that sends something else first (a health check).
        let stray = connect(&addr);
        writeln!(&stray, "GET / HTTP/1.1").unwrap();
        drop(stray);
        let err = follow(&addr, &fingerprint(5, 2)).unwrap_err();
        assert!(
            matches!(&err, HandshakeError::Mismatch(m) if m.contains("process 5 of a job of 2")),
            "{err:?}"
        );
        assert!(leader.join().unwrap().is_err());
    }
}

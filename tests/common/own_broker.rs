//! A tansu of the test's own (tansu on PATH, as scripts/test.sh installs
//! it), for tests that put something between it and the clients or stop it.

#![allow(dead_code)] // each test binary uses a different part

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Whether tansu can be started; says why not on stderr (the test then
/// passes without running).
pub fn tansu_available(test: &str) -> bool {
    let found = Command::new("tansu").arg("--version").output().is_ok();
    if !found {
        eprintln!("skipping {test}: no tansu on PATH (scripts/test.sh installs it)");
    }
    found
}

/// The test's tansu, killed (SIGKILL, which a stopped process obeys too) on drop.
pub struct Broker(pub Child);

impl Broker {
    /// tansu listening on `port`, telling clients it is at `advertised`
    /// (a proxy's port, or `port` itself), memory storage; returns once it
    /// listens.
    pub fn start(port: u16, advertised: u16, dir: &Path) -> Self {
        let child = Command::new("tansu")
            .args(["broker", "--listener-url"])
            .arg(format!("tcp://127.0.0.1:{port}"))
            .arg("--advertised-listener-url")
            .arg(format!("tcp://127.0.0.1:{advertised}"))
            .args(["--storage-engine", "memory://tansu/"])
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn tansu");
        let broker = Self(child);
        assert!(
            super::http::wait_listening(&format!("127.0.0.1:{port}"), Duration::from_secs(20)),
            "tansu did not listen on {port}"
        );
        broker
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A serve config whose job creates its topics (`{tag}.requests`, ...),
/// with a 100-request generated trace and `kafka_extra` lines in [kafka].
pub fn config_creating_topics(dir: &Path, name: &str, tag: &str, kafka_extra: &str) -> PathBuf {
    let text = format!(
        r#"
[run]
workers = 2

[trace]
users = 500
items = 5000
requests = 100

[kafka]
request_topic = "{tag}.requests"
response_topic = "{tag}.responses"
dead_letter_topic = "{tag}.dead-letters"
group_id = "{tag}.group"
create_partitions = 2
refetch_from_start = true
commit_interval_ms = 200
{kafka_extra}
"#
    );
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

//! A tansu of the test's own (tansu on PATH, as scripts/test.sh installs
//! it), for tests that put something between it and the clients or stop it.

#![allow(dead_code)] // each test binary uses a different part

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::kafka::{Serve, Topics};
use std::time::Duration;

/// Whether tansu can be started; says why not where `cargo test` shows it
/// (the test then passes without running).
pub fn tansu_available(test: &str) -> bool {
    let found = Command::new("tansu").arg("--version").output().is_ok();
    if !found {
        super::skip::skip(test, "no tansu on PATH (scripts/test.sh installs it)");
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

/// A serve config whose job creates its topics (`{tag}.requests`, ...,
/// two partitions each), with a 100-request generated trace and
/// `kafka_extra` lines in [kafka].
pub fn config_creating_topics(dir: &Path, name: &str, tag: &str, kafka_extra: &str) -> PathBuf {
    super::kafka::write_config_as(dir, name, &Topics::named(tag), 2, kafka_extra)
}

/// `grflow ARGS --config CONFIG --brokers BROKERS` with `env` set.
pub fn grflow(args: &[&str], config: &Path, brokers: &str, env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_grflow"));
    cmd.args(args)
        .arg("--config")
        .arg(config)
        .args(["--brokers", brokers])
        .envs(env.iter().copied());
    cmd
}

/// The stderr of `grflow send` with `config`, which must fail: what a
/// client refused by the broker (or the proxy) says.
pub fn refused_send(config: &Path, brokers: &str, env: &[(&str, &str)]) -> String {
    let out = grflow(&["send", "--speed", "max"], config, brokers, env)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "went through: {err}");
    err
}

/// Runs `grflow serve` with `config` (a job that creates its topics, see
/// [`config_creating_topics`]; its output beside `config`), sends its 100-request trace with `grflow
/// send --answers` once the topics exist, calls `between` while the job
/// still runs, then stops the job (SIGTERM). Asserts every request was
/// answered and counted by the job.
pub fn serve_and_send_all(
    config: &Path,
    brokers: &str,
    env: &[(&str, &str)],
    between: impl FnOnce(),
) {
    let serve = Serve::start_env(brokers, config, "serve", &["--metrics-addr", "none"], env);
    let send = [
        "send",
        "--speed",
        "max",
        "--answers",
        "--json",
        "--wait-s",
        "60",
    ];
    // serve creates the topics; send is refused until they exist.
    let mut sent = None;
    for _ in 0..60 {
        let out = grflow(&send, config, brokers, env).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        if out.status.code() == Some(2) && err.contains("does not exist") {
            std::thread::sleep(Duration::from_millis(500));
            continue;
        }
        sent = Some(out);
        break;
    }
    let out = sent.expect("serve created its topics within 30 s");
    assert!(
        out.status.success(),
        "{}\n{}\nserve:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        serve.stderr_text()
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["sent"], 100, "{report}");
    assert_eq!(report["answers"]["answered"], 100, "{report}");
    assert_eq!(report["answers"]["served"], 100, "{report}");
    between();
    let summary = serve.stop();
    assert_eq!(summary["requests_in"], 100, "{summary}");
}

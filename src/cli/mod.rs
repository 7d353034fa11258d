//! One file per subcommand.

pub mod bench_allocator;
pub mod bench_cache;
pub mod bench_cluster;
pub mod bench_kafka;
pub mod bench_kernels;
pub mod bench_memory;
pub mod bench_serve;
pub mod calibrate;
pub mod eval;
pub mod gen_trace;
pub mod import;
pub mod replay;
pub mod send;
pub mod serve;
pub mod train;
pub mod train_allocator;

/// The user's input (a file, a flag, a config) is wrong: exit code 2.
/// Wrap library errors that are the user's to fix in this.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct InputError(pub String);

impl InputError {
    pub fn from_display(e: impl std::fmt::Display) -> anyhow::Error {
        anyhow::Error::new(InputError(e.to_string()))
    }
}

/// A signal stopped the command after it wrote what it had: exit code
/// 128 + the signal, as a shell reports a command a signal ended, so that a
/// script can tell a partial run from a whole one. Nothing more is printed.
#[derive(Debug, thiserror::Error)]
#[error("stopped by signal {0}")]
pub struct StoppedBySignal(pub i32);

impl StoppedBySignal {
    pub fn exit_code(&self) -> u8 {
        u8::try_from(128 + self.0).unwrap_or(1)
    }

    /// What a command returns once it has written its results: `Ok` for a
    /// whole run, this error (exit 128 + the signal) for one `stop` cut short.
    pub fn check(stop: &grflow_pipeline::StopRequest) -> anyhow::Result<()> {
        match stop.requested() {
            true => Err(StoppedBySignal(i32::try_from(stop.signal()).unwrap_or(0)).into()),
            false => Ok(()),
        }
    }
}

/// Asks `stop` to end the job on the first SIGINT or SIGTERM; a second
/// one exits at once with 128 + the signal (what `replay` wrote so far is
/// in OUT/responses.parquet.partial), unless it is the first passed on
/// again within 200 ms (GNU `timeout` sends it twice).
pub(crate) fn stop_on_signals(stop: &grflow_pipeline::StopRequest) -> anyhow::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    grflow_pipeline::on_signals(
        &[SIGINT, SIGTERM],
        stop.flag.clone(),
        Some(stop.signal.clone()),
        |signal| 128 + signal,
    )?;
    Ok(())
}

/// Where `serve` and `send` look for their config without `--config`.
pub(crate) const KAFKA_CONFIG: &str = "configs/kafka.toml";

/// The config and brokers of a Kafka job, as `serve` and `send` take them.
#[derive(clap::Args, Debug)]
pub struct KafkaArgs {
    /// TOML config with a `[kafka]` section. Default: configs/kafka.toml from
    /// this directory, else the copy built into grflow.
    #[arg(long)]
    pub config: Option<std::path::PathBuf>,
    /// bootstrap.servers; overrides kafka.brokers and GRFLOW_KAFKA_BROKERS.
    #[arg(long)]
    pub brokers: Option<String>,
}

impl KafkaArgs {
    /// The config file [`KafkaArgs::load`] reads, if a file.
    pub fn config_path(&self) -> Option<std::path::PathBuf> {
        match &self.config {
            Some(p) => Some(p.clone()),
            None => {
                let default = std::path::Path::new(KAFKA_CONFIG);
                default.exists().then(|| default.to_path_buf())
            }
        }
    }

    /// `--config`, else configs/kafka.toml from the current directory, else
    /// the copy built into the binary (said on stderr), so that an
    /// installed binary runs anywhere. The brokers come from `--brokers`,
    /// else GRFLOW_KAFKA_BROKERS, else `kafka.brokers`.
    pub fn load(&self) -> anyhow::Result<grflow_pipeline::Config> {
        let mut config = match self.config_path() {
            Some(p) => grflow_pipeline::Config::load(&p).map_err(InputError::from_display)?,
            None => {
                eprintln!(
                    "note: no {KAFKA_CONFIG} in this directory: using the copy built into \
                     grflow (--config FILE for another)"
                );
                grflow_pipeline::Config::embedded_kafka()
            }
        };
        if let Ok(b) = std::env::var("GRFLOW_KAFKA_BROKERS")
            && !b.trim().is_empty()
        {
            config.kafka.brokers = b;
        }
        if let Some(b) = &self.brokers {
            // Past the config's own check, which refuses an empty list.
            if b.trim().is_empty() {
                return Err(InputError::from_display("--brokers must not be empty"));
            }
            config.kafka.brokers = b.clone();
        }
        Ok(config)
    }
}

/// A setup error about the node parameters, naming the config file they
/// came from (where they came from a file): with several configs at hand
/// the key alone does not say which file to change. Trace metadata and a
/// calibration run at start are not the file's.
pub(crate) fn params_error(
    e: grflow_pipeline::params::ParamsError,
    config: Option<&std::path::Path>,
) -> anyhow::Error {
    use grflow_pipeline::params::ParamsError;
    match (config, &e) {
        (_, ParamsError::Tables { .. } | ParamsError::Calibrate { .. }) | (None, _) => {
            InputError::from_display(e)
        }
        (Some(path), _) => InputError::from_display(format!("{}: {e}", path.display())),
    }
}

/// Checks `--out DIR` before a bench measures anything: creates it and
/// writes a probe file there, so that a regular file or an unwritable path
/// is an input error (exit 2) naming `--out` instead of a failure after
/// the whole run.
pub(crate) fn check_out_dir(dir: &std::path::Path) -> anyhow::Result<()> {
    if dir.exists() && !dir.is_dir() {
        return Err(InputError::from_display(format!(
            "--out {}: exists and is not a directory",
            dir.display()
        )));
    }
    std::fs::create_dir_all(dir).map_err(|e| {
        InputError::from_display(format!(
            "--out {}: cannot create the directory: {e}",
            dir.display()
        ))
    })?;
    probe_write(dir).map_err(|e| {
        InputError::from_display(format!("--out {}: cannot write there: {e}", dir.display()))
    })
}

/// An `--out` directory a command made for its run (with any parents it
/// made): removed again when dropped before [`OutDir::keep`], so that a
/// command that fails leaves no empty or half-written directory behind. A
/// directory that was there before is never removed.
#[must_use = "dropping it removes the directory it made"]
pub(crate) struct OutDir {
    /// The outermost directory this run made; `None` once kept, or when
    /// `--out` was there already.
    made: Option<std::path::PathBuf>,
}

impl OutDir {
    /// [`check_out_dir`], remembering what it creates.
    pub(crate) fn create(dir: &std::path::Path) -> anyhow::Result<Self> {
        // Nothing at all at the path, not even a dangling link (removing a
        // link would remove what was there).
        let absent = |p: &std::path::Path| {
            p.symlink_metadata()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
        };
        let made = dir
            .ancestors()
            .take_while(|p| !p.as_os_str().is_empty() && absent(p))
            .last()
            .map(std::path::Path::to_path_buf);
        // Made before the check, so that a check that fails half-way (a
        // parent made, the probe refused) also cleans up.
        let out = Self { made };
        check_out_dir(dir)?;
        Ok(out)
    }

    /// The run succeeded (or left something worth keeping): the directory
    /// stays.
    pub(crate) fn keep(mut self) {
        self.made = None;
    }
}

impl Drop for OutDir {
    fn drop(&mut self) {
        if let Some(dir) = self.made.take() {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

/// Creates and removes a probe file in `dir`: whether a file can be
/// written there.
fn probe_write(dir: &std::path::Path) -> std::io::Result<()> {
    let probe = dir.join(format!(".grflow-write-check-{}", std::process::id()));
    std::fs::write(&probe, b"")?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// Checks `--out FILE` before a command works for minutes (calibrating,
/// training): not a directory, in a directory that exists and takes a
/// file, not named like a trace's own files (a policy written over
/// requests.parquet destroyed the trace), and not a file that is there
/// already unless `force` (what it holds took as long to make, and may
/// have been edited since; `train` keeps a model the same way). Exit 2,
/// naming `--out`.
pub(crate) fn check_out_file(path: &std::path::Path, force: bool) -> anyhow::Result<()> {
    let bad = |why: String| InputError::from_display(format!("--out {}: {why}", path.display()));
    if path.is_dir() {
        return Err(bad("is a directory; name the file to write".into()));
    }
    if !force && path.symlink_metadata().is_ok() {
        return Err(bad(
            "already exists; pass --force to replace it, or name another file".into(),
        ));
    }
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if [
        grflow_traces::columnar::REQUESTS_FILE,
        grflow_traces::columnar::USERS_FILE,
        grflow_traces::columnar::ITEMS_FILE,
    ]
    .contains(&name)
    {
        return Err(bad("is a trace file's name; pick another".into()));
    }
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    if !parent.is_dir() {
        return Err(bad(format!(
            "its directory {} does not exist",
            parent.display()
        )));
    }
    probe_write(parent).map_err(|e| bad(format!("cannot write there: {e}")))
}

/// The most threads a count flag (`--workers`, `--jobs`, `--threads`) may
/// ask for: `run.workers`' bound, since a worker is a thread and a serving
/// node with its own page pool. `--workers 100000` failed deep in the run
/// (a pool or thread that could not be had, a panic in timely).
pub(crate) const MAX_THREADS: usize = grflow_pipeline::config::MAX_WORKERS;

/// `node.lanes`' bound in the config's validation, for `--lanes`.
pub(crate) const MAX_LANES: usize = grflow_pipeline::config::MAX_LANES;

/// `value` of the count flag `flag` is in 1..=`max`: exit 2, naming it.
pub(crate) fn check_count(flag: &str, value: usize, max: usize) -> Result<(), InputError> {
    if (1..=max).contains(&value) {
        Ok(())
    } else {
        Err(InputError(format!(
            "{flag} must be at least 1 and at most {max} (got {value})"
        )))
    }
}

/// A cost model from `--calibration` that cannot be used: named by the
/// flag, not by `cost.calibration` (which the flag set). Other errors as
/// they are, all the user's input (exit 2).
pub(crate) fn calibration_flag_error(e: grflow_pipeline::params::ParamsError) -> anyhow::Error {
    match e {
        grflow_pipeline::params::ParamsError::Calibration { path, reason } => {
            InputError::from_display(format!("--calibration {path}: {reason}"))
        }
        other => InputError::from_display(other),
    }
}

/// `--hostfile FILE --process I`: timely's cluster mode from grflow's own
/// flags (they override the `[cluster]` section).
#[derive(clap::Args, Debug, Default)]
pub struct ClusterArgs {
    /// One host:port per line, one line per process (process 0 first);
    /// every process of the job gets the same file. Overrides cluster.hostfile.
    #[arg(long)]
    pub hostfile: Option<std::path::PathBuf>,
    /// This process's line in the hostfile (0-based); overrides cluster.process.
    #[arg(long)]
    pub process: Option<usize>,
}

impl ClusterArgs {
    pub fn apply(&self, config: &mut grflow_pipeline::Config) -> anyhow::Result<()> {
        if let Some(h) = &self.hostfile {
            config.cluster.hostfile = Some(h.clone());
        }
        if let Some(p) = self.process {
            config.cluster.process = p;
        }
        // Check now, so that a bad hostfile is an input error (exit 2).
        config
            .cluster
            .resolve(config.run.workers)
            .map_err(|e| InputError::from_display(self.name_flags(e)))?;
        Ok(())
    }

    /// `e`, naming `--hostfile` or `--process` where the value at fault
    /// came from the flag rather than the `[cluster]` key.
    fn name_flags(&self, e: grflow_pipeline::cluster::ClusterError) -> String {
        use grflow_pipeline::cluster::{ClusterError, HostAt};
        // A line of the file `--hostfile` gave (it replaced the key's).
        let flag_line = |at: &HostAt| match at {
            HostAt::Hostfile { path, line } if self.hostfile.is_some() => {
                Some(format!("--hostfile {path} line {line}"))
            }
            _ => None,
        };
        match e {
            ClusterError::Hostfile { path, reason } if self.hostfile.is_some() => {
                format!("--hostfile {path}: {reason}")
            }
            ClusterError::BadHost { ref at, ref host } if let Some(at) = flag_line(at) => {
                format!("{at} = {host:?}: expected host:port")
            }
            ClusterError::Duplicate { ref at, ref host } if let Some(at) = flag_line(at) => {
                format!("{at} = {host:?} appears twice")
            }
            ClusterError::ProcessOutOfRange { process, hosts } if self.process.is_some() => {
                format!("--process {process}: there are only {hosts} hosts (0..{hosts})")
            }
            other => other.to_string(),
        }
    }
}

/// Starts the metrics/health endpoints: at `given` (which must bind), else
/// at `default` if any (skipped with a warning when taken, so that two jobs
/// on one machine both run). The server stops when the result is dropped.
pub fn start_ops(
    given: Option<&str>,
    default: Option<&str>,
) -> anyhow::Result<Option<grflow_pipeline::ops::OpsServer>> {
    use grflow_pipeline::ops::{OpsServer, state};
    let server = match (given, default) {
        (Some(addr), _) => {
            OpsServer::start(addr, state().clone()).map_err(InputError::from_display)?
        }
        (None, Some(addr)) => match OpsServer::start(addr, state().clone()) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("{e}; running without metrics and health endpoints");
                None
            }
        },
        (None, None) => None,
    };
    if let Some(s) = &server {
        eprintln!(
            "metrics and health: http://{}/metrics /healthz /readyz /status",
            s.local_addr()
        );
    }
    Ok(server)
}

/// Logs to stderr at `GRFLOW_LOG`, or at `default_level` when it is unset;
/// one JSON object per line with `GRFLOW_LOG_FORMAT=json` (for a log
/// shipper), else text, coloured only on a terminal (not in a log file or
/// a journal, and never with `NO_COLOR` set).
pub fn init_tracing(default_level: &str) {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let filter =
        EnvFilter::try_from_env("GRFLOW_LOG").unwrap_or_else(|_| EnvFilter::new(default_level));
    let json = std::env::var("GRFLOW_LOG_FORMAT").is_ok_and(|f| f.eq_ignore_ascii_case("json"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none());
    let _ = if json {
        builder.json().with_current_span(false).try_init()
    } else {
        builder.try_init()
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bad line of the file `--hostfile` gave is named by the flag; the
    /// same line of the config's `cluster.hostfile`, by the key.
    #[test]
    fn a_hostfile_line_is_named_by_where_the_file_came_from() {
        use grflow_pipeline::cluster::{ClusterError, HostAt};
        let at = || HostAt::Hostfile {
            path: "h.txt".into(),
            line: 2,
        };
        let flag = ClusterArgs {
            hostfile: Some("h.txt".into()),
            process: None,
        };
        let bad = || ClusterError::BadHost {
            at: at(),
            host: "x".into(),
        };
        let twice = || ClusterError::Duplicate {
            at: at(),
            host: "a:1".into(),
        };
        assert_eq!(
            flag.name_flags(bad()),
            "--hostfile h.txt line 2 = \"x\": expected host:port"
        );
        assert_eq!(
            flag.name_flags(twice()),
            "--hostfile h.txt line 2 = \"a:1\" appears twice"
        );
        let key = ClusterArgs::default();
        assert_eq!(
            key.name_flags(bad()),
            "cluster.hostfile h.txt line 2 = \"x\": expected host:port"
        );
        assert_eq!(
            key.name_flags(twice()),
            "cluster.hostfile h.txt line 2 = \"a:1\" appears twice"
        );
        // `cluster.hosts` is never the flag's.
        let listed = ClusterError::BadHost {
            at: HostAt::Hosts { index: 1 },
            host: "x".into(),
        };
        assert_eq!(
            flag.name_flags(listed),
            "cluster.hosts[1] = \"x\": expected host:port"
        );
    }

    #[test]
    fn out_dir_removes_what_it_made_and_only_that() {
        let base = std::env::temp_dir().join(format!("grflow-outdir-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        // Made with a parent, then dropped: both gone, `base` stays.
        let nested = base.join("a").join("b");
        let out = OutDir::create(&nested).unwrap();
        std::fs::write(nested.join("partial"), "x").unwrap();
        drop(out);
        assert!(!base.join("a").exists() && base.is_dir());
        // Kept: stays.
        OutDir::create(&nested).unwrap().keep();
        assert!(nested.is_dir());
        // There before: stays, with what it held.
        std::fs::write(nested.join("earlier"), "x").unwrap();
        drop(OutDir::create(&nested).unwrap());
        assert!(nested.join("earlier").is_file());
        std::fs::remove_dir_all(&base).unwrap();
    }
}

//! Setup errors reach the caller typed, not flattened into text: the
//! binary matches on the variant (and its fields) to name the flag that
//! set the value at fault, and to give exit code 2 for the user's input.

use grflow_pipeline::admin::AdminError;
use grflow_pipeline::cluster::{ClusterError, HostAt};
use grflow_pipeline::params::ParamsError;
use grflow_pipeline::{
    Config, ReplayError, ReplayOptions, ServeError, ServeOptions, TraceInput, check_serve, replay,
};

/// An `--admin-addr` the endpoint cannot start on is `ServeError::Admin`,
/// refused before the broker is asked anything (none listens here).
#[test]
fn a_bad_admin_addr_is_a_typed_admin_error() {
    let mut opts = ServeOptions::new(Config::embedded_kafka());
    opts.config.kafka.brokers = "127.0.0.1:1".into();
    opts.admin_addr = Some("localhost:9465".into());
    let e = check_serve(&opts).unwrap_err();
    assert!(
        matches!(&e, ServeError::Admin(AdminError::Addr(a)) if a == "localhost:9465"),
        "{e:?}"
    );
    // Its own message, which names the flag, and no "config: " before it.
    assert_eq!(
        e.to_string(),
        "--admin-addr \"localhost:9465\": not HOST:PORT"
    );
}

/// A small generated trace of the embedded config's catalog.
fn small_trace(cfg: &Config) -> std::sync::Arc<grflow_traces::Trace> {
    let mut g = cfg.trace.gen_config().unwrap();
    g.requests = 20;
    std::sync::Arc::new(grflow_traces::generate(&g))
}

/// A model directory that cannot be loaded is `ReplayError::Params`
/// (`ParamsError::Weights`, naming the file), not text that says
/// `model.weights: ...`.
#[test]
fn a_model_that_cannot_be_loaded_is_a_typed_params_error() {
    let dir = std::env::temp_dir().join(format!("grflow-setup-errors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut cfg = Config::embedded();
    cfg.model.weights = Some(dir.clone());
    let trace = small_trace(&cfg);
    let e = replay(ReplayOptions::new(TraceInput::Memory(trace), cfg)).unwrap_err();
    std::fs::remove_dir_all(&dir).unwrap();
    match &e {
        ReplayError::Params(ParamsError::Weights(w)) => assert!(w.path.starts_with(&dir), "{w}"),
        other => panic!("{other:?}"),
    }
    assert!(e.is_input());
    assert!(e.to_string().starts_with("model.weights: "), "{e}");
}

/// A bad `[cluster]` section is `ReplayError::Cluster`, with its position.
#[test]
fn a_bad_cluster_section_is_a_typed_cluster_error() {
    let mut cfg = Config::embedded();
    cfg.cluster.hosts = vec!["127.0.0.1:1".into(), "nowhere".into()];
    let trace = small_trace(&cfg);
    let e = replay(ReplayOptions::new(TraceInput::Memory(trace), cfg)).unwrap_err();
    assert!(
        matches!(
            &e,
            ReplayError::Cluster(ClusterError::BadHost {
                at: HostAt::Hosts { index: 1 },
                host,
            }) if host == "nowhere"
        ),
        "{e:?}"
    );
    assert!(e.is_input());
}

/// `serve` (here its check) reports the model the same way, before it
/// asks the broker anything (none listens here).
#[test]
fn serve_reports_a_model_that_cannot_be_loaded_typed() {
    let dir = std::env::temp_dir().join(format!("grflow-setup-serve-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut opts = ServeOptions::new(Config::embedded_kafka());
    opts.config.kafka.brokers = "127.0.0.1:1".into();
    opts.config.model.weights = Some(dir.clone());
    let e = check_serve(&opts).unwrap_err();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        matches!(&e, ServeError::Params(ParamsError::Weights(_))),
        "{e:?}"
    );
    assert!(e.to_string().starts_with("config: model.weights: "), "{e}");
}

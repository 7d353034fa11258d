//! `grflow serve --check`: everything a start checks, without serving. The
//! config is validated, the side tables and the model are loaded, every
//! topic is looked up, this process's partitions are opened as a start
//! would open them (where each resumes), the response topic is scanned as
//! at a restart, and `windows.out` is opened; nothing is consumed,
//! committed, created or produced. For a deploy pipeline: a broker, ACL,
//! TLS or topic problem, a bad model path or a bad key fails here, with the
//! same message the job would give, instead of at the rollout.

use std::time::Instant;

use serde::Serialize;

use grflow_connectors::kafka::{KafkaClientError, KafkaSettings, partition_count, scan_answers};

use super::{
    CALL_TIMEOUT, ServeError, ServeOptions, check_before_start, check_dead_letter_topic,
    open_request_consumer,
};
use crate::job::Job;

/// What `--check` found; printed as JSON.
#[derive(Debug, Serialize)]
pub struct CheckReport {
    pub ok: bool,
    pub brokers: String,
    pub group_id: String,
    pub model_version: String,
    /// Nodes of the whole job, and this process's index among its processes.
    pub workers: usize,
    pub process: usize,
    pub request_topic: TopicCheck,
    pub response_topic: TopicCheck,
    pub dead_letter_topic: TopicCheck,
    /// Where each of this process's request partitions would resume.
    pub resume: Vec<ResumeCheck>,
    /// Requests the response topic already answers (the restart scan).
    pub already_answered: Option<usize>,
    pub windows_out: String,
    pub kafka_features: String,
    pub check_s: f64,
}

#[derive(Debug, Serialize)]
pub struct TopicCheck {
    pub name: String,
    /// `None`: missing, and a start would create it (`kafka.create_partitions`).
    pub partitions: Option<i32>,
}

#[derive(Debug, Serialize)]
pub struct ResumeCheck {
    pub partition: i32,
    pub offset: i64,
    /// From the group's committed offset (else the `kafka.start` position).
    pub from_commit: bool,
    /// A committed offset past the log's end, ignored (see `Resumed`).
    pub committed_past_end: Option<i64>,
}

/// A topic's partitions, or `None` when it is missing and a start would
/// create it.
fn topic(
    settings: &KafkaSettings,
    name: &str,
    creates: bool,
) -> Result<TopicCheck, KafkaClientError> {
    let partitions = match partition_count(settings, name, CALL_TIMEOUT) {
        Ok(n) => Some(n),
        Err(KafkaClientError::NoSuchTopic { .. }) if creates => None,
        Err(e) => return Err(e),
    };
    Ok(TopicCheck {
        name: name.to_string(),
        partitions,
    })
}

/// Runs every start-up check of [`super::serve`] without serving.
pub fn check(opts: &ServeOptions) -> Result<CheckReport, ServeError> {
    let started = Instant::now();
    check_before_start(opts)?;
    let cfg = opts.config.clone();
    let k = cfg.kafka.clone();
    let settings = opts.settings();
    let job = Job::prepare(cfg.clone(), super::side_tables(&cfg)?)?;
    let topo = job.topology();
    let creates = k.create_partitions > 0;
    let request_topic = topic(&settings, &k.request_topic, creates)?;
    let response_topic = topic(&settings, &k.response_topic, creates)?;
    let dead_letter_topic = if creates {
        topic(&settings, &k.dead_letter_topic, true)?
    } else {
        TopicCheck {
            name: k.dead_letter_topic.clone(),
            partitions: Some(check_dead_letter_topic(&settings, &k.dead_letter_topic)?),
        }
    };
    let mut resume = Vec::new();
    if let Some(partitions) = request_topic.partitions {
        for w in topo.local_workers() {
            // Opened as a start opens it (assign mode, committed offsets
            // read), then closed without a poll or a commit.
            let (_consumer, resumed) =
                open_request_consumer(&settings, &k, partitions, w, topo.total())?;
            resume.extend(resumed.iter().map(|r| ResumeCheck {
                partition: r.partition,
                offset: r.offset,
                from_commit: r.from_commit,
                committed_past_end: r.past_end,
            }));
        }
    }
    resume.sort_by_key(|r| r.partition);
    let already_answered = match response_topic.partitions {
        Some(_) => Some(
            scan_answers(
                &settings,
                &k.response_topic,
                &k.request_topic,
                k.restart_scan,
                CALL_TIMEOUT,
            )?
            .len(),
        ),
        None => None,
    };
    check_windows_out(&cfg.windows.out)?;
    Ok(CheckReport {
        ok: true,
        brokers: settings.brokers.clone(),
        group_id: settings.group_id.clone(),
        model_version: job.model_version.clone(),
        workers: topo.total(),
        process: topo.process,
        request_topic,
        response_topic,
        dead_letter_topic,
        resume,
        already_answered,
        windows_out: cfg.windows.out.clone(),
        kafka_features: grflow_connectors::kafka::builtin_features(),
        check_s: started.elapsed().as_secs_f64(),
    })
}

/// `windows.out` can be appended to; a file the check had to create is
/// removed again.
fn check_windows_out(out: &str) -> Result<(), ServeError> {
    if out == "none" || out == "stderr" {
        return Ok(());
    }
    let path = std::path::Path::new(out);
    let existed = path.exists();
    crate::window_log::WindowLog::open(out).map_err(ServeError::Config)?;
    if !existed {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

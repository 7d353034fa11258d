//! librdkafka's own log lines and global errors, rate-limited. While a
//! broker is away every client repeats the same few lines (`AllBrokersDown`,
//! a `FAIL` per connection attempt) every second or two for as long as the
//! outage lasts; a job that runs for months logs the first of each kind at
//! once and then at most one per [`EVERY`], with how many it left out.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;

use super::ratelimit::KeyedLogLimiter;

/// At most one line of a kind per this.
pub const EVERY: Duration = Duration::from_secs(30);

/// One limiter for every client of the process: during an outage each
/// consumer and the producer report the same failures.
pub static CLIENT_LOGS: std::sync::LazyLock<ClientLogs> =
    std::sync::LazyLock::new(ClientLogs::default);

#[derive(Debug)]
pub struct ClientLogs {
    limiter: Mutex<KeyedLogLimiter>,
}

impl Default for ClientLogs {
    fn default() -> Self {
        Self {
            limiter: Mutex::new(KeyedLogLimiter::new(EVERY)),
        }
    }
}

impl ClientLogs {
    fn admit(&self, kind: &str) -> Option<u64> {
        self.limiter
            .lock()
            .expect("client log limiter lock")
            .admit(kind, Instant::now())
    }

    /// librdkafka's log callback: a kind is the level, facility (`FAIL`,
    /// `CONFWARN`, ...) and the message without its numbers, so distinct
    /// warnings (each config warning at start) all show while a reconnect
    /// failure repeated with new timings and counts is one kind.
    pub fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        let Some(suppressed) = self.admit(&kind(&format!("{level:?} {fac} {message}"))) else {
            return;
        };
        let more = more(suppressed);
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => {
                tracing::error!(target: "librdkafka", "librdkafka: {fac} {message}{more}")
            }
            RDKafkaLogLevel::Warning => {
                tracing::warn!(target: "librdkafka", "librdkafka: {fac} {message}{more}")
            }
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(target: "librdkafka", "librdkafka: {fac} {message}{more}")
            }
            RDKafkaLogLevel::Debug => {
                tracing::debug!(target: "librdkafka", "librdkafka: {fac} {message}{more}")
            }
        }
    }

    /// librdkafka's global error callback: a kind is the error and its
    /// reason without their numbers.
    pub fn error(&self, error: &KafkaError, reason: &str) {
        if let Some(suppressed) = self.admit(&kind(&format!("{error}: {reason}"))) {
            tracing::error!(target: "librdkafka", "librdkafka: {error}: {reason}{}", more(suppressed));
        }
    }
}

/// Implements `ClientContext` for a client's context type so that its
/// librdkafka log lines and global errors go through [`CLIENT_LOGS`]: every
/// client of the job is rate-limited alike.
macro_rules! logged_client_context {
    ($context:ty) => {
        impl rdkafka::ClientContext for $context {
            fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
                $crate::kafka::client_logs::CLIENT_LOGS.log(level, fac, message);
            }

            fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
                $crate::kafka::client_logs::CLIENT_LOGS.error(&error, reason);
            }
        }
    };
}
pub(crate) use logged_client_context;

/// The context of a client with no callbacks of its own (metadata probes,
/// admin calls, the restart scan): only its logs, through [`CLIENT_LOGS`].
#[derive(Clone, Copy, Debug, Default)]
pub struct LoggedContext;

logged_client_context!(LoggedContext);

impl rdkafka::consumer::ConsumerContext for LoggedContext {}

/// A line's kind: the line without its digits ("2/2 brokers are down" and
/// "0/2 brokers are down", "after 10932ms" and "after 11428ms" are alike).
fn kind(line: &str) -> String {
    line.chars().filter(|c| !c.is_ascii_digit()).collect()
}

/// The tail of a line that stands for others left out.
pub fn more(suppressed: u64) -> String {
    match suppressed {
        0 => String::new(),
        n => format!(
            " ({n} more like it in the last {} s not logged)",
            EVERY.as_secs()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_kind_is_logged_once_per_interval() {
        let logs = ClientLogs::default();
        assert_eq!(logs.admit("Error FAIL"), Some(0));
        assert_eq!(logs.admit("Error FAIL"), None);
        assert_eq!(logs.admit("Warning REQTMOUT"), Some(0));
        assert_eq!(
            kind("Error FAIL 127.0.0.1:19194/bootstrap: refused (after 0ms)"),
            kind("Error FAIL 127.0.0.1:19194/bootstrap: refused (after 12ms)")
        );
        assert_ne!(
            kind("Warning CONFWARN Configuration property a is ignored"),
            kind("Warning CONFWARN Configuration property b is ignored")
        );
        assert_eq!(more(0), "");
        assert_eq!(more(3), " (3 more like it in the last 30 s not logged)");
    }
}

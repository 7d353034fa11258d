//! `grflow serve`'s sink for closed windows: one JSON line per (node,
//! window) to stderr or a file, as each window closes, so a job that runs for
//! months keeps none of them.
//!
//! A file is opened for appending, so `logrotate`'s `copytruncate` works, and
//! is reopened when its path no longer names the open file (rotated by
//! renaming, or deleted), so the default `create` rotation works as well.
//!
//! A write that fails (a full disk) loses its windows, not the job: they
//! are counted (`windows_lost`), the failure is logged at once and then at
//! most every 30 s, and the first write that succeeds again says how many
//! were lost and starts on a fresh line, so a half-written line stays one
//! bad line instead of merging with the next.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use grflow_connectors::kafka::ratelimit::LogLimiter;

use crate::events::ClosedWindow;

#[derive(Debug)]
pub struct WindowLog {
    out: Out,
    failures: Failures,
}

#[derive(Debug)]
enum Out {
    None,
    Stderr,
    File(LogFile),
}

/// How often a failing window log says so again.
const WARN_EVERY: Duration = Duration::from_secs(30);

/// Windows a failing log lost, and when to say so.
#[derive(Debug)]
struct Failures {
    /// Every window lost since the job started.
    lost: u64,
    /// Lost since the writes began failing (reported when they recover).
    lost_in_outage: u64,
    /// Lost since the last warning.
    unreported: u64,
    /// When a failure may warn again (afresh with each outage).
    warn: LogLimiter,
}

impl Default for Failures {
    fn default() -> Self {
        Self {
            lost: 0,
            lost_in_outage: 0,
            unreported: 0,
            warn: LogLimiter::new(WARN_EVERY),
        }
    }
}

/// What a write's outcome asks to be logged.
#[derive(Debug, PartialEq, Eq)]
enum Say {
    Nothing,
    /// Failing: windows lost since the last warning (the first failure
    /// warns at once).
    Failing {
        lost: u64,
    },
    /// Writing again after `lost` windows were lost.
    Recovered {
        lost: u64,
    },
}

impl Failures {
    fn failed(&mut self, windows: usize, now: Instant) -> Say {
        let n = windows as u64;
        self.lost += n;
        self.lost_in_outage += n;
        self.unreported += n;
        if self.warn.admit(now).is_none() {
            return Say::Nothing;
        }
        Say::Failing {
            lost: std::mem::take(&mut self.unreported),
        }
    }

    fn succeeded(&mut self) -> Say {
        if self.lost_in_outage == 0 {
            return Say::Nothing;
        }
        self.unreported = 0;
        self.warn = LogLimiter::new(WARN_EVERY);
        Say::Recovered {
            lost: std::mem::take(&mut self.lost_in_outage),
        }
    }

    /// A write failed since the last one that succeeded: the file may end
    /// in half a line.
    fn in_outage(&self) -> bool {
        self.lost_in_outage > 0
    }
}

/// An appended file and what identifies it, to notice a rotation.
#[derive(Debug)]
pub struct LogFile {
    path: PathBuf,
    /// Unbuffered: each batch is one `write_all`, so a failed one is lost
    /// whole instead of lingering in a buffer to be written later.
    writer: File,
    id: Option<FileId>,
    reopened: u64,
}

/// Device and inode: what a rename or a new file at the path changes.
type FileId = (u64, u64);

fn file_id(meta: &std::fs::Metadata) -> Option<FileId> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        Some((meta.dev(), meta.ino()))
    }
    #[cfg(not(unix))]
    {
        let _ = meta;
        None
    }
}

impl LogFile {
    fn open(path: &Path) -> std::io::Result<Self> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        let id = file_id(&file.metadata()?);
        Ok(Self {
            path: path.to_path_buf(),
            writer: file,
            id,
            reopened: 0,
        })
    }

    /// Reopens the path if it no longer names the open file.
    fn follow_rotation(&mut self) -> std::io::Result<()> {
        // Without an inode to compare (not unix) the open file is kept.
        let Some(id) = self.id else {
            return Ok(());
        };
        let current = std::fs::metadata(&self.path).ok().and_then(|m| file_id(&m));
        if current == Some(id) {
            return Ok(());
        }
        let reopened = self.reopened + 1;
        *self = Self::open(&self.path)?;
        self.reopened = reopened;
        tracing::info!(path = %self.path.display(), "windows.out was rotated or removed; reopened it");
        Ok(())
    }
}

impl WindowLog {
    /// `out` is `windows.out`: "none", "stderr" or a file path (appended).
    /// An error names the setting, for the job's start and `serve --check`.
    pub fn open(out: &str) -> Result<Self, String> {
        Self::open_io(out).map_err(|e| format!("windows.out {out:?}: cannot open: {e}"))
    }

    fn open_io(out: &str) -> std::io::Result<Self> {
        let out = match out {
            "none" => Out::None,
            "stderr" => Out::Stderr,
            path => Out::File(LogFile::open(Path::new(path))?),
        };
        Ok(Self {
            out,
            failures: Failures::default(),
        })
    }

    /// Times the file was reopened after a rotation (0 for stderr).
    #[cfg(test)]
    fn reopened(&self) -> u64 {
        match &self.out {
            Out::File(f) => f.reopened,
            _ => 0,
        }
    }

    /// Windows that could not be written since the job started.
    pub fn lost(&self) -> u64 {
        self.failures.lost
    }

    /// Writes one line per window. A failure is counted and logged here
    /// (rate-limited) and returned: the windows are statistics, not
    /// answers, so serving goes on.
    pub fn write(&mut self, windows: &[ClosedWindow]) -> std::io::Result<()> {
        if windows.is_empty() {
            // Not a write: neither a loss nor a recovery.
            return Ok(());
        }
        let fresh_line = self.failures.in_outage();
        let written = self.out.write(windows, fresh_line);
        match &written {
            Ok(()) => {
                if let Say::Recovered { lost } = self.failures.succeeded() {
                    tracing::info!(
                        lost,
                        "writing closed windows (windows.out) again; {lost} were lost while it failed"
                    );
                }
            }
            Err(e) => {
                metrics::counter!("grflow_windows_lost_total").increment(windows.len() as u64);
                if let Say::Failing { lost } = self.failures.failed(windows.len(), Instant::now()) {
                    tracing::warn!(
                        error = %e,
                        lost,
                        lost_since_start = self.failures.lost,
                        "cannot write closed windows (windows.out): {lost} lost, serving goes on \
                         (said again at most every 30 s while it lasts)"
                    );
                }
            }
        }
        written
    }
}

/// One JSON line per window; after a failed write the text starts on a
/// new line, since the file may end in half a line.
fn frame(windows: &[ClosedWindow], fresh_line: bool) -> String {
    let mut text = String::new();
    if fresh_line {
        text.push('\n');
    }
    for w in windows {
        let w = w.to_row();
        let mut row = serde_json::to_value(&w).expect("a window row serialises");
        row["kind"] = "window".into();
        // As in windows.parquet: no latency where nothing was served.
        row["p99_ms"] = w.served_p99_ms().into();
        text.push_str(&row.to_string());
        text.push('\n');
    }
    text
}

impl Out {
    fn write(&mut self, windows: &[ClosedWindow], fresh_line: bool) -> std::io::Result<()> {
        match self {
            Self::None => Ok(()),
            Self::Stderr => std::io::stderr()
                .lock()
                .write_all(frame(windows, false).as_bytes()),
            Self::File(f) => {
                f.follow_rotation()?;
                f.writer.write_all(frame(windows, fresh_line).as_bytes())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use grflow_operators::windows::WindowStats;

    #[test]
    fn a_file_gets_one_json_line_per_window_appended() {
        let dir = std::env::temp_dir().join(format!("grflow-window-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("windows.jsonl");
        let _ = std::fs::remove_file(&path);
        let w = |node, start| ClosedWindow {
            node,
            window_start_ms: start,
            stats: WindowStats {
                requests: 3,
                p99_ms: 1.5,
                alpha: 0.5,
                ..Default::default()
            },
        };
        WindowLog::open(path.to_str().unwrap())
            .unwrap()
            .write(&[w(0, 0), w(1, 0)])
            .unwrap();
        WindowLog::open(path.to_str().unwrap())
            .unwrap()
            .write(&[w(0, 5000)])
            .unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let rows: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[2]["window_start_ms"], 5000);
        assert_eq!(rows[1]["node"], 1);
        assert_eq!(rows[0]["kind"], "window");
        assert_eq!(rows[0]["requests"], 3);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A window whose requests were all shed wrote `"p99_ms": 0.0`, a
    /// perfect latency; it is null now, and the controllers' 0 stays.
    #[test]
    fn a_window_that_served_nothing_has_a_null_p99() {
        use grflow_operators::windows::{TelemetrySample, WindowAccumulator};
        let mut shed = WindowAccumulator::default();
        shed.add(1, &TelemetrySample::failed(false, 500, false));
        shed.add(2, &TelemetrySample::failed(true, 500, false));
        let stats = shed.finish();
        assert_eq!(stats.p99_ms, 0.0, "what the allocator reads is unchanged");
        let served = ClosedWindow {
            stats: WindowStats {
                requests: 3,
                failed: 1,
                p99_ms: 4.25,
                ..Default::default()
            },
            ..window(0)
        };
        let all_shed = ClosedWindow {
            node: 1,
            window_start_ms: 0,
            stats,
        };
        let text = frame(&[served, all_shed], false);
        let rows: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(rows[0]["p99_ms"], 4.25);
        assert!(rows[1]["p99_ms"].is_null(), "{}", rows[1]);
        assert_eq!(
            (&rows[1]["requests"], &rows[1]["failed"]),
            (&2.into(), &2.into())
        );
    }

    fn window(start: u64) -> ClosedWindow {
        ClosedWindow {
            node: 0,
            window_start_ms: start,
            stats: WindowStats {
                requests: 1,
                ..Default::default()
            },
        }
    }

    fn starts(path: &Path) -> Vec<u64> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["window_start_ms"]
                    .as_u64()
                    .unwrap()
            })
            .collect()
    }

    #[test]
    fn a_failing_log_warns_at_once_then_every_30_s_and_says_what_it_lost() {
        let mut f = Failures::default();
        let t0 = Instant::now();
        assert_eq!(f.succeeded(), Say::Nothing, "nothing failed yet");
        assert!(!f.in_outage());
        assert_eq!(f.failed(2, t0), Say::Failing { lost: 2 });
        assert!(f.in_outage());
        assert_eq!(f.failed(3, t0 + Duration::from_secs(10)), Say::Nothing);
        assert_eq!(f.failed(1, t0 + Duration::from_secs(29)), Say::Nothing);
        assert_eq!(
            f.failed(2, t0 + Duration::from_secs(30)),
            Say::Failing { lost: 6 },
            "the windows since the last warning"
        );
        assert_eq!(f.succeeded(), Say::Recovered { lost: 8 });
        assert!(!f.in_outage());
        assert_eq!(f.succeeded(), Say::Nothing);
        // A new outage warns at once again.
        assert_eq!(
            f.failed(1, t0 + Duration::from_secs(31)),
            Say::Failing { lost: 1 }
        );
        assert_eq!(f.lost, 9);
    }

    #[test]
    fn after_a_failed_write_the_next_text_starts_on_a_fresh_line() {
        let text = frame(&[window(0), window(5000)], false);
        assert_eq!(text.lines().count(), 2);
        assert!(text.ends_with('\n') && !text.starts_with('\n'));
        let after = frame(&[window(10_000)], true);
        // A half line left by the failure ends here; the window is whole.
        let half = r#"{"kind":"window","no"#;
        let file = format!("{text}{half}{after}");
        let parsed: Vec<bool> = file
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).is_ok())
            .collect();
        assert_eq!(parsed, [true, true, false, true]);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn windows_a_full_disk_refuses_are_counted_as_lost() {
        // Every write to /dev/full fails with ENOSPC.
        let mut log = WindowLog::open("/dev/full").unwrap();
        assert!(log.write(&[window(0), window(0)]).is_err());
        assert!(log.write(&[window(5000)]).is_err());
        assert_eq!(log.lost(), 3);
        assert!(log.write(&[]).is_ok(), "nothing to write, nothing lost");
        assert_eq!(log.lost(), 3);
    }

    #[cfg(unix)]
    #[test]
    fn a_rotated_or_deleted_file_is_reopened_at_its_path() {
        let dir = std::env::temp_dir().join(format!("grflow-window-rotate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("windows.jsonl");
        let rotated = dir.join("windows.jsonl.1");
        let _ = std::fs::remove_file(&path);
        let mut log = WindowLog::open(path.to_str().unwrap()).unwrap();
        log.write(&[window(0)]).unwrap();
        // logrotate's default: rename, then the writer should start a new file.
        std::fs::rename(&path, &rotated).unwrap();
        log.write(&[window(5000)]).unwrap();
        assert_eq!(starts(&rotated), [0]);
        assert_eq!(starts(&path), [5000]);
        assert_eq!(log.reopened(), 1);
        // copytruncate: the same file, emptied; appends land at its new end.
        std::fs::write(&path, "").unwrap();
        log.write(&[window(10_000)]).unwrap();
        assert_eq!(starts(&path), [10_000]);
        // Deleted: recreated.
        std::fs::remove_file(&path).unwrap();
        log.write(&[window(15_000)]).unwrap();
        assert_eq!(starts(&path), [15_000]);
        assert_eq!(log.reopened(), 2);
        // Nothing to write: nothing touched.
        std::fs::remove_file(&path).unwrap();
        log.write(&[]).unwrap();
        assert!(!path.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! `grflow serve`'s sink for closed windows: one JSON line per (node,
//! window) to stderr or a file, as each window closes, so a job that runs for
//! months keeps none of them.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::Path;

use crate::events::ClosedWindow;

#[derive(Debug)]
pub enum WindowLog {
    None,
    Stderr,
    File(BufWriter<File>),
}

impl WindowLog {
    /// `out` is `windows.out`: "none", "stderr" or a file path (appended).
    pub fn open(out: &str) -> std::io::Result<Self> {
        Ok(match out {
            "none" => Self::None,
            "stderr" => Self::Stderr,
            path => Self::File(BufWriter::new(
                OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(Path::new(path))?,
            )),
        })
    }

    /// Writes one line per window; a write error is returned for the caller
    /// to report (the windows are statistics, not answers: serving goes on).
    pub fn write(&mut self, windows: &[ClosedWindow]) -> std::io::Result<()> {
        let line = |w: &ClosedWindow| {
            let mut row = serde_json::to_value(w.to_row()).expect("a window row serialises");
            row["kind"] = "window".into();
            row.to_string()
        };
        match self {
            Self::None => Ok(()),
            Self::Stderr => {
                let mut err = std::io::stderr().lock();
                for w in windows {
                    writeln!(err, "{}", line(w))?;
                }
                Ok(())
            }
            Self::File(f) => {
                for w in windows {
                    writeln!(f, "{}", line(w))?;
                }
                f.flush()
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
}

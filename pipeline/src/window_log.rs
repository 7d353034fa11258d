//! `grflow serve`'s sink for closed windows: one JSON line per (node,
//! window) to stderr or a file, as each window closes, so a job that runs for
//! months keeps none of them.
//!
//! A file is opened for appending, so `logrotate`'s `copytruncate` works, and
//! is reopened when its path no longer names the open file (rotated by
//! renaming, or deleted), so the default `create` rotation works as well.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::events::ClosedWindow;

#[derive(Debug)]
pub enum WindowLog {
    None,
    Stderr,
    File(LogFile),
}

/// An appended file and what identifies it, to notice a rotation.
#[derive(Debug)]
pub struct LogFile {
    path: PathBuf,
    writer: BufWriter<File>,
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
            writer: BufWriter::new(file),
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
        self.writer.flush()?;
        let reopened = self.reopened + 1;
        *self = Self::open(&self.path)?;
        self.reopened = reopened;
        tracing::info!(path = %self.path.display(), "windows.out was rotated or removed; reopened it");
        Ok(())
    }
}

impl WindowLog {
    /// `out` is `windows.out`: "none", "stderr" or a file path (appended).
    pub fn open(out: &str) -> std::io::Result<Self> {
        Ok(match out {
            "none" => Self::None,
            "stderr" => Self::Stderr,
            path => Self::File(LogFile::open(Path::new(path))?),
        })
    }

    /// Times the file was reopened after a rotation (0 for stderr).
    #[cfg(test)]
    fn reopened(&self) -> u64 {
        match self {
            Self::File(f) => f.reopened,
            _ => 0,
        }
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
                if windows.is_empty() {
                    return Ok(());
                }
                f.follow_rotation()?;
                for w in windows {
                    writeln!(f.writer, "{}", line(w))?;
                }
                f.writer.flush()
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

//! One worker's panic ends the job: without this the other workers of a
//! process would park forever waiting on its frontier (a replay with two
//! workers hung after one panicked; one worker exited with an error).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

const NONE: usize = usize::MAX;

/// Which worker of the job panicked first, if any; shared by the workers.
#[derive(Clone, Debug)]
pub struct WorkerFailure(Arc<AtomicUsize>);

impl Default for WorkerFailure {
    fn default() -> Self {
        Self(Arc::new(AtomicUsize::new(NONE)))
    }
}

impl WorkerFailure {
    /// The first worker that panicked.
    pub fn failed(&self) -> Option<usize> {
        let w = self.0.load(Ordering::Relaxed);
        (w != NONE).then_some(w)
    }

    /// Records worker `index` as failed; the first one wins (later panics
    /// may be its consequences).
    pub fn record(&self, index: usize) {
        let _ = self
            .0
            .compare_exchange(NONE, index, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// A guard for worker `index`: if the worker unwinds while it is
    /// alive, the job learns which worker failed.
    pub fn watch(&self, index: usize) -> PanicWatch {
        PanicWatch {
            failure: self.clone(),
            index,
        }
    }
}

/// Records its worker as failed when dropped during a panic.
#[derive(Debug)]
pub struct PanicWatch {
    failure: WorkerFailure,
    index: usize,
}

impl Drop for PanicWatch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.failure.record(self.index);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panicking_worker_is_named_and_a_clean_exit_is_not() {
        let failure = WorkerFailure::default();
        {
            let _ok = failure.watch(0);
        }
        assert_eq!(failure.failed(), None);
        let f = failure.clone();
        let joined = std::thread::spawn(move || {
            let _watch = f.watch(3);
            panic!("worker 3 fails");
        })
        .join();
        assert!(joined.is_err());
        assert_eq!(failure.failed(), Some(3));
        let f = failure.clone();
        let _ = std::thread::spawn(move || {
            let _watch = f.watch(5);
            panic!("a later failure");
        })
        .join();
        assert_eq!(failure.failed(), Some(3), "the first failure is kept");
    }
}

//! The thread an `arrival`-mode node runs its steps on, one at a time,
//! so that its worker goes on admitting and routing meanwhile.

use std::sync::mpsc;

use crate::dataflow::operator::Waker;

pub(super) type Job = Box<dyn FnOnce() + Send>;

/// One long-lived thread per node that runs its steps.
pub(super) struct ComputeThread {
    jobs: Option<mpsc::Sender<Job>>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl ComputeThread {
    pub(super) fn spawn(node: u32) -> std::io::Result<Self> {
        let (jobs, rx) = mpsc::channel::<Job>();
        let handle = std::thread::Builder::new()
            .name(format!("grflow-node-{node}"))
            .spawn(move || {
                for job in rx {
                    job();
                }
            })?;
        Ok(Self {
            jobs: Some(jobs),
            handle: Some(handle),
        })
    }

    pub(super) fn run(&self, job: Job) {
        self.jobs
            .as_ref()
            .expect("open until dropped")
            .send(job)
            .expect("the node's compute thread died (its panic is above)");
    }
}

impl Drop for ComputeThread {
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Wakes the worker when a step ends, also when it ends by a panic, so
/// that the worker sees the step gone instead of sleeping forever.
pub(super) struct WakeOnDrop(pub(super) Waker);

impl Drop for WakeOnDrop {
    fn drop(&mut self) {
        self.0.wake();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[test]
    fn jobs_run_in_order_on_the_node_s_thread_and_drop_waits_for_them() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let thread = ComputeThread::spawn(7).unwrap();
        for k in 0..3 {
            let seen = seen.clone();
            thread.run(Box::new(move || {
                std::thread::sleep(std::time::Duration::from_millis(5));
                let name = std::thread::current().name().map(str::to_owned);
                seen.lock().unwrap().push((k, name));
            }));
        }
        // Dropping closes the queue and joins: every job queued has run.
        drop(thread);
        let seen = seen.lock().unwrap();
        let name = Some("grflow-node-7".to_string());
        assert_eq!(*seen, vec![(0, name.clone()), (1, name.clone()), (2, name)]);
    }
}

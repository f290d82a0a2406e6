//! Connection workers: OS threads that each run a single-threaded tokio
//! runtime and own the client connections handed to them, with everything
//! those connections start (relay tasks, HTTP/2 streams, their engine
//! connections). Envoy's threading model: a request never crosses a
//! thread, so no wake-up between its tasks costs a futex call and a
//! context switch. Measured on the 2-core benchmark machine, one
//! multi-threaded runtime (tokio's work stealing) sustained 8,000 req/s
//! where single-threaded workers sustained 10,000 (docs/benchmarks/overhead.md).
//!
//! The listener's accept loop stays on the main runtime and hands each
//! accepted connection to the next worker, round-robin (even with few,
//! long-lived client connections, unlike `SO_REUSEPORT` hashing). State
//! shared across workers (admission, the engine registry, metrics) is
//! behind atomics or short locks, as before. The hand-off channel holds at
//! most the listener's `max_connections` connections: a connection is
//! sent only with its connection permit.
//!
//! Each worker has its own HTTP/2 connections to every engine
//! ([`current`] picks them in `EnginePool::send`).

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread::JoinHandle;

use tokio::sync::mpsc;

type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

thread_local! {
    static WORKER: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The worker running the calling thread, if it is one.
pub fn current() -> Option<usize> {
    WORKER.with(Cell::get)
}

/// The worker threads of a listener.
#[derive(Debug)]
pub struct Workers {
    queues: Vec<mpsc::UnboundedSender<Task>>,
    next: AtomicUsize,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Workers {
    /// Starts `n` workers (at least one).
    pub fn start(n: usize) -> std::io::Result<Self> {
        let mut queues = Vec::new();
        let mut threads = Vec::new();
        for i in 0..n.max(1) {
            let (tx, mut rx) = mpsc::unbounded_channel::<Task>();
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            let thread =
                std::thread::Builder::new().name(format!("gateway-worker-{i}")).spawn(move || {
                    WORKER.with(|w| w.set(Some(i)));
                    rt.block_on(async move {
                        while let Some(task) = rx.recv().await {
                            tokio::spawn(task);
                        }
                    });
                    // The queue closed: the listener is done with this worker;
                    // dropping the runtime cancels what is left on it.
                })?;
            queues.push(tx);
            threads.push(thread);
        }
        Ok(Self { queues, next: AtomicUsize::new(0), threads: Mutex::new(threads) })
    }

    /// Runs `task` on the next worker.
    pub fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.queues.len();
        // A worker's queue closes only when `Workers` drops.
        let _ = self.queues[i].send(Box::pin(task));
    }
}

impl Drop for Workers {
    /// Closes every queue and joins the threads (each exits at once: what
    /// still runs on it is cancelled with its runtime).
    fn drop(&mut self) {
        self.queues.clear();
        for t in self.threads.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_run_on_the_workers_round_robin_and_drop_joins_them() {
        let workers = Workers::start(2).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        for _ in 0..4 {
            let tx = tx.clone();
            workers.spawn(async move {
                let name = std::thread::current().name().map(str::to_string);
                // Spawned tasks stay on the worker that runs their parent.
                let inner = tokio::spawn(async { current() }).await.unwrap();
                tx.send((name, current(), inner)).unwrap();
            });
        }
        let mut seen: Vec<_> = (0..4).map(|_| rx.recv().unwrap()).collect();
        seen.sort();
        let names: Vec<_> =
            seen.iter().map(|(n, w, inner)| (n.clone().unwrap(), w.unwrap(), inner.unwrap())).collect();
        assert_eq!(
            names,
            [
                ("gateway-worker-0".to_string(), 0, 0),
                ("gateway-worker-0".to_string(), 0, 0),
                ("gateway-worker-1".to_string(), 1, 1),
                ("gateway-worker-1".to_string(), 1, 1)
            ]
        );
        assert_eq!(current(), None, "the test thread is no worker");
        drop(workers); // joins: returns only once both threads ended
    }
}

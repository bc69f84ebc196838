//! The worker pool `serve` runs: in-process workers that claim batches, call-out workers that
//! claim one event at a time (their own bounded concurrency, so that a slow downstream holds
//! back no credit), and one sweeper, all stopped by one watch channel. Each worker's blocking
//! pass finishes the handler it started (bounded by the handler's timeout) and releases the
//! claims it had not started.
//!
//! The sweeper runs whatever the worker counts, `workers = 0` included: `POST /events/run`
//! claims too, and a claim left by a process that died must not stay `claimed` past its lease.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use super::Consumer;
use crate::store::StoreResult;

#[derive(Debug, Clone)]
pub struct PoolOptions {
    /// In-process workers (`consumers.workers`); 0 runs only the HTTP side and the sweeper.
    pub workers: usize,
    /// Call-out workers (`downstream.concurrency`), only when `workers > 0`.
    pub call_out_workers: usize,
    pub batch_size: usize,
    /// How often an idle worker looks again without being woken (retries come due silently).
    pub idle_poll: Duration,
    pub sweep_every: Duration,
    /// Prefix of worker names (`host-pid`), recorded on each attempt.
    pub name: String,
}

pub struct ConsumerPool {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

/// One blocking pass of a worker: claim and process until idle or stopping.
type Pass = fn(&Consumer, &str, usize, &dyn Fn() -> bool) -> StoreResult<usize>;

fn in_process(
    c: &Consumer,
    worker: &str,
    limit: usize,
    stop: &dyn Fn() -> bool,
) -> StoreResult<usize> {
    c.run_until_idle(worker, limit, stop)
}

fn call_outs(c: &Consumer, worker: &str, _: usize, stop: &dyn Fn() -> bool) -> StoreResult<usize> {
    c.run_call_outs(worker, stop)
}

impl ConsumerPool {
    /// Start the workers and the sweeper (the forwarders of `http` subscriptions run beside
    /// them: `crate::served`).
    pub fn start(consumer: Arc<Consumer>, options: PoolOptions, queued: Arc<Notify>) -> Self {
        let (stop, stopped) = watch::channel(false);
        let call_out_workers = if options.workers > 0 {
            options.call_out_workers
        } else {
            0
        };
        let workers = (0..options.workers)
            .map(|i| (format!("{}-w{i}", options.name), in_process as Pass))
            .chain(
                (0..call_out_workers)
                    .map(|i| (format!("{}-c{i}", options.name), call_outs as Pass)),
            );
        let mut tasks = Vec::new();
        for (worker, pass) in workers {
            tasks.push(tokio::spawn(work(
                Arc::clone(&consumer),
                worker,
                pass,
                options.clone(),
                Arc::clone(&queued),
                stopped.clone(),
            )));
        }
        tasks.push(tokio::spawn(sweep(consumer, options.sweep_every, stopped)));
        ConsumerPool { stop, tasks }
    }

    /// Stop claiming, let started handlers finish, release unstarted claims, and wait.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            if let Err(e) = task.await {
                tracing::error!(error = %e, "consumer task ended abnormally");
            }
        }
    }
}

async fn work(
    consumer: Arc<Consumer>,
    worker: String,
    pass: Pass,
    options: PoolOptions,
    queued: Arc<Notify>,
    mut stopped: watch::Receiver<bool>,
) {
    let mut failures: u32 = 0;
    loop {
        if *stopped.borrow() {
            break;
        }
        let result = {
            let consumer = Arc::clone(&consumer);
            let worker = worker.clone();
            let flag = stopped.clone();
            let limit = options.batch_size;
            tokio::task::spawn_blocking(move || pass(&consumer, &worker, limit, &|| *flag.borrow()))
                .await
        };
        let busy = match result {
            Ok(Ok(n)) => {
                failures = 0;
                n > 0
            }
            Ok(Err(e)) => {
                failures = failures.saturating_add(1);
                tracing::warn!(error = %e, %worker, "claim pass failed; backing off");
                false
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                tracing::error!(error = %e, %worker, "claim pass panicked");
                false
            }
        };
        if busy {
            continue;
        }
        // After failures, wait longer (up to 32 polls) before the next pass; a new delivery
        // still wakes an idle worker at once, but not one that is backing off.
        let wait = options.idle_poll * 2u32.saturating_pow(failures.min(5));
        if failures > 0 {
            tokio::select! {
                changed = stopped.changed() => if changed.is_err() { break },
                _ = tokio::time::sleep(wait) => {}
            }
        } else {
            tokio::select! {
                changed = stopped.changed() => if changed.is_err() { break },
                _ = queued.notified() => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }
}

async fn sweep(consumer: Arc<Consumer>, every: Duration, mut stopped: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = stopped.changed() => break,
            _ = tokio::time::sleep(every) => {}
        }
        let c = Arc::clone(&consumer);
        match tokio::task::spawn_blocking(move || c.sweep()).await {
            Ok(Ok(0)) => {}
            Ok(Ok(n)) => tracing::info!(swept = n, "expired leases swept"),
            Ok(Err(e)) => tracing::warn!(error = %e, "sweep failed"),
            Err(e) => tracing::error!(error = %e, "sweep panicked"),
        }
    }
}

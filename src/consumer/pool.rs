//! The worker pool `serve` runs: a fixed set of worker tasks and one sweeper, all stopped by one
//! watch channel. Each worker's blocking pass finishes the handler it started (bounded by the
//! handler's timeout) and releases the claims it had not started.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use super::Consumer;

#[derive(Debug, Clone)]
pub struct PoolOptions {
    pub workers: usize,
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

impl ConsumerPool {
    pub fn start(consumer: Arc<Consumer>, options: PoolOptions, queued: Arc<Notify>) -> Self {
        let (stop, stopped) = watch::channel(false);
        let mut tasks = Vec::new();
        for i in 0..options.workers {
            let worker = format!("{}-w{i}", options.name);
            tasks.push(tokio::spawn(work(
                Arc::clone(&consumer),
                worker,
                options.clone(),
                Arc::clone(&queued),
                stopped.clone(),
            )));
        }
        if options.workers > 0 {
            tasks.push(tokio::spawn(sweep(consumer, options.sweep_every, stopped)));
        }
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
    options: PoolOptions,
    queued: Arc<Notify>,
    mut stopped: watch::Receiver<bool>,
) {
    loop {
        if *stopped.borrow() {
            break;
        }
        let pass = {
            let consumer = Arc::clone(&consumer);
            let worker = worker.clone();
            let flag = stopped.clone();
            let limit = options.batch_size;
            tokio::task::spawn_blocking(move || {
                consumer.run_until_idle(&worker, limit, &|| *flag.borrow())
            })
            .await
        };
        let busy = match pass {
            Ok(Ok(n)) => n > 0,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, %worker, "claim pass failed; backing off");
                false
            }
            Err(e) => {
                tracing::error!(error = %e, %worker, "claim pass panicked");
                false
            }
        };
        if busy {
            continue;
        }
        tokio::select! {
            changed = stopped.changed() => if changed.is_err() { break },
            _ = queued.notified() => {}
            _ = tokio::time::sleep(options.idle_poll) => {}
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

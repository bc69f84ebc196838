//! The node's side of the worker processes: runs wait in one queue; a few threads, each with
//! its worker process, take whatever is waiting as one batch (`batch`), so that a busy node
//! pays a pipe round trip and a few thread wake-ups per batch rather than per event.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};
use tokio::sync::oneshot;

use super::batch::{self, Process, Run};
use super::{Ran, Transform, worker};

/// The most runs sent to a worker at once, and about the most bytes of requests: enough to
/// amortise a round trip, few enough that a batch is done in a few milliseconds.
const MAX_BATCH: usize = 64;
const MAX_BATCH_BYTES: usize = 1024 * 1024;

/// Worker threads and processes of a node, at most one per core (at most 4), started as the
/// queue needs them: a run is microseconds, so a few serve every forwarder and pull route of
/// the node, and a looping program holds one of them for at most [`super::WALL_LIMIT`] (twice
/// when it came in a batch: once to find it, once alone).
pub struct Pool {
    shared: Arc<Shared>,
}

struct Shared {
    exe: PathBuf,
    most: usize,
    state: Mutex<State>,
    work: Condvar,
}

#[derive(Default)]
struct State {
    waiting: VecDeque<Run>,
    threads: usize,
    idle: usize,
    closed: bool,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.shared.state.lock();
        f.debug_struct("Pool")
            .field("exe", &self.shared.exe)
            .field("threads", &state.threads)
            .field("waiting", &state.waiting.len())
            .finish()
    }
}

impl Pool {
    /// Workers started from `exe` (this node's binary: `std::env::current_exe`).
    pub fn new(exe: PathBuf) -> Pool {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Pool {
            shared: Arc::new(Shared {
                exe,
                most: cores.clamp(1, 4),
                state: Mutex::new(State::default()),
                work: Condvar::new(),
            }),
        }
    }

    /// The pool of this process's own binary.
    pub fn of_this_binary() -> std::io::Result<Pool> {
        Ok(Pool::new(std::env::current_exe()?))
    }

    /// Run `transform` on `body` within the budget.
    pub async fn run(&self, transform: &Transform, body: &[u8]) -> Ran {
        let mut ran = self.run_all(transform, [body]).await;
        ran.pop()
            .unwrap_or_else(|| Ran::Failed("the transform workers are shut down".into()))
    }

    /// Run `transform` on each of `bodies`, each within its budget; the outcomes in order.
    pub async fn run_all<'a>(
        &self,
        transform: &Transform,
        bodies: impl IntoIterator<Item = &'a [u8]>,
    ) -> Vec<Ran> {
        self.submit(transform, bodies).await
    }

    /// Queue a run of `transform` on each of `bodies` now, and give back what waits for their
    /// outcomes, in order. They wait in the queue together, so that they go to the workers in
    /// as few batches as can be. The future borrows nothing and waits on channels only (a
    /// forwarder holds it while it goes on with its calls): the runs are on the pool's
    /// threads, which finish them (each within its budget) even when the future is dropped.
    pub fn submit<'a>(
        &self,
        transform: &Transform,
        bodies: impl IntoIterator<Item = &'a [u8]>,
    ) -> impl Future<Output = Vec<Ran>> + Send + 'static {
        let mut pending = Vec::new();
        let mut runs = Vec::new();
        for body in bodies {
            match worker::request(transform.as_str(), body) {
                Ok(request) => {
                    let (answer, answered) = oneshot::channel();
                    runs.push(Run { request, answer });
                    pending.push(Err(answered));
                }
                Err(e) => pending.push(Ok(Ran::Failed(format!(
                    "cannot send the body to the program: {e}"
                )))),
            }
        }
        self.enqueue(runs);
        async move {
            let mut ran = Vec::with_capacity(pending.len());
            for p in pending {
                ran.push(match p {
                    Ok(now) => now,
                    Err(answered) => answered.await.unwrap_or_else(|_| {
                        Ran::Failed("the transform workers are shut down".into())
                    }),
                });
            }
            ran
        }
    }

    fn enqueue(&self, runs: Vec<Run>) {
        if runs.is_empty() {
            return;
        }
        let batches = runs.len().div_ceil(MAX_BATCH);
        let start_thread = {
            let mut state = self.shared.state.lock();
            if state.closed {
                return; // The runs' answers are dropped: "shut down".
            }
            state.waiting.extend(runs);
            for _ in 0..batches.min(state.idle) {
                self.shared.work.notify_one();
            }
            let start = state.idle < batches && state.threads < self.shared.most;
            if start {
                state.threads += 1;
            }
            start
        };
        if start_thread && let Err(e) = self.start_thread() {
            let stranded = {
                let mut state = self.shared.state.lock();
                state.threads -= 1;
                if state.threads == 0 {
                    std::mem::take(&mut state.waiting)
                } else {
                    VecDeque::new()
                }
            };
            for run in stranded {
                let _ = run
                    .answer
                    .send(Ran::Failed(format!("cannot start a transform thread: {e}")));
            }
        }
    }

    fn start_thread(&self) -> std::io::Result<()> {
        let shared = Arc::clone(&self.shared);
        std::thread::Builder::new()
            .name("transform-io".into())
            .spawn(move || shared.serve())
            .map(|_| ())
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // The threads end after their batch in hand, and their worker processes with them.
        let mut state = self.shared.state.lock();
        state.closed = true;
        self.shared.work.notify_all();
    }
}

impl Shared {
    /// A pool thread: batches from the queue until the pool is dropped.
    fn serve(&self) {
        let mut process: Option<Process> = None;
        loop {
            let runs = {
                let mut state = self.state.lock();
                while state.waiting.is_empty() && !state.closed {
                    state.idle += 1;
                    self.work.wait(&mut state);
                    state.idle -= 1;
                }
                if state.closed {
                    state.threads -= 1;
                    return;
                }
                take_batch(&mut state.waiting)
            };
            batch::serve(&self.exe, &mut process, runs);
        }
    }
}

/// The runs at the head of the queue, at most [`MAX_BATCH`] and (but for the first)
/// [`MAX_BATCH_BYTES`]; a run whose caller went away is dropped unrun.
fn take_batch(waiting: &mut VecDeque<Run>) -> Vec<Run> {
    let mut runs = Vec::new();
    let mut bytes = 0;
    while let Some(run) = waiting.front() {
        if runs.len() == MAX_BATCH
            || (!runs.is_empty() && bytes + run.request.len() > MAX_BATCH_BYTES)
        {
            break;
        }
        let Some(run) = waiting.pop_front() else {
            break;
        };
        if run.answer.is_closed() {
            continue;
        }
        bytes += run.request.len();
        runs.push(run);
    }
    runs
}

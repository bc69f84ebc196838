//! The node's side of the worker processes: a few kept warm, one request at a time each, a
//! budget per run, and a worker that overruns it killed (its process gone, nothing spinning)
//! and replaced by the next run that needs one.

use std::io::{BufReader, BufWriter, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::sync::{Semaphore, oneshot};

use super::worker;
use super::{Ran, TIME_BUDGET, Transform, WALL_LIMIT};

/// Warm workers of a node, at most one per core (at most 4): a run is microseconds, so a few
/// serve every forwarder and pull route of the node, and a looping program holds one of them
/// for at most [`WALL_LIMIT`].
pub struct Pool {
    exe: PathBuf,
    idle: parking_lot::Mutex<Vec<Worker>>,
    slots: Semaphore,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("exe", &self.exe)
            .field("idle", &self.idle.lock().len())
            .finish()
    }
}

/// One worker process and the thread that talks to it.
struct Worker {
    child: Child,
    jobs: std::sync::mpsc::Sender<Job>,
}

struct Job {
    request: Vec<u8>,
    answer: oneshot::Sender<std::io::Result<Ran>>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        // A worker is dropped when it overran, broke, or its run was abandoned (the caller
        // went away mid-run), and with the pool: never left running, never a zombie.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Pool {
    /// Workers started from `exe` (this node's binary: `std::env::current_exe`).
    pub fn new(exe: PathBuf) -> Pool {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Pool {
            exe,
            idle: parking_lot::Mutex::new(Vec::new()),
            slots: Semaphore::new(cores.clamp(1, 4)),
        }
    }

    /// The pool of this process's own binary.
    pub fn of_this_binary() -> std::io::Result<Pool> {
        Ok(Pool::new(std::env::current_exe()?))
    }

    /// The process ids of the workers waiting for work (tests look at them).
    pub fn idle_pids(&self) -> Vec<u32> {
        self.idle.lock().iter().map(|w| w.child.id()).collect()
    }

    /// Run `transform` on `body` within the budget.
    pub async fn run(&self, transform: &Transform, body: &[u8]) -> Ran {
        let request = match worker::request(transform.as_str(), body) {
            Ok(r) => r,
            Err(e) => return Ran::Failed(format!("cannot send the body to the program: {e}")),
        };
        let Ok(_slot) = self.slots.acquire().await else {
            return Ran::Failed("the transform workers are shut down".into());
        };
        let popped = self.idle.lock().pop();
        let worker = match popped {
            Some(w) => w,
            None => match self.start() {
                Ok(w) => w,
                Err(e) => return Ran::Failed(format!("cannot start a transform worker: {e}")),
            },
        };
        let (answer, mut answered) = oneshot::channel();
        if worker.jobs.send(Job { request, answer }).is_err() {
            return Ran::Failed(
                "a transform worker was gone: tried again at the next attempt".into(),
            );
        }
        let pid = worker.child.id();
        let started = Instant::now();
        let cpu_before = cpu_ms(pid);
        let mut deadline = started + TIME_BUDGET;
        loop {
            match tokio::time::timeout_at(deadline.into(), &mut answered).await {
                Ok(Ok(Ok(ran))) => {
                    self.idle.lock().push(worker);
                    return ran;
                }
                Ok(_) => {
                    drop(worker);
                    return Ran::Failed(
                        "the program's worker process ended: it recursed too deep or went over \
                         its memory limit"
                            .into(),
                    );
                }
                Err(_) => {
                    // Past the budget in wall time; stopped once it is past it in CPU time.
                    let used = cpu_ms(pid)
                        .zip(cpu_before)
                        .map(|(now, before)| now - before);
                    let budget = TIME_BUDGET.as_millis() as u64;
                    match used {
                        Some(used) if used < budget && started.elapsed() < WALL_LIMIT => {
                            deadline =
                                Instant::now() + Duration::from_millis((budget - used).max(5));
                        }
                        _ => {
                            drop(worker);
                            return Ran::Failed(format!(
                                "the program ran past its time budget ({budget} ms of CPU, {} ms \
                                 at most in all) and was stopped",
                                WALL_LIMIT.as_millis()
                            ));
                        }
                    }
                }
            }
        }
    }

    fn start(&self) -> std::io::Result<Worker> {
        let mut child = Command::new(&self.exe)
            .arg("transform-worker")
            // A program's `env` and `$ENV` see nothing of the node's environment (its tokens).
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::other("no pipes to the worker"));
        };
        let (jobs, queue) = std::sync::mpsc::channel::<Job>();
        let talk = move || {
            let (mut to, mut from) = (BufWriter::new(stdin), BufReader::new(stdout));
            for job in queue {
                let answer = to
                    .write_all(&job.request)
                    .and_then(|()| to.flush())
                    .and_then(|()| worker::read_answer(&mut from));
                let broken = answer.is_err();
                let _ = job.answer.send(answer);
                if broken {
                    return;
                }
            }
        };
        let spawned = std::thread::Builder::new()
            .name("transform-io".into())
            .spawn(talk);
        match spawned {
            Ok(_) => Ok(Worker { child, jobs }),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(e)
            }
        }
    }
}

/// The CPU time (user and system) a process has used, in ms; `None` where `/proc` cannot say.
fn cpu_ms(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command's name, which is in parentheses and may hold spaces: state is the
    // first field, utime the 12th and stime the 13th (proc(5)); ticks of 10 ms (USER_HZ 100).
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime + stime) * 10)
}

//! One batch of runs on one worker process, on a pool thread: the requests written at once,
//! the answers read as the worker sends them, a budget per run, and a worker that overruns
//! one killed. Which run overran is not certain (the worker holds up to [`FLUSH_EVERY`] of
//! answers it made), so the batch's unanswered runs are run again one at a time: a looping
//! program fails alone and the others are delivered.

use std::io::{self, Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use tokio::sync::oneshot;

use super::worker::{FLUSH_EVERY, READY, parse_answer};
use super::{Ran, TIME_BUDGET, WALL_LIMIT};

/// A run waiting for its answer: its request's frame, and where the answer goes.
pub(super) struct Run {
    pub request: Vec<u8>,
    pub answer: oneshot::Sender<Ran>,
}

impl Run {
    fn answer(self, ran: Ran) {
        // A caller that went away takes no answer; the run was bounded all the same.
        let _ = self.answer.send(ran);
    }
}

/// A worker process and its pipes (the node writes without blocking, so that a worker whose
/// answers fill its pipe is read while the rest of a batch is written).
pub(super) struct Process {
    child: Child,
    to: ChildStdin,
    from: ChildStdout,
    read: Vec<u8>,
}

impl Drop for Process {
    fn drop(&mut self) {
        // Dropped when it overran or broke, and with its pool thread: never left running,
        // never a zombie.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Process {
    fn start(exe: &Path) -> io::Result<Process> {
        let mut child = Command::new(exe)
            .arg("transform-worker")
            // A program's `env` and `$ENV` see nothing of the node's environment (its tokens).
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let pipes = (child.stdin.take(), child.stdout.take());
        let (Some(to), Some(from)) = pipes else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(io::Error::other("no pipes to the worker"));
        };
        let mut process = Process {
            child,
            to,
            from,
            read: Vec::new(),
        };
        let flags = rustix::fs::fcntl_getfl(&process.to)?;
        rustix::fs::fcntl_setfl(&process.to, flags | rustix::fs::OFlags::NONBLOCK)?;
        process.ready()?;
        Ok(process)
    }

    /// Wait (at most [`START_LIMIT`]) for the worker's [`READY`]: loading the binary on a busy
    /// machine can take longer than a run's whole budget, which must count a program's time
    /// only. A worker that does not get there is dropped (killed).
    fn ready(&mut self) -> io::Result<()> {
        let deadline = Instant::now() + START_LIMIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::other(format!(
                    "it was not ready within {} s",
                    START_LIMIT.as_secs()
                )));
            }
            let wait = Timespec::try_from(left).unwrap_or_default();
            let mut fds = [PollFd::new(&self.from, PollFlags::IN)];
            match poll(&mut fds, Some(&wait)) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
            if fds[0].revents().is_empty() {
                continue;
            }
            let mut byte = [0u8; 1];
            return match self.from.read(&mut byte) {
                Ok(1) if byte[0] == READY => Ok(()),
                Ok(0) => Err(io::Error::other("it ended as it started")),
                Ok(_) => Err(io::Error::other("it said something else than ready")),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => Err(e),
            };
        }
    }
}

/// How long a new worker may take to be ready (its binary loaded, its memory limit set).
const START_LIMIT: Duration = Duration::from_secs(10);

const ENDED: &str = "the program's worker process ended: it recursed too deep or went over its \
                     memory limit";

/// Answer every run of `runs`, on `process` (started when there is none, replaced when one
/// overruns or ends).
pub(super) fn serve(exe: &Path, process: &mut Option<Process>, runs: Vec<Run>) {
    let Err((unanswered, why)) = serve_together(exe, process, runs) else {
        return;
    };
    if unanswered.len() == 1 {
        unanswered
            .into_iter()
            .for_each(|run| run.answer(Ran::Failed(why.clone())));
        return;
    }
    for run in unanswered {
        if let Err((alone, why)) = serve_together(exe, process, vec![run]) {
            alone
                .into_iter()
                .for_each(|run| run.answer(Ran::Failed(why.clone())));
        }
    }
}

/// Run `runs` as one batch; when the worker overran or ended, it is dropped and the runs it did
/// not answer come back with the reason.
fn serve_together(
    exe: &Path,
    slot: &mut Option<Process>,
    runs: Vec<Run>,
) -> Result<(), (Vec<Run>, String)> {
    if runs.is_empty() {
        return Ok(());
    }
    let process = match slot {
        Some(p) => p,
        None => match Process::start(exe) {
            Ok(p) => slot.insert(p),
            Err(e) => {
                let why = format!("cannot start a transform worker: {e}");
                runs.into_iter()
                    .for_each(|run| run.answer(Ran::Failed(why.clone())));
                return Ok(());
            }
        },
    };
    // A copy: a run keeps its request until answered, to be run again alone.
    let frame = runs.iter().fold(Vec::new(), |mut frame, run| {
        frame.extend_from_slice(&run.request);
        frame
    });
    let pid = process.child.id();
    let mut runs = runs.into_iter();
    match exchange(process, &frame, &mut runs, pid) {
        Ok(()) => Ok(()),
        Err(why) => {
            *slot = None;
            Err((runs.collect(), why))
        }
    }
}

/// Write `frame`, and answer the runs from `runs` in order as the answers come; an error is why
/// the worker must go (the runs left in `runs` are unanswered).
fn exchange(
    process: &mut Process,
    frame: &[u8],
    runs: &mut std::vec::IntoIter<Run>,
    pid: u32,
) -> Result<(), String> {
    let started = Instant::now();
    let cpu_at_start = cpu_ms(pid);
    // When the last answer came (or the batch started): the budget of the run after it counts
    // from there.
    let mut progress = started;
    let mut deadline = started + TIME_BUDGET + FLUSH_EVERY;
    let mut written = 0;
    let mut chunk = [0u8; 64 * 1024];
    while runs.len() > 0 {
        if written < frame.len() {
            match process.to.write(&frame[written..]) {
                Ok(n) => written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Err(ENDED.into()),
            }
        }
        let now = Instant::now();
        if now >= deadline {
            deadline = overrun(pid, started, progress, cpu_at_start)?;
            continue;
        }
        let wait = Timespec::try_from(deadline - now).unwrap_or_default();
        let mut fds = [
            PollFd::new(&process.from, PollFlags::IN),
            PollFd::new(&process.to, PollFlags::OUT),
        ];
        let watched = if written < frame.len() { 2 } else { 1 };
        match poll(&mut fds[..watched], Some(&wait)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(format!("cannot wait for the transform worker: {e}")),
        }
        if fds[0].revents().is_empty() {
            continue;
        }
        let n = match process.from.read(&mut chunk) {
            Ok(0) => return Err(ENDED.into()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return Err(ENDED.into()),
        };
        process.read.extend_from_slice(&chunk[..n]);
        let mut used = 0;
        while let Some((ran, len)) =
            parse_answer(&process.read[used..]).map_err(|e| e.to_string())?
        {
            used += len;
            match runs.next() {
                Some(run) => run.answer(ran),
                None => return Err("a transform worker answered more than it was asked".into()),
            }
        }
        if used > 0 {
            process.read.drain(..used);
            progress = Instant::now();
            deadline = progress + TIME_BUDGET + FLUSH_EVERY;
        }
    }
    Ok(())
}

/// The wall clock says the run in progress may be past its budget: the next deadline when its
/// CPU time says it is not, else why it is stopped. Its CPU time is at least the worker's since
/// the batch started less the wall time of the runs answered before it.
fn overrun(
    pid: u32,
    started: Instant,
    progress: Instant,
    cpu_at_start: Option<u64>,
) -> Result<Instant, String> {
    let budget = TIME_BUDGET.as_millis() as u64;
    let before = progress.duration_since(started).as_millis() as u64;
    let used = cpu_ms(pid)
        .zip(cpu_at_start)
        .map(|(now, start)| (now - start).saturating_sub(before));
    match used {
        Some(used) if used < budget && progress.elapsed() < WALL_LIMIT => {
            Ok(Instant::now() + Duration::from_millis((budget - used).max(5)))
        }
        _ => Err(format!(
            "the program ran past its time budget ({budget} ms of CPU, {} ms at most in all) \
             and was stopped",
            WALL_LIMIT.as_millis()
        )),
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

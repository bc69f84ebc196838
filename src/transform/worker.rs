//! The worker process (`webhook-inbox transform-worker`, hidden): reads requests from stdin,
//! runs each, writes each answer to stdout, until stdin closes.
//!
//! Frames, little-endian lengths: a request is `u32 len, program, u32 len, body`; an answer is
//! `u8 tag, u32 len, bytes` with tag 0 (one output, its JSON), 1 (no output) or 2 (failed,
//! the message). The node writes a batch of requests at once; the worker answers them in
//! order, and sends what it has answered when it runs out of requests or every
//! [`FLUSH_EVERY`], so that a batch costs a few writes on each side, not one per event.

use std::collections::HashMap;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::time::{Duration, Instant};

use super::program::{self, Compiled, Ran};
use super::{MEMORY_LIMIT_BYTES, OUTPUT_BUDGET};

/// Compiled programs kept by a worker (a node has few transforms; the set is dropped when full).
const CACHED_PROGRAMS: usize = 64;

/// The longest a worker keeps answers it has made: the node judges a batch's budgets by the
/// answers it sees, so one that runs long is seen within this of its start.
pub const FLUSH_EVERY: Duration = Duration::from_millis(1);

/// The worker's loop. Returns when stdin closes (the node let it go or is gone).
pub fn serve() -> io::Result<()> {
    let parent = std::os::unix::process::parent_id();
    // On a thread with the stack the node's check compiled with: a program it accepted
    // compiles here too.
    let work = std::thread::Builder::new()
        .name("transform-worker".into())
        .stack_size(super::COMPILE_STACK_BYTES)
        .spawn(answer_requests)?;
    // A node that dies (SIGKILL) closes the pipe, which a program in a loop never reads: the
    // worker watches for its parent to change and leaves with it.
    loop {
        if work.is_finished() {
            return work
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("the worker's thread panicked")));
        }
        if std::os::unix::process::parent_id() != parent {
            std::process::exit(0);
        }
        std::thread::sleep(ORPHAN_CHECK);
    }
}

/// How often a worker looks whether its node is still there.
const ORPHAN_CHECK: Duration = Duration::from_millis(200);

fn answer_requests() -> io::Result<()> {
    // Once this thread's stack is mapped: the allocator may have reserved its arena (mimalloc
    // reserves 1 GiB of address space at once), and the stack is not a program's to use.
    limit_memory();
    // As large as the pipe: a batch is read in one or two reads, and answered in one write.
    let mut input = BufReader::with_capacity(PIPE_BYTES, io::stdin().lock());
    let mut output = BufWriter::with_capacity(PIPE_BYTES, io::stdout().lock());
    // Started: the node's clock for the first run's budget starts at this byte, so that a
    // start slowed by a busy machine is not counted against a program.
    output.write_all(&[READY])?;
    output.flush()?;
    let mut cache: HashMap<Vec<u8>, Result<Compiled, String>> = HashMap::new();
    let (mut program, mut body) = (Vec::new(), Vec::new());
    // When the oldest answer not sent yet was made: the clock of `FLUSH_EVERY`. Not the last
    // flush's: after a wait for the next batch, that was long ago, and the batch's first
    // answer went alone, a second write and a second wake-up of the node per batch.
    let mut unsent: Option<Instant> = None;
    loop {
        if input.buffer().is_empty() || unsent.is_some_and(|t| t.elapsed() >= FLUSH_EVERY) {
            output.flush()?;
            unsent = None;
        }
        match read_chunk(&mut input, &mut program) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        read_chunk(&mut input, &mut body)?;
        if !cache.contains_key(&program) {
            if cache.len() >= CACHED_PROGRAMS {
                cache.clear();
            }
            let compiled = program::compile(&String::from_utf8_lossy(&program));
            cache.insert(program.clone(), compiled);
        }
        let ran = match &cache[&program] {
            Ok(filter) => program::run(filter, &body, OUTPUT_BUDGET),
            Err(e) => Ran::Failed(format!("the program does not compile: {e}")),
        };
        write_answer(&mut output, &ran)?;
        unsent.get_or_insert_with(Instant::now);
    }
}

/// The byte a worker writes once, when it is ready for requests (before any answer).
pub const READY: u8 = 0xA5;

/// A pipe's capacity on Linux.
const PIPE_BYTES: usize = 64 * 1024;

#[cfg(target_os = "linux")]
fn limit_memory() {
    use rustix::process::{Resource, Rlimit, setrlimit};
    let limit = Rlimit {
        current: Some(MEMORY_LIMIT_BYTES),
        maximum: Some(MEMORY_LIMIT_BYTES),
    };
    // Without the limit a worker is still a process of its own: the kernel's OOM killer would
    // pick it (the largest) rather than the node.
    let _ = setrlimit(Resource::As, limit);
}

#[cfg(not(target_os = "linux"))]
fn limit_memory() {}

/// The next chunk, into `chunk` (reused from run to run).
fn read_chunk(r: &mut impl Read, chunk: &mut Vec<u8>) -> io::Result<()> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    chunk.clear();
    chunk.resize(u32::from_le_bytes(len) as usize, 0);
    r.read_exact(chunk)
}

fn len32(bytes: &[u8]) -> io::Result<[u8; 4]> {
    u32::try_from(bytes.len())
        .map(u32::to_le_bytes)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a frame over 4 GiB"))
}

/// A request's frame.
pub fn request(program: &str, body: &[u8]) -> io::Result<Vec<u8>> {
    let mut frame = Vec::with_capacity(8 + program.len() + body.len());
    frame.extend_from_slice(&len32(program.as_bytes())?);
    frame.extend_from_slice(program.as_bytes());
    frame.extend_from_slice(&len32(body)?);
    frame.extend_from_slice(body);
    Ok(frame)
}

fn write_answer(w: &mut impl Write, ran: &Ran) -> io::Result<()> {
    let (tag, bytes): (u8, &[u8]) = match ran {
        Ran::One(json) => (0, json),
        Ran::Nothing => (1, &[]),
        Ran::Failed(message) => (2, message.as_bytes()),
    };
    w.write_all(&[tag])?;
    w.write_all(&len32(bytes)?)?;
    w.write_all(bytes)
}

/// The first answer in `bytes`, and how many bytes it took; `None` until it is all there
/// (the node's side).
pub fn parse_answer(bytes: &[u8]) -> io::Result<Option<(Ran, usize)>> {
    let Some((&tag, rest)) = bytes.split_first() else {
        return Ok(None);
    };
    let Some(len) = rest.first_chunk::<4>() else {
        return Ok(None);
    };
    let len = u32::from_le_bytes(*len) as usize;
    let Some(content) = rest.get(4..4 + len) else {
        return Ok(None);
    };
    let ran = match tag {
        0 => Ran::One(content.to_vec()),
        1 => Ran::Nothing,
        2 => Ran::Failed(String::from_utf8_lossy(content).into_owned()),
        other => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a transform worker answered tag {other}"),
            ));
        }
    };
    Ok(Some((ran, 5 + len)))
}

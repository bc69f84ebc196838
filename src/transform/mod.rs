//! Transformations (SPEC section 13, "Filters and transformations"): a subscription's
//! `transform` is a jq program run at delivery by jaq; its one output is what is delivered.
//!
//! jaq cannot be interrupted: a program runs to its next output inside the interpreter (and
//! `last(range(1e18))` or `def f: f; f` never yields one), a native function such as `range`
//! loops in Rust, and a deep recursion overflows the stack, which would abort the whole node.
//! So programs run in worker processes (the binary's hidden `transform-worker` command), kept
//! warm in a [`Pool`] and fed batches of requests over a pipe; a worker that runs past a run's
//! budget is killed and replaced, and whatever a program does ends in its own process. Only
//! the check at validation ([`Transform::parse`]: parse and compile, no run) is in-process.
//!
//! - `program`: compile and run one program (the worker's code; the compile check).
//! - `template`: a program that only builds JSON out of the body's fields, run without jaq's
//!   interpreter (the same bytes, or jaq runs it).
//! - `worker`: the worker process's loop and the frames on its pipes.
//! - `pool`: the node's side: the queue of runs and the threads that take them in batches.
//! - `batch`: one batch on one worker: the budgets, kill and replace, the re-runs.
//!
//! What a delivery does with a run's outcome is `forward::shape`'s: this module reads no claim
//! and no store, so that the subscriptions (which check a program) and the store (which keeps
//! it) may read it.

mod batch;
mod pool;
pub mod program;
mod template;
pub mod worker;

use std::time::Duration;

pub use pool::Pool;
pub use program::Ran;

/// The longest program accepted: a transform is a few lines; this is a few hundred.
pub const MAX_PROGRAM_BYTES: usize = 16 * 1024;
/// CPU time one run may use. Reshaping a webhook takes microseconds (docs/performance.md);
/// this is three orders of magnitude above, and it is CPU time, not wall time, so that a
/// worker that waited for a core on a busy machine is not failed for it.
pub const TIME_BUDGET: Duration = Duration::from_millis(50);
/// However little CPU it got, a run is stopped after this long (a machine so busy that a
/// worker gets no CPU for a second fails the attempt rather than holding it).
pub const WALL_LIMIT: Duration = Duration::from_secs(1);
/// The largest output: the default `body_limit_bytes`, as for what a provider may send.
pub const OUTPUT_BUDGET: usize = 1024 * 1024;
/// The address space of a worker process: a program that builds a huge value (`"x" * 1e10`)
/// fails alone, and its worker is replaced.
pub const MEMORY_LIMIT_BYTES: u64 = 1024 * 1024 * 1024;

/// A jq program that compiles, at most [`MAX_PROGRAM_BYTES`] long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transform(String);

impl Transform {
    /// Check `code` as a config or the API gives it: its length, then a compile (nothing
    /// runs). The message says what jaq expected and where (`line:column`).
    pub fn parse(code: &str) -> Result<Transform, String> {
        if code.len() > MAX_PROGRAM_BYTES {
            return Err(format!(
                "the program is {} bytes, over the limit of {MAX_PROGRAM_BYTES}",
                code.len()
            ));
        }
        if code.trim().is_empty() {
            return Err("an empty program: give a jq program (`.` delivers the body as is)".into());
        }
        if code.contains('\0') {
            return Err("the program holds a NUL character".into());
        }
        let owned = code.to_string();
        // jaq's parser recurses once per nesting level: a program of 16 KiB of `[` needs more
        // stack than a request's thread has, so the check runs on a thread with enough.
        let checked = std::thread::Builder::new()
            .name("transform-check".into())
            .stack_size(COMPILE_STACK_BYTES)
            .spawn(move || program::compile(&owned).map(|_| ()))
            .map_err(|e| format!("cannot check the program now: {e}"))?
            .join()
            .map_err(|_| "the program cannot be compiled (jaq failed on it)".to_string())?;
        checked.map(|()| Transform(code.to_string()))
    }

    /// A program as the registry holds it, checked when it was written.
    pub fn unchecked(code: &str) -> Transform {
        Transform(code.to_string())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The stack of the compile check's thread (reserved, touched only as deep as it goes).
pub(crate) const COMPILE_STACK_BYTES: usize = 256 * 1024 * 1024;

#[cfg(test)]
mod tests;

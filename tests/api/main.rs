//! One integration-test binary: real HTTP on port 0, real SQLite files, the real binary for
//! crash tests. `TEST_LOG=1` shows the server's logs.

mod helpers;

mod cli;
mod concurrency;
mod consumers;
mod crash;
mod group_commit;
mod ingest;
mod ops;
mod pipeline;
mod process;
mod requests;
mod schemes;

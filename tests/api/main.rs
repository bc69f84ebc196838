//! One integration-test binary: real HTTP on port 0, real SQLite files, the real binary for
//! crash tests. `TEST_LOG=1` shows the server's logs.

mod helpers;

mod cli;
mod cli_config;
mod cli_usage;
mod concurrency;
mod consumers;
mod crash;
mod downstream;
mod group_commit;
mod harness;
mod ingest;
mod leases;
mod loyalty;
mod ops;
mod pipeline;
mod process;
mod rejections;
mod replay;
mod requests;
#[allow(dead_code)] // used by the tests that need FUSE, PostgreSQL or a browser
mod requires;
mod schemes;

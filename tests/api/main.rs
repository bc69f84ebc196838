//! One integration-test binary: real HTTP on port 0, real SQLite files, the real binary for
//! crash tests. `TEST_LOG=1` shows the server's logs.

mod helpers;

mod backup;
mod balances;
mod browser;
mod callouts;
mod cli;
mod concurrency;
mod consumers;
mod crash;
mod dashboard;
mod dashboard_api;
mod downstream;
mod group_commit;
mod harness;
mod ingest;
mod leases;
mod lifecycle;
mod ops;
mod pipeline;
mod powercut;
mod process;
mod receiver;
mod rejections;
mod requests;
mod requires;
mod retention_space;
mod schemes;

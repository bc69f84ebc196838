//! One integration-test binary: real HTTP on port 0, real SQLite files, the real binary for
//! crash tests. `TEST_LOG=1` shows the server's logs.

mod helpers;

mod apidoc;
mod apidoc_fuzz;
mod backup;
mod balances;
mod browser;
mod callouts;
mod cli;
mod cli_config;
mod cli_usage;
mod concurrency;
mod consumers;
mod crash;
mod dashboard;
mod dashboard_api;
mod downstream;
mod faults;
mod group_commit;
mod harness;
mod ingest;
mod lag;
mod leases;
mod lifecycle;
mod loyalty;
mod ops;
mod panics;
mod pipeline;
mod plans;
mod powercut;
mod process;
mod properties;
mod purge_walks;
mod receiver;
mod rejections;
mod replay;
mod requests;
mod requires;
mod schemes;

//! Tests that need something outside Rust (a FUSE mount, a PostgreSQL server, a browser) ask
//! here first. On a developer's machine without it, the test says it was skipped and why, and
//! returns. `.ci/run` sets `WEBHOOK_INBOX_TEST_REQUIRE=1` after installing everything: a
//! missing part then fails the test, because skipped is not passed.

/// `Ok(())` when the part is there. Otherwise the test prints why it is skipped and the caller
/// returns, or, under `WEBHOOK_INBOX_TEST_REQUIRE`, the test fails with that reason.
pub fn available(part: &str, found: Result<(), String>) -> bool {
    match found {
        Ok(()) => true,
        Err(why) if std::env::var_os("WEBHOOK_INBOX_TEST_REQUIRE").is_some() => {
            panic!("{part} is required here (WEBHOOK_INBOX_TEST_REQUIRE is set) but: {why}")
        }
        Err(why) => {
            eprintln!("SKIPPED: this test needs {part}: {why}");
            false
        }
    }
}

/// Whether a command can be found on `PATH` (or is an existing path).
pub fn command(name: &str) -> Result<(), String> {
    let found = std::path::Path::new(name).is_file()
        || std::env::var_os("PATH")
            .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(name).is_file()));
    if found {
        Ok(())
    } else {
        Err(format!(
            "`{name}` is not installed (scripts/test-deps installs it)"
        ))
    }
}

//! SPEC section 11: schemathesis, fed the server's own `GET /openapi.json`, fuzzes the real
//! binary on a random local port with the admin token. It must find no 5xx and no answer that
//! contradicts the document (status code, content type, headers, body schema).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::helpers::ADMIN_TOKEN;
use crate::process::{ServerProcess, free_port, write_config};
use crate::requires;

/// Where scripts/test-deps installs it; `SCHEMATHESIS` or `PATH` may name another.
const VENV_ST: &str = "/opt/webhook-inbox/schemathesis/bin/st";

/// Examples per operation and generation mode: 19 operations, about 40 s on this machine.
const MAX_EXAMPLES: &str = "25";
const RUN_LIMIT: Duration = Duration::from_secs(300);

fn schemathesis() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("SCHEMATHESIS") {
        return Ok(path.into());
    }
    if Path::new(VENV_ST).is_file() {
        return Ok(VENV_ST.into());
    }
    requires::command("st").map(|()| "st".into())
}

/// Kills the fuzzer if the test fails or times out.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn schemathesis_finds_no_server_error_and_no_answer_outside_the_document() {
    let st = schemathesis();
    let Some(st) = requires::available("schemathesis", st.clone().map(|_| ())).then(|| st.unwrap())
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let (config, _) = write_config(dir.path(), port, "", "workers = 2\n");
    let server = ServerProcess::start(dir.path(), &config, port, "server.log");
    // Schemathesis under CPython 3.11 now and then crashes inside Hypothesis while it builds
    // a test case (`SystemError: AST constructor recursion depth mismatch`, seen once in four
    // CI runs, with every test case passing): that crash, and only that, is run once more.
    let mut attempt = 0;
    let (status, report) = loop {
        attempt += 1;
        let run = run_schemathesis(&st, &server.base, dir.path());
        if attempt < 2 && !run.0.success() && run.1.contains(TOOL_CRASH) {
            eprintln!(
                "schemathesis crashed inside Hypothesis; running it again:\n{}",
                run.1
            );
            continue;
        }
        break run;
    };
    assert!(
        status.success(),
        "schemathesis found answers that contradict the document ({status}):\n{report}\n\
         server log:\n{}",
        server.logs()
    );
    assert!(
        !server.logs().contains("internal error"),
        "the server logged a 500: {}",
        server.logs()
    );
}

/// What a crash of the tool itself looks like in its report (not a finding about the server).
const TOOL_CRASH: &str = "SystemError: AST constructor recursion depth mismatch";

/// One schemathesis run against `base`: its exit status and its report.
fn run_schemathesis(st: &Path, base: &str, dir: &Path) -> (std::process::ExitStatus, String) {
    let out_path = dir.join("schemathesis.txt");
    let child = Command::new(st)
        .args([
            "run",
            &format!("{base}/openapi.json"),
            "--checks",
            "not_a_server_error,status_code_conformance,content_type_conformance,\
             response_headers_conformance,response_schema_conformance",
            "--max-examples",
            MAX_EXAMPLES,
            "--seed",
            "14",
            "--workers",
            "2",
            "--request-timeout",
            "10",
            "--header",
            &format!("Authorization: Bearer {ADMIN_TOKEN}"),
            "--no-color",
        ])
        // Hypothesis keeps its example database in the working directory.
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start schemathesis");
    let mut guard = Guard(child);
    let started = Instant::now();
    let status = loop {
        if let Some(status) = guard.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < RUN_LIMIT,
            "schemathesis still running after {RUN_LIMIT:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let report = std::fs::read_to_string(&out_path).unwrap_or_default();
    eprintln!(
        "schemathesis ran {:.1} s:\n{report}",
        started.elapsed().as_secs_f64()
    );
    (status, report)
}

//! A throwaway PostgreSQL cluster of the test's own (for tests that stop the server, which
//! the shared one of `TEST_POSTGRES_URL` must not be): `initdb` in a temporary folder owned by
//! the `postgres` user, `pg_ctl start` on 127.0.0.1 on a free port. The guard stops it
//! (immediately) and removes the folder, also when the test fails.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::requires;

pub struct Cluster {
    dir: tempfile::TempDir,
    bin: PathBuf,
    pub port: u16,
}

/// Where `initdb` and `pg_ctl` are: on `PATH`, or Debian's versioned folder.
fn server_bin() -> Result<PathBuf, String> {
    if let Some(paths) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&paths) {
            if dir.join("pg_ctl").is_file() && dir.join("initdb").is_file() {
                return Ok(dir);
            }
        }
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|_| "no PostgreSQL server binaries (initdb, pg_ctl) installed".to_string())?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|bin| bin.join("pg_ctl").is_file())
        .collect();
    found.sort();
    found
        .pop()
        .ok_or_else(|| "no PostgreSQL server binaries (initdb, pg_ctl) installed".into())
}

/// Run a server binary as the `postgres` user when we are root (`initdb` refuses root).
fn as_server_user(bin: &Path, args: &[&str]) -> Command {
    let mut cmd = if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(bin);
        c
    } else {
        Command::new(bin)
    };
    cmd.args(args);
    cmd
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Cluster {
    /// `None` when the server binaries are missing (skipped, or failed under
    /// `TEST_REQUIRE_ALL`).
    pub fn start() -> Option<Cluster> {
        let bin = server_bin();
        if !requires::available(
            "PostgreSQL server binaries",
            bin.as_ref().map(|_| ()).map_err(Clone::clone),
        ) {
            return None;
        }
        let bin = bin.expect("checked above");
        let dir = tempfile::tempdir().unwrap();
        let chown = Command::new("chown")
            .args(["-R", "postgres"])
            .arg(dir.path())
            .status();
        assert!(
            chown.is_ok_and(|s| s.success()) || !is_root(),
            "chown postgres failed"
        );
        let data = dir.path().join("data");
        let out = as_server_user(
            &bin.join("initdb"),
            &[
                "-D",
                data.to_str().unwrap(),
                "-A",
                "trust",
                "-U",
                "postgres",
            ],
        )
        .output()
        .unwrap();
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = Cluster {
            dir,
            bin,
            port: free_port(),
        };
        cluster.start_again();
        Some(cluster)
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn pg_ctl(&self, args: &[&str]) -> std::process::Output {
        let data = self.data();
        let mut all = vec!["-D", data.to_str().unwrap()];
        all.extend_from_slice(args);
        as_server_user(&self.bin.join("pg_ctl"), &all)
            .output()
            .unwrap()
    }

    /// Start (again) and wait until it accepts connections (`-w`, bounded by `-t`).
    pub fn start_again(&self) {
        let log = self.dir.path().join("log");
        let options = format!(
            "-c listen_addresses=127.0.0.1 -p {} -c fsync=on -c unix_socket_directories={}",
            self.port,
            self.dir.path().display()
        );
        let out = self.pg_ctl(&[
            "-l",
            log.to_str().unwrap(),
            "-o",
            &options,
            "-w",
            "-t",
            "60",
            "start",
        ]);
        assert!(
            out.status.success(),
            "pg_ctl start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Stop the server (fast: sessions are ended, as at a restart).
    pub fn stop(&self) {
        let out = self.pg_ctl(&["-m", "fast", "-w", "-t", "60", "stop"]);
        assert!(
            out.status.success(),
            "pg_ctl stop: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

/// Whether this process runs as root (`/proc/self` is owned by the process's user).
fn is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false)
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.pg_ctl(&["-m", "immediate", "-w", "-t", "30", "stop"]);
    }
}

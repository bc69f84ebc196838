//! `webhook-inbox backup FILE`: a consistent copy of the SQLite database while the server runs
//! (see `store::sqlite::backup` for how, and the README for restoring).

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use crate::config::{self, Settings};
use crate::store::sqlite::backup;

#[derive(Debug, Args)]
pub struct BackupArgs {
    /// Where to write the copy.
    file: PathBuf,
    /// Replace FILE if it exists.
    #[arg(long)]
    force: bool,
}

pub fn run(config: Option<&Path>, args: BackupArgs) -> anyhow::Result<()> {
    // Not `load_settings`: a backup must not generate tokens or secrets on the way.
    let settings = match Settings::load(config, std::env::vars())? {
        Some(s) => s,
        None => Settings::from_toml("", "embedded default", std::env::vars())?,
    };
    let source = config::sqlite_path(
        &settings.database_url,
        "back it up with `pg_dump` (a consistent snapshot of every table while the server \
         keeps serving; `webhook-inbox backup` copies SQLite files only)",
    )?;
    // Shown on a terminal only (indicatif draws nothing when stderr is not one).
    let bar = ProgressBar::new(0).with_style(
        ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {eta}")
            .context("progress bar template")?,
    );
    let report = backup::backup(&source, &args.file, args.force, &|done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })?;
    bar.finish_and_clear();
    println!(
        "backup of {} written to {} ({} bytes, integrity_check: {})",
        source.display(),
        args.file.display(),
        report.bytes,
        report.integrity
    );
    Ok(())
}

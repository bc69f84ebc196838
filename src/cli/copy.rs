//! `webhook-inbox copy --from URL --to URL`: move a whole database to another store (SQLite to
//! PostgreSQL when one machine is outgrown), everything included (see `store::copy`).

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use crate::config::Database;
use crate::store::{self, copy};

#[derive(Debug, Args)]
pub struct CopyArgs {
    /// The database to read, e.g. sqlite://data/webhook-inbox.db. Stop the server that uses it
    /// first (or copy from a `webhook-inbox backup` file): a copy of a live database could
    /// miss what changes while it runs.
    #[arg(long, value_name = "URL")]
    from: String,
    /// The database to fill, e.g. postgres://user:password@host:5432/db; created tables are
    /// migrated first. It must be empty unless --allow-non-empty.
    #[arg(long, value_name = "URL")]
    to: String,
    /// Resume an interrupted copy of the same source: the target's rows must each be the
    /// source's row of the same key (checked first; anything else is refused), and are
    /// skipped. No node may serve the target while the copy runs.
    #[arg(long)]
    allow_non_empty: bool,
}

/// An error of one side, named by its option, its cause said once: a database error's text is
/// often repeated by each error that wraps it (`db error: FATAL: password authentication
/// failed …: db error: FATAL: password authentication failed …`), so a cause already said is
/// left out.
fn side(option: &str, db: &Database, doing: &str, e: anyhow::Error) -> anyhow::Error {
    let mut said: Vec<String> = Vec::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !said.iter().any(|s| s.contains(&text)) {
            said.retain(|s| !text.contains(s.as_str()));
            said.push(text);
        }
    }
    anyhow::anyhow!("{option}: {doing} {}: {}", db.display(), said.join(": "))
}

pub fn run(args: CopyArgs) -> anyhow::Result<()> {
    let from = Database::parse(&args.from).context("--from")?;
    let to = Database::parse(&args.to).context("--to")?;
    if from == to {
        anyhow::bail!(
            "--from and --to name the same database ({})",
            from.display()
        );
    }
    if let Database::Sqlite(path) = &from
        && !path.exists()
    {
        anyhow::bail!("--from: {} does not exist", path.display());
    }
    let source = store::open(&from).map_err(|e| side("--from", &from, "opening", e))?;
    source
        .migrate()
        .map_err(|e| side("--from", &from, "migrating", e.into()))?;
    // Migrated by the copy once it holds it alone; reached now, so that a wrong password or
    // host is told as the target's before anything is read.
    let target = store::open(&to).map_err(|e| side("--to", &to, "opening", e))?;
    target
        .ready()
        .map_err(|e| side("--to", &to, "connecting to", e.into()))?;
    // Shown on a terminal only (indicatif draws nothing when stderr is not one).
    let bar = ProgressBar::new(0).with_style(
        ProgressStyle::with_template("{msg:20} {bar:40} {pos}/{len} rows {eta}")
            .context("progress bar template")?,
    );
    let report = copy::copy_all(
        source.as_ref(),
        target.as_ref(),
        args.allow_non_empty,
        &mut |table, done, total| {
            bar.set_message(table.name);
            bar.set_length(total);
            bar.set_position(done);
        },
    )?;
    bar.finish_and_clear();
    println!("copied {} to {}:", from.display(), to.display());
    for table in &report.tables {
        println!(
            "  {:20} {:>10} rows written, {:>10} already there",
            table.name,
            table.written,
            table.skipped()
        );
    }
    if !report.sealed.is_empty() {
        println!(
            "the secrets of {} are sealed, copied as they were: start the target's nodes with              the source's secrets_key (WEBHOOK_INBOX_SECRETS_KEY); a node without it refuses              to start",
            report.sealed.join(", ")
        );
    }
    Ok(())
}

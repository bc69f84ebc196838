//! `completions SHELL` and `man`: generated from the same clap definition as the parser, so
//! they never drift from the real flags.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, CommandFactory as _};

use super::Cli;

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// bash, zsh, fish, elvish or powershell.
    shell: clap_complete::Shell,
}

#[derive(Debug, Args)]
pub struct ManArgs {
    /// Write `webhook-inbox.1` and one page per subcommand here instead of printing the main
    /// page to stdout.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

pub fn completions(args: CompletionsArgs) -> anyhow::Result<()> {
    let mut command = Cli::command();
    clap_complete::generate(
        args.shell,
        &mut command,
        "webhook-inbox",
        &mut std::io::stdout(),
    );
    Ok(())
}

pub fn man(args: ManArgs) -> anyhow::Result<()> {
    let command = Cli::command();
    match args.dir {
        None => clap_mangen::Man::new(command)
            .render(&mut std::io::stdout())
            .context("writing the man page"),
        Some(dir) => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            clap_mangen::generate_to(command, &dir)
                .with_context(|| format!("writing man pages into {}", dir.display()))?;
            eprintln!("man pages written to {}", dir.display());
            Ok(())
        }
    }
}

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
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, "webhook-inbox", &mut script);
    let mut script = String::from_utf8(script).context("the completion script is not UTF-8")?;
    if args.shell == clap_complete::Shell::Bash {
        script = mend_bash(&script);
    }
    std::io::Write::write_all(&mut std::io::stdout(), script.as_bytes())
        .context("writing the completion script")
}

/// clap_complete's bash script names its states two ways for a hyphenated binary: the loop
/// that reads the words arrives at `webhook__inbox__subcmd__events`, while the `case` arms
/// that complete each state are spelt `webhook__subcmd__inbox__subcmd__events`, so nothing
/// past the first word ever completed (clap issue 6421, open upstream). The arms are given
/// the loop's spelling.
fn mend_bash(script: &str) -> String {
    script.replace("webhook__subcmd__inbox", "webhook__inbox")
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

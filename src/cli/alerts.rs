//! `webhook-inbox alerts test`: a test notice to each channel of `[[alerts]]`, straight from
//! this process (no server, no store), with what each channel answered.

use clap::Subcommand;

use super::client::CliError;
use crate::alerts::channel::{Channel, test_notice};
use crate::alerts::conditions::link;
use crate::config::Settings;
use crate::domain::time::now_ms;

#[derive(Debug, Subcommand)]
pub enum AlertsCommand {
    /// Send a test notice to each channel; exit 3 if any did not take it.
    Test,
}

pub fn run(config: Option<&std::path::Path>, command: AlertsCommand) -> anyhow::Result<()> {
    let AlertsCommand::Test = command;
    let settings = match Settings::load(config, std::env::vars())? {
        Some(settings) => settings,
        None => {
            anyhow::bail!("no config file: `[[alerts]]` channels are set in one (--config FILE)")
        }
    };
    if settings.alerts.is_empty() {
        anyhow::bail!("the config names no `[[alerts]]` channel");
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut failed = Vec::new();
    for alert in &settings.alerts {
        let channel = Channel::new(alert)?;
        let now = now_ms();
        let notice = test_notice(
            &channel.name,
            &link(settings.public_url.as_deref(), "overview"),
            now,
        );
        match runtime.block_on(channel.send(&notice, now)) {
            Ok(status) => println!("{}: sent (HTTP {status})", channel.name),
            Err(e) => {
                println!("{}: failed: {e:#}", channel.name);
                failed.push(channel.name.clone());
            }
        }
    }
    if !failed.is_empty() {
        return Err(CliError::Unreachable(format!(
            "the test notice did not reach: {}",
            failed.join(", ")
        ))
        .into());
    }
    Ok(())
}

use clap::Parser as _;

/// For the whole binary, as the transform workers are its subcommand: see Cargo.toml.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let cli = webhook_inbox::cli::Cli::parse();
    match webhook_inbox::cli::run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(webhook_inbox::cli::exit_code(&e))
        }
    }
}

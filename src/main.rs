//! The permitd server binary.

use clap::Parser;
use permitd::config::Config;

/// The server's allocator gives freed memory back to the OS (see Cargo.toml).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    // `--print-command-docs` writes the command reference generated from the command table.
    if std::env::args().nth(1).as_deref() == Some("--print-command-docs") {
        print!("{}", permitd::command::docs::markdown());
        return;
    }
    let config = Config::parse();
    let filter = tracing_subscriber::EnvFilter::try_new(&config.log_level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    if let Err(e) = permitd::server::run(config) {
        tracing::error!(error = %e, "permitd failed");
        std::process::exit(1);
    }
}

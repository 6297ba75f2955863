//! The permitd server binary.

use clap::Parser;
use permitd::config::Config;

/// The server's allocator gives freed memory back to the OS (see `permitd::alloc`).
#[global_allocator]
static GLOBAL: permitd::alloc::ServerAlloc = permitd::alloc::ServerAlloc;

/// Keeps transparent huge pages off for this process. mimalloc gives memory back in 64 KiB
/// pieces; with THP, khugepaged fills such holes back to whole 2 MiB pages, so the RSS grew again
/// while idle after a load (measured: 29.8 MB after the soak, 50 MB a minute later, 38 MB of it
/// huge pages; 15 MB instead of 5 MB before the load).
fn disable_transparent_huge_pages() {
    // SAFETY: PR_SET_THP_DISABLE takes integer arguments and touches no memory of ours.
    if unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) } != 0 {
        eprintln!(
            "permitd: could not turn transparent huge pages off: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Makes every panic end the process, with status 1, once it is logged with its thread and
/// location. tokio catches the panic of a task, and its thread goes on: a shard whose timer or
/// log-flushing task died would leave acquires parked past their time-outs, or every reply
/// waiting for a durable LSN that no longer advances. An invariant that fails is better a
/// restart that replays the log, as Redis's `serverAssert` crashes the server.
fn exit_on_panic() {
    std::panic::set_hook(Box::new(|info| {
        let thread = std::thread::current();
        let thread = thread.name().unwrap_or("<unnamed>");
        let location = info.location().map(|l| l.to_string()).unwrap_or_default();
        let message = info.payload_as_str().unwrap_or("(not a string)");
        if tracing::dispatcher::has_been_set() {
            tracing::error!(
                thread,
                %location,
                "panicked: {message}; exiting so that a restart replays the log"
            );
        } else {
            eprintln!("permitd: thread '{thread}' panicked at {location}: {message}");
        }
        // Only with RUST_BACKTRACE=1 (or RUST_LIB_BACKTRACE=1), as the default hook.
        let backtrace = std::backtrace::Backtrace::capture();
        if backtrace.status() == std::backtrace::BacktraceStatus::Captured {
            eprintln!("{backtrace}");
        }
        std::process::exit(1);
    }));
}

fn main() {
    exit_on_panic();
    permitd::alloc::init();
    disable_transparent_huge_pages();
    // `--print-command-docs` writes the command reference generated from the command table.
    if std::env::args().nth(1).as_deref() == Some("--print-command-docs") {
        print!("{}", permitd::command::docs::markdown());
        return;
    }
    let config = Config::parse();
    let filter =
        tracing_subscriber::EnvFilter::try_new(permitd::cluster::log_filter(&config.log_level))
            .unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new(permitd::cluster::log_filter("info"))
            });
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

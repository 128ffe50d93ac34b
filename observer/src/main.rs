//! `canaryscope`: node-level eBPF observer for GPU and CPU inference workloads.
//! Everything lives in the library; this only parses and dispatches.
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = match observer::cli::parse() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    env_logger::Builder::new().parse_filters(&cli.log_level).format_target(false).init();
    observer::cli::dispatch(cli.command)
}

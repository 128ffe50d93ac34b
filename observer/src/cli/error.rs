//! Errors at the command-line edge: one clear line on stderr and an exit
//! status that tells a script whether the input or the machine was wrong.
use std::process::ExitCode;

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The user asked for something that cannot work as given (exit 2).
    #[error("{0}")]
    Usage(String),
    /// The machine or kernel refused (exit 1).
    #[error("{0}")]
    Runtime(String),
}

impl CliError {
    pub fn usage(msg: impl Into<String>) -> Self {
        Self::Usage(msg.into())
    }

    pub fn runtime(msg: impl Into<String>) -> Self {
        Self::Runtime(msg.into())
    }

    pub fn report(&self) -> ExitCode {
        eprintln!("canaryscope: {self}");
        match self {
            Self::Usage(_) => ExitCode::from(2),
            Self::Runtime(_) => ExitCode::from(1),
        }
    }
}

/// Loading eBPF programs needs root (CAP_BPF + CAP_PERFMON + CAP_SYS_ADMIN for
/// some attach types); say so before the kernel answers with a bare EPERM.
pub fn require_root(command: &str) -> Result<(), CliError> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err(CliError::usage(format!(
            "`{command}` loads eBPF programs and needs root (CAP_BPF, CAP_PERFMON): run it with sudo"
        )));
    }
    Ok(())
}

/// Clap's usage errors span several lines ("error: ...", the usage, a hint);
/// keep the first, without its "error: " tag, and point at --help.
pub fn one_line_clap(rendered: &str) -> String {
    let first = rendered.lines().find(|l| !l.trim().is_empty()).unwrap_or("invalid command line");
    let first = first.strip_prefix("error: ").unwrap_or(first);
    format!("{first} (see canaryscope --help)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clap_errors_become_one_line() {
        let rendered = "error: unexpected argument '--nope' found\n\nUsage: canaryscope trace [OPTIONS]\n\nFor more information, try '--help'.\n";
        assert_eq!(one_line_clap(rendered), "unexpected argument '--nope' found (see canaryscope --help)");
    }
}

//! The error every command returns: one clear line on stderr and an exit
//! status that tells a script whether the input or the machine was wrong.
//! A leaf: the data path returns its own typed errors, and each command
//! says which of them are the user's mistake.
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

//! How a command ends: its exit code, and the one-line error for exit 2.

use std::process::ExitCode;

/// A successful run's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exit {
    /// 0: done.
    Ok,
    /// 1: the lock is not held (inspect) or nothing was held (release).
    NotFound,
}

/// Exit 2 with a message (already free of passwords).
#[derive(Debug)]
pub(crate) struct CliError {
    message: String,
}

impl CliError {
    pub(crate) fn new(message: impl Into<String>) -> CliError {
        CliError {
            message: message.into(),
        }
    }
}

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        match exit {
            Exit::Ok => ExitCode::SUCCESS,
            Exit::NotFound => ExitCode::from(1),
        }
    }
}

/// The exit code of an error.
pub(crate) const ERROR: u8 = 2;

//! `lockctl`: see and operate the locks of `lock-runtime` in Redis or etcd.

mod cli;
mod error;
#[cfg(feature = "etcd")]
mod etcd;
mod format;
mod glob;
mod holds;
mod inspect;
mod list;
mod release;
mod target;
mod watch;

use std::process::ExitCode;

use clap::Parser as _;

use crate::cli::{Cli, Command};
use crate::error::{CliError, Exit};
use crate::target::Target;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(exit) => exit.into(),
        Err(err) => {
            eprintln!("lockctl: {err}");
            ExitCode::from(error::ERROR)
        }
    }
}

async fn run(cli: Cli) -> Result<Exit, CliError> {
    let target = Target::from_args(&cli.global)?;
    let json = cli.global.json;
    match cli.command {
        Command::List { pattern } => list::run(&target, &pattern, json).await,
        Command::Inspect { key } => inspect::run(&target, &key, json).await,
        Command::Release { key, force, yes } => release::run(&target, &key, force, yes, json).await,
        Command::Watch { pattern, count } => watch::run(&target, &pattern, count, json).await,
    }
}

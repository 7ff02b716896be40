//! The `lmsp` binary: the composition root. It reads flags and environment, builds the adapters,
//! hands them to the app, and serves; or runs an offline command on a data directory. No use
//! case lives here.

mod cli;
mod datadir;
mod logging;
mod offline;
mod serve;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command, LogFormat};

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Every file any command creates (the database, its WAL, a backup) is its owner's only:
    // they hold prompts and outputs.
    datadir::private_files();
    let format = match &cli.command {
        Command::Serve(args) => args.log_format,
        _ => LogFormat::Text,
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            logging::print_error(format, &error);
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        match cli.command {
            Command::Serve(args) => serve::serve(*args).await,
            Command::Clients(command) => offline::clients(command).await,
            Command::Models(command) => offline::models(command).await,
            Command::Backup { out, data } => offline::backup(&out, &data),
        }
    })
}

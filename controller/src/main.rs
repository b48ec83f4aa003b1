//! `etcd-controller`: the etcd operator's controller process. See `--help`.
//!
//! `etcd-controller restore fetch|place` are the steps the operator's image runs as init
//! containers of a restored cluster's first member (see `etcd_controller::in_pod::seed`);
//! `etcd-controller backup save|verify` what it runs in the pods that mount a claim for a
//! backup or a restore of storage type PVC (see `etcd_controller::in_pod::claim_command`).

use std::process::ExitCode;

use clap::Parser;
use etcd_controller::app;
use etcd_controller::args::Cli;
use etcd_controller::in_pod::{Subcommand, claim_command, seed};

#[tokio::main]
async fn main() -> ExitCode {
    // kube's and object_store's rustls clients need a process-wide crypto provider; an error
    // means one is set.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    match cli.step {
        Some(Subcommand::Restore(command)) => match seed::run(command).await {
            Ok(done) => {
                println!("etcd-controller restore: {done}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!(
                    "etcd-controller restore: {}",
                    app::error_chain(&anyhow::Error::new(e))
                );
                ExitCode::FAILURE
            }
        },
        Some(Subcommand::Backup(command)) => {
            let (report, ok) = claim_command::run(command).await;
            let words = report.message.unwrap_or_default();
            if ok {
                println!("etcd-controller backup: {words}");
                ExitCode::SUCCESS
            } else {
                eprintln!(
                    "etcd-controller backup: {}: {words}",
                    report.reason.unwrap_or_default()
                );
                ExitCode::FAILURE
            }
        }
        None => match app::run(cli.args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                let message = app::error_chain(&e);
                // Once logging is up the error goes to the log (text or JSON), else to stderr.
                if tracing::dispatcher::has_been_set() {
                    tracing::error!(error = %message, "etcd-controller failed");
                } else {
                    eprintln!("etcd-controller: {message}");
                }
                ExitCode::FAILURE
            }
        },
    }
}

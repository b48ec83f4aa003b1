//! `etcd-controller`: the etcd operator's controller process. See `--help`.

use std::process::ExitCode;

use clap::Parser;
use etcd_controller::app;
use etcd_controller::args::Args;

#[tokio::main]
async fn main() -> ExitCode {
    // kube's rustls client needs a process-wide crypto provider; an error means one is set.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse();
    match app::run(args).await {
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
    }
}

//! `etcd-webhook`: the EtcdCluster admission webhook. Parses the flags and hands over to the
//! library; see `etcd-webhook --help`.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    etcd_webhook::main(etcd_webhook::Args::parse())
}

//! The process shell of both binaries (the webhook and the controller), written once so that
//! they take their flags, log, stop and answer probes the same way: a crate of its own, so
//! `etcd-shared` is the API types and rules only.
//!
//! One job a module:
//!
//! - [`listen`]: listen addresses as Kubernetes components take them (`0`, `:PORT`,
//!   `IP:PORT`, `[IPv6]:PORT`, `HOST:PORT`) and how they are bound.
//! - [`duration`]: durations in Go's `time.ParseDuration` grammar (`10s`, `1.5s`, `1h30m`).
//! - [`logging`]: tracing to stderr as text or JSON; `--log-level`, then `RUST_LOG`, then
//!   `info`; colour only on a terminal.
//! - [`signals`]: the shutdown trigger; the first SIGTERM/SIGINT pulls it, the second exits 130.
//! - [`connections`]: the cap on open connections and the idle timeout of every listener.
//! - [`admin`]: the plain-HTTP probe (`/healthz`, `/readyz`) and metrics (`/metrics`) servers,
//!   and the supervision of every server of the process.

#![forbid(unsafe_code)]

pub mod admin;
pub mod connections;
pub mod listen;
pub mod logging;
pub mod signals;

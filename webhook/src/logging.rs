//! Logging: tracing to stderr, as text or JSON, filtered by `--log-level`.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::args::LogFormat;

/// Why logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    /// `--log-level` is not a valid tracing filter.
    #[error("invalid --log-level {filter:?}: {source}")]
    Filter {
        /// The filter given.
        filter: String,
        /// What is wrong with it.
        source: tracing_subscriber::filter::ParseError,
    },
    /// A global subscriber is already installed.
    #[error("cannot install the log subscriber: {0}")]
    Install(String),
}

/// Installs the global subscriber: `format` lines on stderr, filtered by `filter` (tracing
/// `EnvFilter` syntax, such as `info` or `info,etcd_webhook=debug`).
pub fn init(format: LogFormat, filter: &str) -> Result<(), LoggingError> {
    let env_filter = EnvFilter::builder()
        .parse(filter)
        .map_err(|source| LoggingError::Filter {
            filter: filter.to_string(),
            source,
        })?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(env_filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
    };
    result.map_err(|e| LoggingError::Install(e.to_string()))
}

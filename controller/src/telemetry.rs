//! Logging: a `tracing` subscriber writing text or JSON lines to stderr, filtered by
//! `--log-level` (EnvFilter syntax) or, when set, `$RUST_LOG`.

use tracing_subscriber::EnvFilter;

use crate::args::LogFormat;

/// The environment variable that overrides `--log-level`.
pub const RUST_LOG_ENV: &str = "RUST_LOG";

/// Why logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The filter is not valid EnvFilter syntax.
    #[error("invalid log filter {filter:?}: {source}")]
    Filter {
        /// The filter as given.
        filter: String,
        /// What was wrong with it.
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },
    /// A global subscriber was already installed.
    #[error("cannot install the log subscriber: {0}")]
    Install(String),
}

/// The filter in force: `$RUST_LOG` when set and not empty, else `log_level`.
pub fn filter_directives(log_level: &str, rust_log: Option<&str>) -> String {
    match rust_log.map(str::trim) {
        Some(s) if !s.is_empty() => s.to_string(),
        _ => log_level.to_string(),
    }
}

/// Parses EnvFilter directives.
pub fn env_filter(directives: &str) -> Result<EnvFilter, TelemetryError> {
    EnvFilter::builder()
        .parse(directives)
        .map_err(|source| TelemetryError::Filter {
            filter: directives.to_string(),
            source,
        })
}

/// Installs the global subscriber. Call once, early in `main`.
pub fn init(format: LogFormat, log_level: &str) -> Result<(), TelemetryError> {
    let directives = filter_directives(log_level, std::env::var(RUST_LOG_ENV).ok().as_deref());
    let filter = env_filter(&directives)?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
    };
    result.map_err(|e| TelemetryError::Install(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_log_overrides_the_flag() {
        assert_eq!(filter_directives("info", None), "info");
        assert_eq!(filter_directives("info", Some("")), "info");
        assert_eq!(filter_directives("info", Some("debug")), "debug");
    }

    #[test]
    fn filters_are_validated() {
        env_filter("info").unwrap();
        env_filter("info,etcd_controller=debug,kube=warn").unwrap();
        assert!(matches!(
            env_filter("info,kube=loud"),
            Err(TelemetryError::Filter { .. })
        ));
    }
}

//! Logging: a `tracing` subscriber writing text or JSON lines to stderr.
//!
//! The filter (tracing `EnvFilter` syntax, such as `info` or `info,kube=warn`) is, in this
//! order: `--log-level` when given (on the command line or through the binary's own
//! `ETCD_*_LOG_LEVEL` variable), else `$RUST_LOG` when set and not empty, else `info`.
//! Text lines are coloured only when stderr is a terminal.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// The variable read when `--log-level` is not given.
pub const RUST_LOG_ENV: &str = "RUST_LOG";

/// The filter when neither `--log-level` nor `$RUST_LOG` is given.
pub const DEFAULT_FILTER: &str = "info";

/// How log lines are written (a clap `ValueEnum`: `text`, `json`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object a line.
    Json,
}

/// Why logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    /// The filter is not valid `EnvFilter` syntax.
    #[error("invalid log filter {filter:?} (from {from}): {source}")]
    Filter {
        /// The filter as given.
        filter: String,
        /// Where it came from (`--log-level`, `$RUST_LOG`).
        from: &'static str,
        /// What is wrong with it.
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },
    /// A global subscriber is already installed.
    #[error("cannot install the log subscriber: {0}")]
    Install(String),
}

/// The filter in force and where it came from: `log_level` when given, else `rust_log` when
/// set and not blank, else [`DEFAULT_FILTER`].
pub fn filter_directives<'a>(
    log_level: Option<&'a str>,
    rust_log: Option<&'a str>,
) -> (&'a str, &'static str) {
    match (log_level, rust_log.map(str::trim)) {
        (Some(flag), _) => (flag, "--log-level"),
        (None, Some(env)) if !env.is_empty() => (env, "$RUST_LOG"),
        _ => (DEFAULT_FILTER, "the default"),
    }
}

/// Parses the filter [`filter_directives`] picks.
pub fn env_filter(
    log_level: Option<&str>,
    rust_log: Option<&str>,
) -> Result<EnvFilter, LoggingError> {
    let (directives, from) = filter_directives(log_level, rust_log);
    EnvFilter::builder()
        .parse(directives)
        .map_err(|source| LoggingError::Filter {
            filter: directives.to_string(),
            from,
            source,
        })
}

/// Installs the global subscriber: `format` lines on stderr, filtered as the module documentation
/// says. Call once, early in `main`.
pub fn init(format: LogFormat, log_level: Option<&str>) -> Result<(), LoggingError> {
    let rust_log = std::env::var(RUST_LOG_ENV).ok();
    let filter = env_filter(log_level, rust_log.as_deref())?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
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
    result.map_err(|e| LoggingError::Install(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precedence_flag_then_rust_log_then_info() {
        for (flag, rust_log, want) in [
            (Some("warn"), Some("debug"), ("warn", "--log-level")),
            (Some("warn"), None, ("warn", "--log-level")),
            (
                None,
                Some("debug,kube=warn"),
                ("debug,kube=warn", "$RUST_LOG"),
            ),
            (None, Some("  "), ("info", "the default")),
            (None, Some(""), ("info", "the default")),
            (None, None, ("info", "the default")),
        ] {
            assert_eq!(
                filter_directives(flag, rust_log),
                want,
                "{flag:?} {rust_log:?}"
            );
        }
        env_filter(Some("info,etcd_controller=debug,kube=warn"), None).unwrap();
        let err = env_filter(None, Some("info,kube=loud")).unwrap_err();
        assert!(err.to_string().contains("$RUST_LOG"), "{err}");
        assert!(matches!(
            env_filter(Some("info,kube=loud"), None),
            Err(LoggingError::Filter {
                from: "--log-level",
                ..
            })
        ));
    }
}

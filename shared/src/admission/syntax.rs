//! Syntax checks of Kubernetes names, label keys and values, and environment variable names,
//! matching the API server's own validation so a bad value is refused at admission and not
//! when the controller creates a pod from it.

/// A DNS-1123 label: lowercase alphanumerics and '-', starting and ending alphanumeric.
pub(crate) fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A DNS-1035 label (what Service names must be): a DNS-1123 label starting with a letter.
pub(crate) fn is_dns1035_label(s: &str) -> bool {
    is_dns1123_label(s) && s.starts_with(|c: char| c.is_ascii_lowercase())
}

/// A DNS-1123 subdomain (Secret names, label prefixes, domains).
pub(crate) fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

/// The name part of a qualified name or a label value: up to 63 alphanumerics, '-', '_'
/// and '.', starting and ending alphanumeric.
fn is_qualified_name_part(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// A label or annotation key: `[prefix/]name`.
pub(crate) fn is_qualified_name(s: &str) -> bool {
    match s.split_once('/') {
        Some((prefix, name)) => is_dns1123_subdomain(prefix) && is_qualified_name_part(name),
        None => is_qualified_name_part(s),
    }
}

/// A label value: empty, or a qualified name part.
pub(crate) fn is_label_value(s: &str) -> bool {
    s.is_empty() || is_qualified_name_part(s)
}

/// An environment variable name as the API server accepts it: `[-._a-zA-Z][-._a-zA-Z0-9]*`.
pub(crate) fn is_env_var_name(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
        && !s.starts_with(|c: char| c.is_ascii_digit())
}

/// How many characters of a user's value a message quotes.
pub(crate) const SHOWN_CHARS: usize = 64;

/// At most [`SHOWN_CHARS`] characters of a user's `value`, then how long it is: every
/// message that names a user's value goes through this or [`quoted`], so a 3 MiB label makes
/// a short message, log line and response.
pub(crate) fn shown(value: &str) -> String {
    match value.char_indices().nth(SHOWN_CHARS) {
        None => value.to_string(),
        Some((end, _)) => format!(
            "{}... ({} characters)",
            &value[..end],
            value.chars().count()
        ),
    }
}

/// [`shown`] in double quotes, with escapes.
pub(crate) fn quoted(value: &str) -> String {
    match value.char_indices().nth(SHOWN_CHARS) {
        None => format!("{value:?}"),
        Some((end, _)) => format!(
            "{:?}... ({} characters)",
            &value[..end],
            value.chars().count()
        ),
    }
}

/// `text` cut to at most `max` bytes (at a character boundary), with its length after the
/// cut: the last guard of every field path and message a report holds, for a value a rule
/// quoted without [`shown`].
pub fn clipped(text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &text[..end], text.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_quoted_short() {
        assert_eq!(shown("3.6.16"), "3.6.16");
        assert_eq!(quoted("a\"b"), "\"a\\\"b\"");
        let long = "é".repeat(3 << 20);
        assert_eq!(
            shown(&long),
            format!("{}... (3145728 characters)", "é".repeat(64))
        );
        assert!(quoted(&long).len() < 200);
        let cut = clipped(long.clone(), 101);
        assert!(cut.starts_with(&"é".repeat(50)) && cut.ends_with("... (6291456 bytes)"));
        assert_eq!(clipped("short".into(), 101), "short");
    }

    #[test]
    fn labels_and_names() {
        assert!(is_dns1035_label("etcd-a1"));
        assert!(!is_dns1035_label("1etcd"));
        assert!(!is_dns1035_label("Etcd"));
        assert!(!is_dns1035_label("etcd-"));
        assert!(is_dns1123_subdomain("my.secret-1"));
        assert!(!is_dns1123_subdomain("my..secret"));
        assert!(is_qualified_name("example.com/team_A"));
        assert!(!is_qualified_name("example.com/"));
        assert!(!is_qualified_name("-team"));
        assert!(is_label_value(""));
        assert!(!is_label_value(&"a".repeat(64)));
        assert!(is_env_var_name("ETCD_QUOTA_BACKEND_BYTES"));
        assert!(is_env_var_name("my.var-1"));
        assert!(!is_env_var_name("1VAR"));
        assert!(!is_env_var_name("MY VAR"));
    }
}

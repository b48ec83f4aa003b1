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

#[cfg(test)]
mod tests {
    use super::*;

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

//! Image repository names as the kubelet parses them (`github.com/distribution/reference`,
//! `ParseNormalizedNamed`): a pod whose image does not parse fails with `InvalidImageName`
//! on the node, long after the API server accepted it (the API server checks only that an
//! image has no surrounding whitespace).
//!
//! The grammar of a repository (a name without tag or digest):
//!
//! ```text
//! name             := [domain '/'] remote-name
//! domain           := host [':' port-number]
//! host             := domain-name | '[' IPv6 hex digits and ':' ']'
//! domain-name      := domain-component ['.' domain-component]*
//! domain-component := /([a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])/
//! port-number      := /[0-9]+/
//! remote-name      := path-component ['/' path-component]*
//! path-component   := alpha-numeric [separator alpha-numeric]*
//! alpha-numeric    := /[a-z0-9]+/
//! separator        := /[_.]|__|[-]+/
//! ```
//!
//! The first component is the domain when it holds a `.` or a `:`, is `localhost`, or has an
//! uppercase letter; otherwise the name is on Docker Hub (`etcd` is
//! `docker.io/library/etcd`). The normalized name is at most 255 characters, and a bare
//! 64-digit hexadecimal string is refused (it reads as an image ID).

/// The longest normalized name.
pub const NAME_TOTAL_LENGTH_MAX: usize = 255;

/// Why `repo` is not an image repository the kubelet can pull, or `Ok` with its normalized
/// form (`etcd` -> `docker.io/library/etcd`).
pub fn parse_repository(repo: &str) -> Result<String, String> {
    if repo.is_empty() {
        return Err("is empty".into());
    }
    if repo.len() == 64 && repo.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return Err("cannot be a 64-character hexadecimal string (that is an image ID)".into());
    }
    if repo.contains('@') {
        return Err("has a digest (@...); the image is REPOSITORY:vVERSION".into());
    }
    let (domain, remainder) = split_domain(repo);
    if remainder.contains(':') {
        return Err("has a tag (:...); the tag comes from spec.version".into());
    }
    if remainder.to_lowercase() != remainder {
        return Err("must be lowercase after the registry host".into());
    }
    check_domain(domain)?;
    for component in remainder.split('/') {
        check_path_component(component)?;
    }
    let normalized = format!("{domain}/{remainder}");
    if normalized.len() > NAME_TOTAL_LENGTH_MAX {
        return Err(format!(
            "is {} characters long as {}/...; an image name is at most {NAME_TOTAL_LENGTH_MAX}",
            normalized.len(),
            domain
        ));
    }
    Ok(normalized)
}

/// `splitDockerDomain`: the registry host and the path.
fn split_domain(name: &str) -> (&str, String) {
    let (domain, remainder) = match name.split_once('/') {
        Some((first, rest))
            if first.contains(['.', ':'])
                || first == "localhost"
                || first.to_lowercase() != first =>
        {
            (first, rest.to_string())
        }
        _ => ("docker.io", name.to_string()),
    };
    let domain = if domain == "index.docker.io" {
        "docker.io"
    } else {
        domain
    };
    if domain == "docker.io" && !remainder.contains('/') {
        return (domain, format!("library/{remainder}"));
    }
    (domain, remainder)
}

fn check_domain(domain: &str) -> Result<(), String> {
    let bad = || {
        Err(format!(
            "has no valid registry host: {} is not HOST[:PORT]",
            super::syntax::quoted(domain)
        ))
    };
    let (host, port) = if let Some(rest) = domain.strip_prefix('[') {
        let Some((ip, after)) = rest.split_once(']') else {
            return bad();
        };
        if ip.is_empty() || !ip.bytes().all(|b| b.is_ascii_hexdigit() || b == b':') {
            return bad();
        }
        match after {
            "" => ("", None),
            p => match p.strip_prefix(':') {
                Some(port) => ("", Some(port)),
                None => return bad(),
            },
        }
    } else {
        match domain.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (domain, None),
        }
    };
    if port.is_some_and(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit())) {
        return bad();
    }
    if !domain.starts_with('[') {
        let component_ok = |c: &str| {
            !c.is_empty()
                && c.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !c.starts_with('-')
                && !c.ends_with('-')
        };
        if !host.split('.').all(component_ok) {
            return bad();
        }
    }
    Ok(())
}

fn check_path_component(component: &str) -> Result<(), String> {
    let bad = || {
        Err(format!(
            "has an invalid path component {}: lowercase letters and digits, separated by one '.', one or two '_', or '-'s",
            super::syntax::quoted(component)
        ))
    };
    let bytes = component.as_bytes();
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if bytes.is_empty() || !alnum(bytes[0]) || !alnum(bytes[bytes.len() - 1]) {
        return bad();
    }
    let mut i = 0;
    while i < bytes.len() {
        if alnum(bytes[i]) {
            i += 1;
            continue;
        }
        // A separator: '.', '_', '__' or a run of '-', then an alphanumeric.
        let start = i;
        match bytes[i] {
            b'.' => i += 1,
            b'_' => {
                i += 1;
                if bytes.get(i) == Some(&b'_') {
                    i += 1;
                }
            }
            b'-' => {
                while bytes.get(i) == Some(&b'-') {
                    i += 1;
                }
            }
            _ => return bad(),
        }
        if i == start || !bytes.get(i).copied().is_some_and(alnum) {
            return bad();
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repositories_the_kubelet_parses() {
        for (repo, normalized) in [
            ("quay.io/coreos/etcd", "quay.io/coreos/etcd"),
            (
                "gcr.io/etcd-development/etcd",
                "gcr.io/etcd-development/etcd",
            ),
            ("registry.k8s.io/etcd", "registry.k8s.io/etcd"),
            ("etcd", "docker.io/library/etcd"),
            ("bitnami/etcd", "docker.io/bitnami/etcd"),
            ("docker.io/etcd", "docker.io/library/etcd"),
            ("index.docker.io/a/b", "docker.io/a/b"),
            ("localhost/etcd", "localhost/etcd"),
            ("localhost:5000/team/etcd", "localhost:5000/team/etcd"),
            ("10.0.0.1:5000/etcd", "10.0.0.1:5000/etcd"),
            ("[::1]:5000/etcd", "[::1]:5000/etcd"),
            ("Registry.Example.com/etcd", "Registry.Example.com/etcd"),
            (
                "registry.example.test/a__b/c-d/e.f/g--h",
                "registry.example.test/a__b/c-d/e.f/g--h",
            ),
        ] {
            assert_eq!(parse_repository(repo).as_deref(), Ok(normalized), "{repo}");
        }
    }

    #[test]
    fn repositories_the_kubelet_refuses() {
        for (repo, why) in [
            ("", "empty"),
            ("quay.io/coreos/etcd:v3.5.0", "tag"),
            ("etcd:latest", "tag"),
            ("quay.io/coreos/etcd@sha256:abc", "digest"),
            ("quay.io/CoreOS/etcd", "lowercase"),
            ("Etcd", "lowercase"),
            ("quay.io//etcd", "path component \"\""),
            ("quay.io/coreos/etcd/", "path component \"\""),
            ("quay.io/-etcd", "path component"),
            ("quay.io/etcd-", "path component"),
            ("quay.io/et..cd", "path component"),
            ("quay.io/et___cd", "path component"),
            ("quay.io/et._cd", "path component"),
            ("quay.io/et cd", "path component"),
            ("quay.io:/etcd", "registry host"),
            ("quay.io:50a/etcd", "registry host"),
            ("-quay.io/etcd", "registry host"),
            ("quay..io/etcd", "registry host"),
            ("[::1/etcd", "registry host"),
            ("[]:5000/etcd", "registry host"),
            (
                "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
                "hexadecimal",
            ),
        ] {
            let got = parse_repository(repo);
            assert!(
                got.as_ref().is_err_and(|e| e.contains(why)),
                "{repo:?}: want an error containing {why:?}, got {got:?}"
            );
        }
        let long = format!("quay.io/{}", "a".repeat(250));
        assert!(parse_repository(&long).is_err_and(|e| e.contains("at most 255")));
    }
}

//! A kubelet's atomic writer: how `secret`, `configMap`, `downwardAPI` and `projected` volumes
//! are laid out, so that a file set can be replaced while processes read it.
//!
//! ```text
//! <volume>/..2026_12_06_19_01_30.123456/tls.crt   the files of one version
//! <volume>/..data -> ..2026_12_06_19_01_30.123456 the current version
//! <volume>/tls.crt -> ..data/tls.crt              what programs are given
//! ```
//!
//! An update ([`write()`]) writes the new version into a new timestamped directory, points a new
//! `..data_tmp` symlink at it, renames that over `..data` (one atomic `rename(2)`), adds the
//! user-visible symlinks of new top-level paths, removes those of paths no longer in the set,
//! and removes the old version's directory. A program that resolves `..data` once (or opens a
//! single file) sees the old set or the new one, never a mix; a program that reads two files
//! one after the other through their symlinks can straddle a swap, as with a real kubelet.
//! Kubernetes' `pkg/volume/util/atomic_writer.go` does the same.

use std::collections::BTreeMap;
use std::io;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

/// The symlink naming the current version's directory.
pub const DATA_DIR: &str = "..data";
/// The symlink renamed over [`DATA_DIR`].
const DATA_DIR_TMP: &str = "..data_tmp";

/// One file of a volume: its content and permission bits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileProjection {
    /// The content.
    pub data: Vec<u8>,
    /// Permission bits (`& 0o777` is used).
    pub mode: u32,
}

/// The files of a volume by relative path (`a`, `sub/b`).
pub type Payload = BTreeMap<String, FileProjection>;

/// `path` made relative and clean (no empty or `.` components), or why it cannot be in a
/// volume: a `..` component, or a first component starting with `..` (reserved for the
/// writer's own entries).
pub fn clean_path(path: &str) -> Result<String, String> {
    let parts: Vec<&str> = path
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    if parts.is_empty() {
        return Err(format!("empty path {path:?}"));
    }
    if parts.contains(&"..") {
        return Err(format!("refusing path {path:?} outside the volume"));
    }
    if parts[0].starts_with("..") {
        return Err(format!(
            "refusing path {path:?}: it must not start with '..'"
        ));
    }
    Ok(parts.join("/"))
}

/// The first component of each path: the user-visible symlinks.
fn top_level(payload: &Payload) -> std::collections::BTreeSet<String> {
    payload
        .keys()
        .filter_map(|p| p.split('/').next())
        .map(str::to_owned)
        .collect()
}

/// The regular files under `dir` (followed through no symlinks) as a payload.
fn read_version(dir: &Path) -> io::Result<Payload> {
    fn walk(root: &Path, relative: &str, out: &mut Payload) -> io::Result<()> {
        for entry in std::fs::read_dir(root.join(relative))? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = if relative.is_empty() {
                name
            } else {
                format!("{relative}/{name}")
            };
            let kind = entry.file_type()?;
            if kind.is_dir() {
                walk(root, &path, out)?;
            } else if kind.is_file() {
                let full = root.join(&path);
                let mode = std::fs::metadata(&full)?.permissions().mode() & 0o777;
                // A file without the owner's read bit (mode 0o000) is rewritten.
                let data = std::fs::read(&full).unwrap_or_default();
                out.insert(path, FileProjection { data, mode });
            }
        }
        Ok(())
    }
    let mut out = Payload::new();
    walk(dir, "", &mut out)?;
    Ok(out)
}

fn same(a: &Payload, b: &Payload) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|((pa, fa), (pb, fb))| {
            pa == pb && fa.data == fb.data && fa.mode & 0o777 == fb.mode & 0o777
        })
}

fn context(what: String) -> impl FnOnce(io::Error) -> io::Error {
    move |e| io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// Makes `dir` hold exactly `payload` (paths as [`clean_path`] returns them) in the layout of
/// the module docs; `dir` is created if needed. Returns the new version's directory name, or
/// `None` when the current version already holds `payload` (nothing is written). Top-level
/// entries that are not the writer's symlinks are left alone.
pub fn write(dir: &Path, payload: &Payload) -> io::Result<Option<String>> {
    for path in payload.keys() {
        if clean_path(path).as_deref() != Ok(path.as_str()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("invalid volume path {path:?}"),
            ));
        }
    }
    std::fs::create_dir_all(dir).map_err(context(format!("creating {}", dir.display())))?;
    let data_link = dir.join(DATA_DIR);
    let old = std::fs::read_link(&data_link)
        .ok()
        .map(|p| p.to_string_lossy().into_owned())
        .filter(|name| name.starts_with("..") && !name.contains('/'));
    let old_payload = old.as_ref().and_then(|o| read_version(&dir.join(o)).ok());
    if let Some(current) = &old_payload
        && same(current, payload)
    {
        // An earlier write may have stopped before its symlinks.
        link_user_visible(dir, payload)?;
        return Ok(None);
    }

    // The new version, in a directory named after the time (as a kubelet names them).
    let stamp = k8s_openapi::jiff::Timestamp::now()
        .strftime("..%Y_%m_%d_%H_%M_%S.")
        .to_string();
    let version = tempfile::Builder::new()
        .prefix(&stamp)
        .tempdir_in(dir)
        .map_err(context(format!(
            "creating a version directory in {}",
            dir.display()
        )))?
        .keep();
    let result = (|| {
        std::fs::set_permissions(&version, std::fs::Permissions::from_mode(0o755))?;
        for (path, file) in payload {
            let target = version.join(path);
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&target, &file.data)
                .map_err(context(format!("writing {}", target.display())))?;
            std::fs::set_permissions(&target, std::fs::Permissions::from_mode(file.mode & 0o777))?;
        }
        Ok::<_, io::Error>(())
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_dir_all(&version);
        return Err(e);
    }
    let version_name = version
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();

    // The swap: one rename(2) of a symlink over `..data`.
    let tmp_link = dir.join(DATA_DIR_TMP);
    match std::fs::remove_file(&tmp_link) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(context(format!("removing {}", tmp_link.display()))(e)),
    }
    std::os::unix::fs::symlink(&version_name, &tmp_link)
        .map_err(context(format!("linking {}", tmp_link.display())))?;
    std::fs::rename(&tmp_link, &data_link)
        .map_err(context(format!("renaming {}", tmp_link.display())))?;

    link_user_visible(dir, payload)?;
    if let Some(old_payload) = &old_payload {
        let keep = top_level(payload);
        for gone in top_level(old_payload).difference(&keep) {
            let link = dir.join(gone);
            if link.is_symlink() {
                let _ = std::fs::remove_file(&link);
            }
        }
    }
    if let Some(old) = old
        && old != version_name
    {
        let _ = std::fs::remove_dir_all(dir.join(old));
    }
    Ok(Some(version_name))
}

/// `NAME -> ..data/NAME` for each top-level path of `payload` (existing ones are kept).
fn link_user_visible(dir: &Path, payload: &Payload) -> io::Result<()> {
    for top in top_level(payload) {
        let link = dir.join(&top);
        if link.symlink_metadata().is_ok() {
            continue;
        }
        std::os::unix::fs::symlink(format!("{DATA_DIR}/{top}"), &link)
            .map_err(context(format!("linking {}", link.display())))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    fn payload(files: &[(&str, &str, u32)]) -> Payload {
        files
            .iter()
            .map(|(p, d, m)| {
                (
                    (*p).to_owned(),
                    FileProjection {
                        data: d.as_bytes().to_vec(),
                        mode: *m,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn paths_are_cleaned_and_checked() {
        assert_eq!(clean_path("/a//./b").unwrap(), "a/b");
        assert!(clean_path("../x").is_err());
        assert!(clean_path("a/../../x").is_err());
        assert!(clean_path("..data").is_err());
        assert!(clean_path("").is_err());
        assert_eq!(clean_path("a/..b").unwrap(), "a/..b");
    }

    #[test]
    fn layout_swap_and_cleanup() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("vol");
        let first = write(
            &dir,
            &payload(&[("tls.crt", "one", 0o644), ("sub/key", "k1", 0o400)]),
        )
        .unwrap()
        .unwrap();
        assert!(first.starts_with("..") && first.len() > "..2026_01_01_00_00_00.".len());
        assert_eq!(
            std::fs::read_link(dir.join(DATA_DIR)).unwrap(),
            Path::new(&first)
        );
        assert_eq!(
            std::fs::read_link(dir.join("tls.crt")).unwrap(),
            Path::new("..data/tls.crt")
        );
        assert_eq!(
            std::fs::read_link(dir.join("sub")).unwrap(),
            Path::new("..data/sub")
        );
        assert_eq!(std::fs::read_to_string(dir.join("sub/key")).unwrap(), "k1");
        let mode = std::fs::metadata(dir.join("sub/key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o400);
        // A file of someone else's at the top level is left alone.
        std::fs::write(dir.join("kubeconfig"), "x").unwrap();

        // The same content: nothing written.
        assert_eq!(
            write(
                &dir,
                &payload(&[("tls.crt", "one", 0o644), ("sub/key", "k1", 0o400)])
            )
            .unwrap(),
            None
        );
        // New content: a new version, `sub` gone, `new` added, the old version removed.
        let second = write(
            &dir,
            &payload(&[("tls.crt", "two", 0o644), ("new", "n", 0o644)]),
        )
        .unwrap()
        .unwrap();
        assert_ne!(first, second);
        assert_eq!(std::fs::read_to_string(dir.join("tls.crt")).unwrap(), "two");
        assert_eq!(std::fs::read_to_string(dir.join("new")).unwrap(), "n");
        assert!(dir.join("sub").symlink_metadata().is_err());
        assert!(!dir.join(&first).exists());
        assert!(!dir.join(DATA_DIR_TMP).exists());
        assert_eq!(
            std::fs::read_to_string(dir.join("kubeconfig")).unwrap(),
            "x"
        );
        // A mode change alone is a change.
        assert!(
            write(
                &dir,
                &payload(&[("tls.crt", "two", 0o600), ("new", "n", 0o644)])
            )
            .unwrap()
            .is_some()
        );
        assert!(write(&dir, &payload(&[("../x", "", 0o644)])).is_err());
    }

    /// A reader that resolves `..data` once sees every key of one version.
    #[test]
    fn readers_never_see_a_mix() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_owned();
        let version = |n: usize| {
            let v = format!("v{n}");
            payload(&[("a", &v, 0o644), ("b", &v, 0o644), ("c/d", &v, 0o644)])
        };
        write(&dir, &version(0)).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let (dir, stop) = (dir.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut consistent = 0;
                while !stop.load(Ordering::SeqCst) {
                    // The version may be removed under us: an error, never a mix.
                    let Ok(current) = std::fs::canonicalize(dir.join(DATA_DIR)) else {
                        continue;
                    };
                    let read = |p: &str| std::fs::read_to_string(current.join(p));
                    if let (Ok(a), Ok(b), Ok(d)) = (read("a"), read("b"), read("c/d")) {
                        assert!(a == b && b == d, "a mix: {a} {b} {d}");
                        consistent += 1;
                    }
                    // Through the user-visible symlinks, one file is always whole.
                    if let Ok(a) = std::fs::read_to_string(dir.join("a")) {
                        assert!(a.starts_with('v'), "{a:?}");
                    }
                }
                consistent
            })
        };
        for n in 1..200 {
            write(&dir, &version(n)).unwrap();
        }
        stop.store(true, Ordering::SeqCst);
        assert!(reader.join().unwrap() > 0);
        let versions = std::fs::read_dir(&dir)
            .unwrap()
            .filter(|e| {
                let e = e.as_ref().unwrap();
                e.file_type().unwrap().is_dir()
            })
            .count();
        assert_eq!(versions, 1, "old versions left behind");
    }
}

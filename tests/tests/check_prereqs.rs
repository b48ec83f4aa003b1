//! `hack/check-prereqs.sh`: a machine that lacks what the demo or the tool builds need is told
//! in a second, with the command that installs it (issue 27, item 1). The script runs with a
//! PATH of stand-ins for the toolchains (each prints the version asked for) beside the real
//! shell utilities it uses, so each missing or outdated piece can be shown.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack/check-prereqs.sh")
}

/// A bin directory with the utilities the script runs, the stand-ins `tools` (name, what it
/// prints) and nothing else.
fn bin_dir(tools: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a temporary directory");
    for util in [
        "sed", "awk", "sort", "head", "df", "mkdir", "dirname", "cat",
    ] {
        let found = ["/usr/bin", "/bin"]
            .iter()
            .map(|d| Path::new(d).join(util))
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("{util} is not on this machine"));
        std::os::unix::fs::symlink(found, dir.path().join(util)).expect("symlink");
    }
    for (name, prints) in tools {
        let path = dir.path().join(name);
        std::fs::write(&path, format!("#!/bin/sh\necho '{prints}'\n")).expect("stand-in");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    dir
}

/// Runs the script for `what` with only `bin` on PATH: its exit code and stderr.
fn run(what: &str, bin: &Path) -> (i32, String) {
    let out = Command::new("/bin/bash")
        .arg(script())
        .arg(what)
        .env_clear()
        .env("PATH", bin)
        .env("HOME", bin)
        .output()
        .expect("the script runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const GO: (&str, &str) = ("go", "go1.26.0");
const RUSTC: (&str, &str) = ("rustc", "rustc 1.95.0 (aaaaaaaaa 2026-10-01)");
const CARGO: (&str, &str) = ("cargo", "cargo 1.95.0");
const PROTOC: (&str, &str) = ("protoc", "libprotoc 3.21.12");
const IP: (&str, &str) = ("ip", "ip utility");
const UNSHARE: (&str, &str) = ("unshare", "unshare from util-linux");

#[test]
fn a_complete_machine_passes() {
    let bin = bin_dir(&[GO, RUSTC, CARGO, PROTOC, IP, UNSHARE]);
    let (code, said) = run("demo", bin.path());
    assert_eq!(code, 0, "{said}");
    assert!(said.is_empty(), "{said}");
}

#[test]
fn missing_packages_are_named_with_the_install_command() {
    let bin = bin_dir(&[GO, RUSTC, CARGO, IP]);
    let (code, said) = run("demo", bin.path());
    assert_eq!(code, 1, "{said}");
    assert!(said.contains("protoc is missing"), "{said}");
    assert!(said.contains("unshare is missing"), "{said}");
    assert!(
        said.contains("apt-get update && apt-get install -y protobuf-compiler util-linux"),
        "{said}"
    );
}

#[test]
fn old_or_absent_toolchains_are_named_with_where_to_get_them() {
    let bin = bin_dir(&[
        ("go", "go1.22.5"),
        ("rustc", "rustc 1.80.0 (aaaaaaaaa 2024-07-21)"),
        CARGO,
        PROTOC,
        IP,
        UNSHARE,
    ]);
    let (code, said) = run("demo", bin.path());
    assert_eq!(code, 1, "{said}");
    assert!(said.contains("Go 1.22.5 is too old"), "{said}");
    assert!(said.contains("https://go.dev/dl/"), "{said}");
    assert!(said.contains("Rust 1.80.0 is too old"), "{said}");
    assert!(said.contains("rustup update stable"), "{said}");
    // No Go at all: where to get it.
    let bin = bin_dir(&[RUSTC, CARGO, PROTOC, IP, UNSHARE]);
    let (code, said) = run("demo", bin.path());
    assert_eq!(code, 1, "{said}");
    assert!(said.contains("Go is not installed"), "{said}");
}

#[test]
fn the_tool_build_asks_only_for_what_it_runs() {
    // No Rust, no protoc: the Go tools build all the same; Azurite needs node and npm.
    let bin = bin_dir(&[GO, ("perl", "perl")]);
    let (code, said) = run("tools", bin.path());
    assert_eq!(code, 1, "{said}");
    assert!(!said.contains("Rust") && !said.contains("protoc"), "{said}");
    assert!(said.contains("apt-get install -y nodejs npm"), "{said}");
}

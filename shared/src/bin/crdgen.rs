//! Prints the CRD manifests (EtcdCluster, EtcdBackup, EtcdRestore), or writes them to their
//! checked-in paths with `--write`: the chart's `crds/` and the replacement manifests in
//! `crds-replace/` (see `etcd_shared::crd::REPLACE_DIR`).

use std::path::Path;
use std::process::ExitCode;

use etcd_shared::crd::{all_crds, replacement_crds};

fn main() -> ExitCode {
    let write = std::env::args().any(|a| a == "--write");
    // Written: the chart's crds/ and the replacement manifests; printed: the chart's alone (one
    // manifest per CRD, for `crdgen | kubectl apply -f -`).
    let replacements = if write {
        replacement_crds()
    } else {
        Vec::new()
    };
    for generated in all_crds().into_iter().chain(replacements) {
        let yaml = match generated.yaml() {
            Ok(y) => y,
            Err(e) => {
                eprintln!("crdgen: {}: {e}", generated.path);
                return ExitCode::FAILURE;
            }
        };
        if write {
            let path = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join(&generated.path);
            if let Some(dir) = path.parent()
                && let Err(e) = std::fs::create_dir_all(dir)
            {
                eprintln!("crdgen: creating {}: {e}", dir.display());
                return ExitCode::FAILURE;
            }
            if let Err(e) = std::fs::write(&path, yaml) {
                eprintln!("crdgen: writing {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
            eprintln!("crdgen: wrote {}", generated.path);
        } else {
            print!("---\n{yaml}");
        }
    }
    ExitCode::SUCCESS
}

//! Prints the CRD manifests (EtcdCluster, EtcdBackup, EtcdRestore), or writes them to their
//! checked-in paths with `--write`.

use std::path::Path;
use std::process::ExitCode;

use etcd_shared::crd::all_crds;

fn main() -> ExitCode {
    let write = std::env::args().any(|a| a == "--write");
    for generated in all_crds() {
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
                .join(generated.path);
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

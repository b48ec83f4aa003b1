//! Prints the EtcdCluster CRD manifest, or writes it to the checked-in path with `--write`.

use std::path::Path;
use std::process::ExitCode;

use etcd_shared::crd::{CRD_MANIFEST_PATH, crd_yaml};

fn main() -> ExitCode {
    let yaml = match crd_yaml() {
        Ok(y) => y,
        Err(e) => {
            eprintln!("crdgen: {e}");
            return ExitCode::FAILURE;
        }
    };
    if std::env::args().any(|a| a == "--write") {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(CRD_MANIFEST_PATH);
        if let Err(e) = std::fs::write(&path, yaml) {
            eprintln!("crdgen: writing {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        eprintln!("crdgen: wrote {CRD_MANIFEST_PATH}");
    } else {
        print!("{yaml}");
    }
    ExitCode::SUCCESS
}

//! Table-driven tests of the EtcdBackup and EtcdRestore rules and the storage rules they
//! share, with their messages.

use super::*;
use crate::types::{EtcdBackup, EtcdRestore};

/// An EtcdBackup of namespace `prod` with the given spec (YAML), as a user would write it.
fn backup(spec: &str) -> EtcdBackup {
    let indented: String = spec.lines().map(|l| format!("  {l}\n")).collect();
    let yaml = format!(
        "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdBackup\nmetadata:\n  name: b\n  namespace: prod\nspec:\n{indented}"
    );
    serde_yaml::from_str(&yaml).unwrap_or_else(|e| panic!("fixture does not parse: {e}\n{yaml}"))
}

fn restore(spec: &str) -> EtcdRestore {
    let indented: String = spec.lines().map(|l| format!("  {l}\n")).collect();
    let yaml = format!(
        "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdRestore\nmetadata:\n  name: r\n  namespace: prod\nspec:\n{indented}"
    );
    serde_yaml::from_str(&yaml).unwrap_or_else(|e| panic!("fixture does not parse: {e}\n{yaml}"))
}

/// A good s3 source, with `extra` lines added or replacing nothing.
const S3: &str = "s3:\n  path: etcd-backups/demo/snapshot.db\n  awsSecret: aws\n";

/// A good backup spec with `extra` lines added.
fn good_backup(extra: &str) -> EtcdBackup {
    backup(&format!(
        "etcdEndpoints: [\"http://demo-client:2379\"]\nstorageType: S3\n{S3}{extra}"
    ))
}

fn good_restore(extra: &str) -> EtcdRestore {
    restore(&format!(
        "etcdCluster:\n  name: demo\nbackupStorageType: S3\n{S3}{extra}"
    ))
}

fn judge_backup(b: &EtcdBackup, old: Option<&EtcdBackup>) -> Result<Vec<String>, Refusal> {
    AdmissionPolicy::default().validate_backup(b, "prod", old)
}

fn judge_restore(r: &EtcdRestore, old: Option<&EtcdRestore>) -> Result<Vec<String>, Refusal> {
    AdmissionPolicy::default().validate_restore(r, old)
}

/// Asserts a refusal with a violation containing `want` whose rule is `rule`.
fn assert_refused(got: Result<Vec<String>, Refusal>, rule: &str, want: &str) {
    let refusal = match got {
        Ok(w) => panic!("want a refusal ({rule}: {want}), got acceptance with {w:?}"),
        Err(r) => r,
    };
    assert!(
        refusal
            .0
            .iter()
            .any(|v| v.rule == rule && v.to_string().contains(want)),
        "want {rule}: {want:?}, got {:#?}",
        refusal.0
    );
}

fn accepted(got: Result<Vec<String>, Refusal>) -> Vec<String> {
    got.unwrap_or_else(|r| panic!("want acceptance, got {r}"))
}

#[test]
fn the_examples_are_accepted_without_warnings() {
    let b: EtcdBackup =
        serde_yaml::from_str(include_str!("../../../examples/etcd-backup.yaml")).expect("parses");
    assert_eq!(
        AdmissionPolicy::default().validate_backup(&b, "default", None),
        Ok(vec![])
    );
    let r: EtcdRestore =
        serde_yaml::from_str(include_str!("../../../examples/etcd-restore.yaml")).expect("parses");
    assert_eq!(judge_restore(&r, None), Ok(vec![]));
}

#[test]
fn backup_endpoints_name_one_cluster_of_the_namespace() {
    let with = |endpoints: &str| {
        backup(&format!(
            "etcdEndpoints: {endpoints}\nstorageType: S3\n{S3}"
        ))
    };
    for ok in [
        "[\"http://demo-client:2379\"]",
        "[\"https://demo-client.prod.svc:2379\"]",
        "[\"http://demo-client.prod.svc.cluster.local:2379\", \"https://demo-0.demo.prod.svc:2379\"]",
    ] {
        assert_eq!(judge_backup(&with(ok), None), Ok(vec![]), "{ok}");
    }
    let cases = [
        (
            "[]",
            "spec.etcdEndpoints: no endpoint is given: name the cluster's client Service",
        ),
        (
            "[\"http://demo-client.other:2379\"]",
            "spec.etcdEndpoints: \"http://demo-client.other:2379\" names namespace \"other\": a backup reads only clusters of its own namespace (\"prod\")",
        ),
        (
            "[\"http://10.0.0.5:2379\"]",
            "names an IP address: name the cluster's client Service instead",
        ),
        (
            "[\"demo-client:2379\"]",
            "is not an http:// or https:// URL",
        ),
        (
            "[\"http://etcd.example.com:2379\"]",
            "names no EtcdCluster: use its client Service",
        ),
        (
            "[\"http://a-client:2379\", \"http://b-client:2379\"]",
            "the endpoints name two clusters, \"a\" and \"b\": a backup reads one cluster",
        ),
    ];
    for (endpoints, want) in cases {
        assert_refused(
            judge_backup(&with(endpoints), None),
            "backup-endpoints",
            want,
        );
    }
}

#[test]
fn storage_types() {
    let with = |t: &str| {
        backup(&format!(
            "etcdEndpoints: [\"http://demo-client:2379\"]\nstorageType: {t}\n{S3}"
        ))
    };
    assert_refused(
        judge_backup(&with("OSS"), None),
        "storage-type-unsupported",
        "spec.storageType: OSS is a storage type of CoreOS' API that this operator does not support; use S3, ABS or GCS (S3: AWS, or any S3-compatible store through s3.endpoint)",
    );
    assert_refused(
        judge_backup(&with("s3"), None),
        "storage-type",
        "spec.storageType: must be S3, ABS, GCS or PVC (CoreOS' OSS is not supported), got \"s3\"",
    );
    assert_refused(
        judge_backup(&with("\"\""), None),
        "storage-type",
        "spec.storageType: is required: set it to S3, ABS or GCS and the matching source (s3, abs or gcs) beside it",
    );
    // ABS and GCS are supported: with the s3 source beside them, theirs is missing.
    assert_refused(
        judge_backup(&with("GCS"), None),
        "storage-source",
        "spec.gcs: is required with storageType GCS: path and optionally gcpSecret",
    );
    assert_refused(
        judge_backup(&with("ABS"), None),
        "storage-source",
        "spec.s3: must not be set with storageType ABS: exactly the source of the storage type (abs) is set",
    );
    // The restore's field has its own name.
    let r = restore(&format!(
        "etcdCluster:\n  name: demo\nbackupStorageType: OSS\n{S3}"
    ));
    assert_refused(
        judge_restore(&r, None),
        "storage-type-unsupported",
        "spec.backupStorageType: OSS is a storage type of CoreOS' API",
    );
}

/// A good abs source (Azurite's well-known account through our endpoint extension).
const ABS: &str = "abs:\n  path: etcd-backups/demo/snapshot.db\n  absSecret: azure\n  endpoint: http://azurite.storage:10000/devstoreaccount1\n";

/// ABS and GCS sources are accepted in backups and restores, CoreOS' shape as written.
#[test]
fn abs_and_gcs_sources_are_accepted() {
    let backup_of = |t: &str, source: &str| {
        backup(&format!(
            "etcdEndpoints: [\"http://demo-client:2379\"]\nstorageType: {t}\n{source}"
        ))
    };
    for (t, source) in [
        ("ABS", ABS.to_string()),
        (
            "ABS",
            "abs:\n  path: c0n-tainer/dir/snap.db\n  absSecret: azure\n".to_string(),
        ),
        (
            "GCS",
            "gcs:\n  path: my_bucket.example/snap.db\n  gcpSecret: gcp\n".to_string(),
        ),
        ("GCS", "gcs:\n  path: etcd-backups/snap.db\n".to_string()),
    ] {
        assert_eq!(
            judge_backup(&backup_of(t, &source), None),
            Ok(vec![]),
            "{source}"
        );
        let r = restore(&format!(
            "etcdCluster:\n  name: demo\nbackupStorageType: {t}\n{source}"
        ));
        assert_eq!(judge_restore(&r, None), Ok(vec![]), "{source}");
    }
}

/// Bad ABS and GCS sources: (storage type, source, rule, message part).
#[test]
fn bad_abs_and_gcs_sources_are_refused_with_the_field_and_the_rule() {
    let cases = [
        (
            "ABS",
            "abs:\n  absSecret: azure\n",
            "abs-path",
            "spec.abs.path: is required: CONTAINER/BLOB of the snapshot",
        ),
        (
            "ABS",
            "abs:\n  path: nocontainer\n  absSecret: azure\n",
            "abs-path",
            "spec.abs.path: must be CONTAINER/BLOB, such as etcd-backups/example/snapshot.db, got \"nocontainer\"",
        ),
        (
            "ABS",
            "abs:\n  path: ab/k\n  absSecret: azure\n",
            "abs-container",
            "spec.abs.path: the container \"ab\" must be 3 to 63 characters long, got 2 (Azure's container naming)",
        ),
        (
            "ABS",
            "abs:\n  path: my_container/k\n  absSecret: azure\n",
            "abs-container",
            "the container \"my_container\" may hold only lowercase letters, digits and '-'",
        ),
        (
            "ABS",
            "abs:\n  path: a--b/k\n  absSecret: azure\n",
            "abs-container",
            "must not hold two adjacent hyphens",
        ),
        (
            "ABS",
            "abs:\n  path: etcd/\n  absSecret: azure\n",
            "abs-blob",
            "spec.abs.path: the blob after \"etcd\"/ is empty",
        ),
        (
            "ABS",
            "abs:\n  path: etcd/a//b\n  absSecret: azure\n",
            "abs-blob",
            "spec.abs.path: the key \"a//b\" has an empty segment",
        ),
        (
            "ABS",
            "abs:\n  path: etcd/k\n",
            "abs-secret",
            "spec.abs.absSecret: is required: the name of a Secret of this namespace with keys storage-account, storage-key and optionally cloud",
        ),
        (
            "ABS",
            "abs:\n  path: etcd/k\n  absSecret: Azure_Secret\n",
            "abs-secret",
            "spec.abs.absSecret: must be a Secret name",
        ),
        (
            "ABS",
            "abs:\n  path: etcd/k\n  absSecret: azure\n  endpoint: azurite:10000\n",
            "abs-endpoint",
            "spec.abs.endpoint: must be empty (the account's host in its cloud) or the Blob service's http:// or https:// URL, such as http://azurite.storage:10000/devstoreaccount1, got \"azurite:10000\": the scheme must be http:// or https://",
        ),
        (
            "GCS",
            "gcs:\n  gcpSecret: gcp\n",
            "gcs-path",
            "spec.gcs.path: is required: BUCKET/OBJECT of the snapshot",
        ),
        (
            "GCS",
            "gcs:\n  path: /k\n",
            "gcs-path",
            "spec.gcs.path: must be BUCKET/OBJECT",
        ),
        (
            "GCS",
            "gcs:\n  path: Bucket/k\n",
            "gcs-bucket",
            "spec.gcs.path: the bucket \"Bucket\" may hold only lowercase letters, digits, '-', '_' and '.'",
        ),
        (
            "GCS",
            "gcs:\n  path: google-backups/k\n",
            "gcs-bucket",
            "must not start with \"goog\" nor hold \"google\" (Google's bucket naming)",
        ),
        (
            "GCS",
            "gcs:\n  path: 10.0.0.1/k\n",
            "gcs-bucket",
            "must not be formatted as an IP address",
        ),
        (
            "GCS",
            "gcs:\n  path: bkt/a/../b\n",
            "gcs-object",
            "has a segment '.' or '..'",
        ),
        (
            "GCS",
            "gcs:\n  path: bkt/\n",
            "gcs-object",
            "the object after \"bkt\"/ is empty",
        ),
        (
            "GCS",
            "gcs:\n  path: bkt/k\n  gcpSecret: \"gcp secret\"\n",
            "gcs-secret",
            "spec.gcs.gcpSecret: must be a Secret name",
        ),
    ];
    for (t, source, rule, want) in cases {
        let b = backup(&format!(
            "etcdEndpoints: [\"http://demo-client:2379\"]\nstorageType: {t}\n{source}"
        ));
        assert_refused(judge_backup(&b, None), rule, want);
        let r = restore(&format!(
            "etcdCluster:\n  name: demo\nbackupStorageType: {t}\n{source}"
        ));
        assert_refused(judge_restore(&r, None), rule, &want.replace("spec.", ""));
    }
}

#[test]
fn exactly_the_matching_source_is_set() {
    let b = backup("etcdEndpoints: [\"http://demo-client:2379\"]\nstorageType: S3\n");
    assert_refused(
        judge_backup(&b, None),
        "storage-source",
        "spec.s3: is required with storageType S3",
    );
    assert_refused(
        judge_backup(&good_backup("gcs:\n  path: b/k\n"), None),
        "storage-source",
        "spec.gcs: must not be set with storageType S3: exactly the source of the storage type (s3) is set",
    );
    let r = restore("etcdCluster:\n  name: demo\nbackupStorageType: S3\nabs:\n  path: c/b\n");
    let refusal = judge_restore(&r, None).expect_err("refused");
    let rules: Vec<&str> = refusal.0.iter().map(|v| v.rule).collect();
    assert_eq!(rules, ["storage-source", "storage-source"], "{refusal}");
    assert!(
        refusal
            .to_string()
            .contains("spec.abs: must not be set with backupStorageType S3"),
        "{refusal}"
    );
}

/// `s3.path` cases: (path, rule, message part), `None` for accepted paths.
#[test]
fn s3_paths() {
    let long_key = format!("bkt/{}", "k".repeat(1025));
    let cases: Vec<(&str, Option<(&str, &str)>)> = vec![
        ("etcd-backups/demo/snapshot.db", None),
        ("abc/k", None),
        ("my.bucket-1/dir/sub/key_v12_2006-01-02-15:04:05", None),
        ("a1b/a key (1)!$&'+,;=@.db", None),
        (
            "",
            Some((
                "s3-path",
                "spec.s3.path: is required: BUCKET/KEY of the snapshot",
            )),
        ),
        (
            "nobucket",
            Some((
                "s3-path",
                "spec.s3.path: must be BUCKET/KEY, such as etcd-backups/example/snapshot.db, got \"nobucket\"",
            )),
        ),
        ("/key", Some(("s3-path", "must be BUCKET/KEY"))),
        (
            "bucket/",
            Some(("s3-key", "the key after \"bucket\"/ is empty")),
        ),
        (
            "ab/k",
            Some((
                "s3-bucket",
                "the bucket \"ab\" must be 3 to 63 characters long (S3's bucket naming), got 2",
            )),
        ),
        (
            "Etcd-Backups/k",
            Some((
                "s3-bucket",
                "the bucket \"Etcd-Backups\" may hold only lowercase letters, digits, '.' and '-'",
            )),
        ),
        (
            "my_bucket/k",
            Some(("s3-bucket", "may hold only lowercase")),
        ),
        (
            "-bucket/k",
            Some(("s3-bucket", "must start and end with a letter or digit")),
        ),
        ("bucket./k", Some(("s3-bucket", "must start and end"))),
        (
            "my..bucket/k",
            Some(("s3-bucket", "must not hold two adjacent periods")),
        ),
        (
            "192.168.5.4/k",
            Some(("s3-bucket", "must not be formatted as an IP address")),
        ),
        ("1.2.3.4.5/k", None),
        (
            "bucket//k",
            Some((
                "s3-key",
                "the key \"/k\" has an empty segment (a leading or trailing '/', or '//')",
            )),
        ),
        ("bucket/a//b", Some(("s3-key", "has an empty segment"))),
        ("bucket/a/", Some(("s3-key", "has an empty segment"))),
        (
            "bucket/a/../b",
            Some(("s3-key", "has a segment '.' or '..'")),
        ),
        ("bucket/./b", Some(("s3-key", "has a segment '.' or '..'"))),
        ("bucket/a..b", None),
        (
            "bucket/a\nb",
            Some(("s3-key", "holds the control character U+000A")),
        ),
        (
            "bucket/a\u{7f}",
            Some(("s3-key", "control character U+007F")),
        ),
        (
            "bucket/a%20b",
            Some((
                "s3-key",
                "holds '%', one of the characters the object store client escapes in keys",
            )),
        ),
        ("bucket/snap*", Some(("s3-key", "holds '*'"))),
        ("bucket/a?b", Some(("s3-key", "holds '?'"))),
        ("bucket/a\\b", Some(("s3-key", "holds '\\\\'"))),
        (
            "bucket/é.db",
            Some(("s3-key", "holds the non-ASCII character 'é'")),
        ),
        (
            &long_key,
            Some((
                "s3-key",
                "the key is 1025 bytes long; S3 keys are at most 1024 bytes",
            )),
        ),
    ];
    for (path, want) in cases {
        let b = good_backup("").tap_path(path);
        match want {
            None => assert_eq!(judge_backup(&b, None), Ok(vec![]), "{path:?}"),
            Some((rule, message)) => assert_refused(judge_backup(&b, None), rule, message),
        }
    }
    for c in ESCAPED_KEY_CHARACTERS.chars() {
        let key = format!("x{c}y");
        assert!(
            matches!(
                check_object_key(&key),
                Err(ObjectPathError::EscapedCharacter { character, .. }) if character == c
            ),
            "{key:?}"
        );
    }
}

trait TapPath {
    fn tap_path(self, path: &str) -> Self;
}

impl TapPath for EtcdBackup {
    fn tap_path(mut self, path: &str) -> Self {
        if let Some(s3) = self.spec.source.s3.as_mut() {
            s3.path = path.to_string();
        }
        self
    }
}

#[test]
fn s3_secrets_and_endpoints() {
    let with = |lines: &str| {
        backup(&format!(
            "etcdEndpoints: [\"http://demo-client:2379\"]\nstorageType: S3\ns3:\n  path: etcd-backups/k\n{lines}"
        ))
    };
    accepted(judge_backup(
        &with("  awsSecret: my.aws-1\n  endpoint: https://s3.eu-west-1.amazonaws.com\n"),
        None,
    ));
    for endpoint in [
        "http://minio.storage:9000",
        "http://minio.storage:9000/",
        "https://10.0.0.7",
        "http://[fd00::7]:9000",
        "http://localhost:9000/s3",
        "http://MinIO.Storage.svc.cluster.local.:9000",
    ] {
        let b = with(&format!("  awsSecret: aws\n  endpoint: \"{endpoint}\"\n"));
        assert_eq!(judge_backup(&b, None), Ok(vec![]), "{endpoint}");
    }
    assert_refused(
        judge_backup(&with(""), None),
        "s3-secret",
        "spec.s3.awsSecret: is required: the name of a Secret of this namespace",
    );
    assert_refused(
        judge_backup(&with("  awsSecret: AWS_creds\n"), None),
        "s3-secret",
        "spec.s3.awsSecret: must be a Secret name (a DNS-1123 subdomain: lowercase letters, digits, '-' and '.'), got \"AWS_creds\"",
    );
    let cases = [
        (
            "minio.storage:9000",
            "the scheme must be http:// or https://",
        ),
        ("ftp://minio:21", "the scheme must be http:// or https://"),
        (
            "HTTP://minio:9000",
            "the scheme must be http:// or https://",
        ),
        ("http://", "the host must be a DNS name or an IPv4 address"),
        (
            "http://:9000",
            "the host must be a DNS name or an IPv4 address",
        ),
        (
            "http://key:secret@minio:9000",
            "user information (USER:PASSWORD@) is not allowed",
        ),
        (
            "http://minio:9000/?x=1",
            "a query or fragment is not allowed",
        ),
        (
            "http://minio:9000#top",
            "a query or fragment is not allowed",
        ),
        (
            "http://minio:port",
            "the port must be a number from 1 to 65535",
        ),
        (
            "http://minio:0",
            "the port must be a number from 1 to 65535",
        ),
        (
            "http://minio:65536",
            "the port must be a number from 1 to 65535",
        ),
        ("http://minio:", "the port must be a number from 1 to 65535"),
        ("http://min io:9000", "it holds whitespace"),
        (
            "http://[fd00::7:9000",
            "the IPv6 address has no closing ']'",
        ),
        ("http://[nope]:9000", "the host is not a valid IPv6 address"),
        (
            "http://[fd00::7]x",
            "the IPv6 address must be followed by :PORT or nothing",
        ),
        (
            "http://-minio:9000",
            "the host must be a DNS name or an IPv4 address",
        ),
        (
            "http://a..b:9000",
            "the host must be a DNS name or an IPv4 address",
        ),
    ];
    for (endpoint, why) in cases {
        let b = with(&format!("  awsSecret: aws\n  endpoint: \"{endpoint}\"\n"));
        let quoted = format!("{endpoint:?}");
        assert_refused(
            judge_backup(&b, None),
            "s3-endpoint",
            &format!(
                "spec.s3.endpoint: must be empty (AWS) or an http:// or https:// URL with a host and an optional port, such as http://minio.storage:9000, got {quoted}: {why}"
            ),
        );
    }
}

#[test]
fn client_tls_secrets() {
    accepted(judge_backup(
        &good_backup("clientTLSSecret: etcd-client-tls\n"),
        None,
    ));
    assert_refused(
        judge_backup(&good_backup("clientTLSSecret: Etcd_TLS\n"), None),
        "client-tls-secret",
        "spec.clientTLSSecret: must be empty (the cluster's own client certificate) or a Secret name (a DNS-1123 subdomain: lowercase letters, digits, '-' and '.'), got \"Etcd_TLS\"",
    );
}

#[test]
fn encryption_secrets() {
    assert_eq!(
        accepted(judge_backup(
            &good_backup("encryption:\n  recipientsSecret: backup-recipients\n"),
            None
        )),
        Vec::<String>::new()
    );
    accepted(judge_backup(
        &good_backup("encryption:\n  recipientsSecret: r\n  identitySecret: backup-identity\n"),
        None,
    ));
    assert_refused(
        judge_backup(
            &good_backup("encryption:\n  recipientsSecret: \"\"\n"),
            None,
        ),
        "encryption-secret",
        "spec.encryption.recipientsSecret: must be the Secret whose key recipients holds the age recipients (age1...): a Secret name of this namespace (a DNS-1123 subdomain: lowercase letters, digits, '-' and '.'), got \"\"",
    );
    assert_refused(
        judge_backup(
            &good_backup("encryption:\n  recipientsSecret: r\n  identitySecret: Not_A_Name\n"),
            None,
        ),
        "encryption-secret",
        "spec.encryption.identitySecret: must be blank (recovery skips encrypted snapshots)",
    );
    assert_refused(
        judge_backup(
            &pvc_backup(&format!("{PVC}encryption:\n  recipientsSecret: r\n")),
            None,
        ),
        "encryption-storage-type",
        "spec.encryption: is supported for S3, ABS and GCS only, not PVC",
    );
    accepted(judge_restore(
        &good_restore("encryption:\n  identitySecret: backup-identity\n"),
        None,
    ));
    assert_refused(
        judge_restore(&good_restore("encryption:\n  identitySecret: \"\"\n"), None),
        "encryption-secret",
        "spec.encryption.identitySecret: must be the Secret whose key identity holds the age identity (AGE-SECRET-KEY-1...)",
    );
    assert_refused(
        judge_restore(
            &restore(&format!(
                "etcdCluster:\n  name: demo\nbackupStorageType: PVC\n{PVC}encryption:\n  identitySecret: k\n"
            )),
            None,
        ),
        "encryption-storage-type",
        "spec.encryption: is supported for S3, ABS and GCS only",
    );
}

#[test]
fn backup_policies() {
    let policy = |lines: &str| good_backup(&format!("backupPolicy:\n{lines}"));
    // CoreOS' periodic example and the tests' 2 s interval.
    assert_eq!(
        judge_backup(
            &policy("  backupIntervalInSecond: 3600\n  maxBackups: 24\n  timeoutInSecond: 120\n"),
            None
        ),
        Ok(vec![])
    );
    assert_eq!(
        accepted(judge_backup(
            &policy("  backupIntervalInSecond: 2\n  maxBackups: 3\n"),
            None
        )),
        vec![
            "spec.backupPolicy.backupIntervalInSecond: a snapshot every 2 s streams the whole database that often and loads the member it is taken from; 60 s or more is recommended"
        ]
    );
    assert!(
        judge_backup(&policy("  backupIntervalInSecond: 60\n"), None).is_ok_and(|w| w.is_empty())
    );
    assert_eq!(
        accepted(judge_backup(&policy("  maxBackups: 5\n"), None)),
        vec![
            "spec.backupPolicy.maxBackups: applies to periodic backups only: without backupIntervalInSecond or schedule one snapshot is taken and none is deleted"
        ]
    );
    for field in ["timeoutInSecond", "backupIntervalInSecond", "maxBackups"] {
        assert_refused(
            judge_backup(&policy(&format!("  {field}: -1\n")), None),
            "backup-policy-range",
            &format!(
                "spec.backupPolicy.{field}: must not be negative (0 means the default), got -1"
            ),
        );
    }
}

#[test]
fn schedules_and_retention() {
    // A daily schedule in Berlin keeping GFS: accepted without a word.
    let gfs = "retention:\n  keepLast: 3\n  keepHourly: 24\n  keepDaily: 7\n  keepWeekly: 4\n  keepMonthly: 12\n";
    assert_eq!(
        judge_backup(
            &good_backup(&format!(
                "schedule: \"0 3 * * *\"\ntimeZone: Europe/Berlin\n{gfs}"
            )),
            None
        ),
        Ok(vec![])
    );
    assert_eq!(
        judge_backup(
            &good_backup(
                "schedule: \"@hourly\"\nbackupPolicy:\n  maxBackups: 5\n  timeoutInSecond: 120\n"
            ),
            None
        ),
        Ok(vec![]),
        "maxBackups and timeoutInSecond apply to a schedule"
    );
    assert_eq!(
        judge_backup(
            &good_backup(
                "backupPolicy:\n  backupIntervalInSecond: 3600\nretention:\n  keepDaily: 7\n"
            ),
            None
        ),
        Ok(vec![]),
        "retention applies to interval backups"
    );
    // Each refusal names its field.
    assert_refused(
        judge_backup(
            &good_backup(
                "schedule: \"0 3 * * *\"\nbackupPolicy:\n  backupIntervalInSecond: 3600\n",
            ),
            None,
        ),
        "backup-schedule",
        "spec.schedule: and spec.backupPolicy.backupIntervalInSecond (3600) are both set: a periodic backup takes one or the other",
    );
    assert_refused(
        judge_backup(&good_backup("schedule: \"0 3 * *\"\n"), None),
        "backup-schedule",
        "spec.schedule: must be a cron expression of five fields (minute hour day-of-month month day-of-week, such as \"0 3 * * *\"), got 4 fields in \"0 3 * *\"",
    );
    assert_refused(
        judge_backup(&good_backup("schedule: \"0 0 3 * * *\"\n"), None),
        "backup-schedule",
        "spec.schedule: must be a cron expression of five fields",
    );
    assert_refused(
        judge_backup(&good_backup("schedule: \"0 25 * * *\"\n"), None),
        "backup-schedule",
        "spec.schedule: is not a cron expression of five fields",
    );
    assert_refused(
        judge_backup(&good_backup("schedule: \"0 0 30 2 *\"\n"), None),
        "backup-schedule",
        "spec.schedule: never matches a time",
    );
    assert_refused(
        judge_backup(
            &good_backup("schedule: \"0 3 * * *\"\ntimeZone: Mars/Olympus_Mons\n"),
            None,
        ),
        "backup-time-zone",
        "spec.timeZone: is not a time zone of the IANA database (such as \"Europe/Berlin\", \"America/New_York\" or \"UTC\"), got \"Mars/Olympus_Mons\"",
    );
    assert_refused(
        judge_backup(&good_backup("schedule: \"@daily\"\nretention: {}\n"), None),
        "backup-retention",
        "spec.retention: keeps nothing: set at least one of keepLast, keepHourly, keepDaily, keepWeekly, keepMonthly",
    );
    for field in [
        "keepLast",
        "keepHourly",
        "keepDaily",
        "keepWeekly",
        "keepMonthly",
    ] {
        assert_refused(
            judge_backup(
                &good_backup(&format!(
                    "schedule: \"@daily\"\nretention:\n  {field}: -1\n"
                )),
                None,
            ),
            "backup-retention",
            &format!(
                "spec.retention.{field}: must not be negative (0 keeps none by this rule), got -1"
            ),
        );
    }
    assert_refused(
        judge_backup(
            &good_backup(
                "schedule: \"@daily\"\nbackupPolicy:\n  maxBackups: 3\nretention:\n  keepDaily: 7\n",
            ),
            None,
        ),
        "backup-retention",
        "spec.retention: and spec.backupPolicy.maxBackups (3) are both set: old snapshots are deleted by one or the other",
    );
    assert_eq!(
        judge_backup(
            &pvc_backup(&format!(
                "{PVC}schedule: \"@daily\"\ntimeZone: Europe/Berlin\nretention:\n  keepDaily: 7\n"
            )),
            None,
        ),
        Ok(vec![]),
        "retention for PVC backups too (the pod gets --keep-* arguments)"
    );
    // Warnings: settings that do nothing.
    assert_eq!(
        accepted(judge_backup(
            &good_backup("retention:\n  keepLast: 2\n"),
            None
        )),
        vec![
            "spec.retention: applies to periodic backups only: without backupIntervalInSecond or schedule one snapshot is taken and none is deleted"
        ]
    );
    assert_eq!(
        accepted(judge_backup(
            &good_backup("timeZone: Europe/Berlin\n"),
            None
        )),
        vec!["spec.timeZone: has no effect without spec.schedule or spec.retention"]
    );
    // A PVC backup may have a schedule and maxBackups.
    assert_eq!(
        judge_backup(
            &pvc_backup(&format!(
                "{PVC}schedule: \"*/30 * * * *\"\nbackupPolicy:\n  maxBackups: 3\n"
            )),
            None
        ),
        Ok(vec![])
    );
}

#[test]
fn backup_updates() {
    let stored = good_backup("");
    // A stored object that a newer rule refuses stays labelable and deletable.
    let mut old_bad = good_backup("").tap_path("nobucket");
    old_bad.metadata.labels = Some([("team".to_string(), "db".to_string())].into());
    let mut relabeled = old_bad.clone();
    relabeled.metadata.labels = None;
    assert_eq!(judge_backup(&relabeled, Some(&old_bad)), Ok(vec![]));
    // A spec change is judged as a create.
    let moved = good_backup("").tap_path("other-bucket/k");
    assert_eq!(judge_backup(&moved, Some(&stored)), Ok(vec![]));
    assert_refused(
        judge_backup(&good_backup("").tap_path("x/k"), Some(&stored)),
        "s3-bucket",
        "must be 3 to 63 characters",
    );
}

#[test]
fn restore_cluster_names() {
    accepted(judge_restore(&good_restore(""), None));
    let named = |name: &str| {
        restore(&format!(
            "etcdCluster:\n  name: \"{name}\"\nbackupStorageType: S3\n{S3}"
        ))
    };
    assert_refused(
        judge_restore(&named(""), None),
        "restore-cluster-name",
        "spec.etcdCluster.name: is required: the name of the EtcdCluster of this namespace to restore",
    );
    let r = restore(&format!("etcdCluster: {{}}\nbackupStorageType: S3\n{S3}"));
    assert_refused(
        judge_restore(&r, None),
        "restore-cluster-name",
        "is required",
    );
    assert_refused(
        judge_restore(&named(&"a".repeat(57)), None),
        "name-length",
        "spec.etcdCluster.name: must be at most 56 characters so that the Service NAME-client and the member pods NAME-N are valid names, got 57 characters",
    );
    accepted(judge_restore(&named(&"a".repeat(56)), None));
    assert_refused(
        judge_restore(&named("My_Cluster"), None),
        "name-syntax",
        "spec.etcdCluster.name: must be a DNS-1035 label (lowercase letters, digits and '-', starting with a letter) because Services are named after it, got \"My_Cluster\"",
    );
    assert_refused(
        judge_restore(&named("1etcd"), None),
        "name-syntax",
        "must be a DNS-1035 label",
    );
    // The source rules apply to restores as to backups.
    let mut bad_path = good_restore("");
    if let Some(s3) = bad_path.spec.source.s3.as_mut() {
        s3.path = "nobucket".into();
        s3.endpoint = "ftp://x".into();
    }
    let refusal = judge_restore(&bad_path, None).expect_err("refused");
    let rules: Vec<&str> = refusal.0.iter().map(|v| v.rule).collect();
    assert_eq!(rules, ["s3-path", "s3-endpoint"], "{refusal}");
}

/// `spec.restoreInto` (a clone): a new cluster's name, not the source's.
#[test]
fn restore_into_names() {
    accepted(judge_restore(
        &good_restore("restoreInto: demo-clone\n"),
        None,
    ));
    assert_refused(
        judge_restore(&good_restore("restoreInto: demo\n"), None),
        "restore-into-same",
        "spec.restoreInto: is spec.etcdCluster.name (\"demo\"): restoring a cluster into itself is a roll back; leave spec.restoreInto out",
    );
    assert_refused(
        judge_restore(&good_restore("restoreInto: \"\"\n"), None),
        "restore-into-name",
        "spec.restoreInto: must name the new EtcdCluster to create from the snapshot",
    );
    assert_refused(
        judge_restore(&good_restore("restoreInto: Demo_Clone\n"), None),
        "name-syntax",
        "spec.restoreInto: must be a DNS-1035 label",
    );
    assert_refused(
        judge_restore(
            &good_restore(&format!("restoreInto: {}\n", "a".repeat(57))),
            None,
        ),
        "name-length",
        "spec.restoreInto: must be at most 56 characters",
    );
    // Like the rest of the spec, it cannot change once the restore exists.
    let stored = good_restore("restoreInto: demo-clone\n");
    assert_refused(
        judge_restore(&good_restore("restoreInto: other\n"), Some(&stored)),
        "restore-immutable",
        "is immutable",
    );
}

#[test]
fn restore_specs_are_immutable() {
    let stored = good_restore("");
    // Metadata and status changes are allowed.
    let mut labeled = stored.clone();
    labeled.metadata.labels = Some([("team".to_string(), "db".to_string())].into());
    labeled.status = Some(Default::default());
    assert_eq!(judge_restore(&labeled, Some(&stored)), Ok(vec![]));
    // Any spec change is refused, a fix of a bad value too.
    let mut other = stored.clone();
    if let Some(s3) = other.spec.source.s3.as_mut() {
        s3.path = "etcd-backups/demo/other.db".into();
    }
    let refusal = judge_restore(&other, Some(&stored)).expect_err("refused");
    assert_eq!(refusal.0.len(), 1, "{refusal}");
    assert_eq!(refusal.0[0].rule, "restore-immutable");
    assert_eq!(
        refusal.to_string(),
        "spec: is immutable: an EtcdRestore runs once; to restore again or from another snapshot, create a new EtcdRestore"
    );
    let mut renamed = stored.clone();
    renamed.spec.etcd_cluster.name = "other".into();
    assert_refused(
        judge_restore(&renamed, Some(&stored)),
        "restore-immutable",
        "create a new EtcdRestore",
    );
}

/// Messages quote a bounded prefix of huge values, and an answer lists at most 25 violations.
#[test]
fn messages_stay_bounded() {
    let huge = "x".repeat(1 << 20);
    let b = backup(&format!(
        "etcdEndpoints: [\"http://{huge}-client.{huge}:2379\", \"http://{huge}:1\"]\nstorageType: \"{huge}\"\nclientTLSSecret: \"{huge}\"\nbackupPolicy: {{maxBackups: 1}}\n"
    ));
    let refusal = judge_backup(&b, None).expect_err("refused");
    for v in &refusal.0 {
        assert!(v.to_string().len() < 1024, "{} bytes", v.to_string().len());
    }
    let mut s = good_backup("");
    if let Some(s3) = s.spec.source.s3.as_mut() {
        s3.path = format!("{huge}/{huge}");
        s3.aws_secret = huge.clone();
        s3.endpoint = format!("http://{huge}");
    }
    let refusal = judge_backup(&s, None).expect_err("refused");
    assert_eq!(refusal.0.len(), 3, "{refusal}");
    for v in &refusal.0 {
        assert!(v.to_string().len() < 1024, "{} bytes", v.to_string().len());
    }
}

/// A good pvc source.
const PVC: &str = "pvc:\n  claimName: etcd-backups\n  path: demo/snapshot.db\n";

/// A backup of type PVC with the given source lines.
fn pvc_backup(source: &str) -> EtcdBackup {
    backup(&format!(
        "etcdEndpoints: [\"http://demo-client:2379\"]\nstorageType: PVC\n{source}"
    ))
}

#[test]
fn pvc_backups_and_restores_are_accepted() {
    assert_eq!(
        accepted(judge_backup(&pvc_backup(PVC), None)),
        Vec::<String>::new()
    );
    let periodic = pvc_backup(&format!(
        "{PVC}backupPolicy:\n  backupIntervalInSecond: 3600\n  maxBackups: 3\n"
    ));
    assert_eq!(
        accepted(judge_backup(&periodic, None)),
        Vec::<String>::new()
    );
    let r = restore(&format!(
        "etcdCluster:\n  name: demo\nbackupStorageType: PVC\n{PVC}"
    ));
    assert_eq!(accepted(judge_restore(&r, None)), Vec::<String>::new());
    // A file at the claim's root, and names with dots and spaces.
    for path in [
        "snapshot.db",
        "a/b/c/snap..db",
        "daily backups/etcd.db",
        ".hidden/x",
    ] {
        let b = pvc_backup(&format!("pvc:\n  claimName: c\n  path: \"{path}\"\n"));
        assert_eq!(
            accepted(judge_backup(&b, None)),
            Vec::<String>::new(),
            "{path}"
        );
    }
}

#[test]
fn pvc_needs_exactly_its_source() {
    assert_refused(
        judge_backup(&pvc_backup(""), None),
        "storage-source",
        "spec.pvc: is required with storageType PVC: claimName and path",
    );
    assert_refused(
        judge_backup(&pvc_backup(&format!("{PVC}{S3}")), None),
        "storage-source",
        "spec.s3: must not be set with storageType PVC: exactly the source of the storage type (pvc) is set",
    );
    // A pvc source beside type S3.
    assert_refused(
        judge_backup(&good_backup(PVC), None),
        "storage-source",
        "spec.pvc: must not be set with storageType S3",
    );
    let r = restore("etcdCluster:\n  name: demo\nbackupStorageType: PVC\n");
    assert_refused(
        judge_restore(&r, None),
        "storage-source",
        "spec.pvc: is required with backupStorageType PVC",
    );
}

/// `pvc.claimName` and `pvc.path` cases: (claim, path, rule, message part).
#[test]
fn pvc_claims_and_paths() {
    let long_dir = "d".repeat(256);
    let long_file = "f".repeat(MAX_FILE_NAME_BYTES + 1);
    let fitting_file = "f".repeat(MAX_FILE_NAME_BYTES);
    let long_path = "a/".repeat(600) + "x";
    let cases: Vec<(&str, String, &str, String)> = vec![
        ("\"\"", "s.db".into(), "pvc-claim", "spec.pvc.claimName: is required: the name of a PersistentVolumeClaim of this namespace".into()),
        ("Backups", "s.db".into(), "pvc-claim", "spec.pvc.claimName: must be a PersistentVolumeClaim name (a DNS-1123 subdomain: lowercase letters, digits, '-' and '.', at most 253), got \"Backups\"".into()),
        ("-b", "s.db".into(), "pvc-claim", "got \"-b\"".into()),
        ("c", "\"\"".into(), "pvc-path", "spec.pvc.path: is required: the snapshot file relative to the claim's root, such as example/snapshot.db".into()),
        ("c", "/etc/passwd".into(), "pvc-path", "spec.pvc.path: must be relative to the claim's root, such as example/snapshot.db, got \"/etc/passwd\": it is joined under the claim's mount point".into()),
        ("c", "../other/s.db".into(), "pvc-path", "spec.pvc.path: \"../other/s.db\" has a segment '.' or '..': the path must stay inside the claim".into()),
        ("c", "a/../../s.db".into(), "pvc-path", "has a segment '.' or '..'".into()),
        ("c", "a/./s.db".into(), "pvc-path", "has a segment '.' or '..'".into()),
        ("c", "..".into(), "pvc-path", "has a segment '.' or '..'".into()),
        ("c", "a//s.db".into(), "pvc-path", "spec.pvc.path: \"a//s.db\" has an empty segment ('//' or a trailing '/'): name a file, such as example/snapshot.db".into()),
        ("c", "backups/".into(), "pvc-path", "has an empty segment".into()),
        ("c", "\"a\\nb\"".into(), "pvc-path", "spec.pvc.path: \"a\\nb\" holds the control character U+000A".into()),
        ("c", "\"a\\u0000b\"".into(), "pvc-path", "holds the control character U+0000".into()),
        ("c", format!("{long_dir}/s.db"), "pvc-path", "has a directory name of 256 bytes; file systems take at most 255".into()),
        ("c", format!("d/{long_file}"), "pvc-path", format!("ends in a file name of {} bytes; at most {MAX_FILE_NAME_BYTES}", MAX_FILE_NAME_BYTES + 1)),
        ("c", long_path.clone(), "pvc-path", format!("spec.pvc.path: is {} bytes long; at most 1024", long_path.len())),
        ("c", "s.db.part".into(), "pvc-path", "spec.pvc.path: \"s.db.part\" ends in .part, which the backup uses for its own files beside each snapshot".into()),
        ("c", "x/s.meta.json".into(), "pvc-path", "ends in .meta.json".into()),
    ];
    for (claim, path, rule, want) in &cases {
        let b = pvc_backup(&format!("pvc:\n  claimName: {claim}\n  path: {path}\n"));
        assert_refused(judge_backup(&b, None), rule, want);
        // The restore applies the same rules.
        let r = restore(&format!(
            "etcdCluster:\n  name: demo\nbackupStorageType: PVC\npvc:\n  claimName: {claim}\n  path: {path}\n"
        ));
        assert_refused(judge_restore(&r, None), rule, want);
    }
    // The longest file name is accepted, and stays within NAME_MAX with every suffix.
    let b = pvc_backup(&format!("pvc:\n  claimName: c\n  path: d/{fitting_file}\n"));
    accepted(judge_backup(&b, None));
    let periodic = format!(
        "{fitting_file}_v{}_2026-01-02-15:04:05{METADATA_SUFFIX}",
        i64::MAX
    );
    assert!(periodic.len() <= 255, "{}", periodic.len());
}

/// The restore-seed annotation of a PVC restore: its pvc passes the same rules.
#[test]
fn pvc_restore_seeds() {
    let sha = "ab".repeat(32);
    let seed = |path: &str| {
        crate::types::RestoreSeed {
            restore: "r".into(),
            source: crate::types::storage::StorageSource {
                pvc: Some(crate::types::PvcSource {
                    claim_name: "backups".into(),
                    path: path.into(),
                }),
                ..Default::default()
            },
            sha256: sha.clone(),
            ..crate::types::RestoreSeed::default()
        }
        .to_annotation()
    };
    let with = |value: String| {
        let mut c: crate::EtcdCluster =
            serde_yaml::from_str("apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdCluster\nmetadata:\n  name: demo\n  namespace: prod\nspec:\n  size: 3\n").expect("parses");
        c.metadata.annotations =
            Some([(crate::names::ANNOTATION_RESTORE_SEED.to_string(), value)].into());
        c
    };
    let policy = AdmissionPolicy::default();
    assert!(policy.validate(&with(seed("demo/s.db")), None).is_ok());
    let refusal = policy
        .validate(&with(seed("../s.db")), None)
        .expect_err("refused");
    assert!(
        refusal.to_string().contains(
            "metadata.annotations[etcd.database.coreos.com/restore-seed].pvc.path: \"../s.db\" has a segment '.' or '..'"
        ),
        "{refusal}"
    );
}

#[test]
fn verify_every() {
    assert_eq!(
        accepted(judge_backup(&good_backup("verify:\n  every: 1\n"), None)),
        Vec::<String>::new()
    );
    assert_refused(
        judge_backup(&good_backup("verify:\n  every: 0\n"), None),
        "backup-verify-every",
        "spec.verify.every: must be at least 1 (1 verifies every backup), got 0",
    );
    assert_refused(
        judge_backup(&pvc_backup(&format!("{PVC}verify:\n  every: 2\n")), None),
        "backup-verify-storage-type",
        "spec.verify: verification is for object stores (S3, ABS, GCS), not PVC",
    );
}

#[test]
fn verify_of_an_encrypted_backup_needs_its_identity() {
    assert_refused(
        judge_backup(
            &good_backup("encryption:\n  recipientsSecret: r\nverify:\n  every: 1\n"),
            None,
        ),
        "backup-verify-identity",
        "spec.verify: an encrypted snapshot is read back with spec.encryption.identitySecret",
    );
    accepted(judge_backup(
        &good_backup(
            "encryption:\n  recipientsSecret: r\n  identitySecret: i\nverify:\n  every: 1\n",
        ),
        None,
    ));
}

#[test]
fn continuous_backups() {
    let periodic = "backupPolicy:\n  backupIntervalInSecond: 3600\n";
    assert_eq!(
        accepted(judge_backup(
            &good_backup(&format!("{periodic}continuous:\n  segmentSeconds: 5\n")),
            None
        )),
        Vec::<String>::new()
    );
    accepted(judge_backup(
        &good_backup("schedule: \"0 * * * *\"\ncontinuous: {}\n"),
        None,
    ));
    assert_refused(
        judge_backup(&good_backup("continuous: {}\n"), None),
        "backup-continuous",
        "spec.continuous: needs periodic snapshots",
    );
    assert_refused(
        judge_backup(
            &good_backup(&format!("{periodic}continuous:\n  segmentSeconds: 61\n")),
            None,
        ),
        "backup-continuous",
        "spec.continuous.segmentSeconds: must be 1 to 60 (0 means 5), got 61",
    );
    assert_refused(
        judge_backup(
            &good_backup(&format!(
                "{periodic}continuous: {{}}\nencryption:\n  recipientsSecret: r\n"
            )),
            None,
        ),
        "backup-continuous",
        "spec.continuous: is not supported with spec.encryption yet",
    );
    assert_refused(
        judge_backup(
            &pvc_backup(&format!("{PVC}{periodic}continuous: {{}}\n")),
            None,
        ),
        "backup-continuous",
        "spec.continuous: is supported for S3, ABS and GCS only, not PVC",
    );
}

#[test]
fn restores_to_a_time() {
    accepted(judge_restore(
        &good_restore("toTime: \"2026-12-07T05:10:00Z\"\n"),
        None,
    ));
    accepted(judge_restore(
        &good_restore("toTime: \"2026-12-07T06:10:00.250+01:00\"\n"),
        None,
    ));
    assert_refused(
        judge_restore(&good_restore("toTime: yesterday\n"), None),
        "restore-to-time",
        "spec.toTime: must be an RFC 3339 time with its offset, such as 2026-12-07T05:10:00Z, got \"yesterday\"",
    );
    assert_refused(
        judge_restore(
            &good_restore("toTime: \"2026-12-07T05:10:00Z\"\ntoRevision: 4\n"),
            None,
        ),
        "restore-to-time",
        "spec.toTime: and spec.toRevision are both set",
    );
    assert_refused(
        judge_restore(
            &restore(&format!(
                "etcdCluster:\n  name: demo\nbackupStorageType: PVC\n{PVC}toTime: \"2026-12-07T05:10:00Z\"\n"
            )),
            None,
        ),
        "restore-to-revision",
        "spec.toTime: is supported for S3, ABS and GCS only",
    );
}

#[test]
fn restores_to_a_revision() {
    accepted(judge_restore(&good_restore("toRevision: 42\n"), None));
    assert_refused(
        judge_restore(&good_restore("toRevision: 0\n"), None),
        "restore-to-revision",
        "spec.toRevision: must be an etcd revision (1 or more), got 0",
    );
    assert_refused(
        judge_restore(
            &good_restore("toRevision: 42\nencryption:\n  identitySecret: k\n"),
            None,
        ),
        "restore-to-revision",
        "spec.toRevision: is not supported with spec.encryption",
    );
    assert_refused(
        judge_restore(
            &restore(&format!(
                "etcdCluster:\n  name: demo\nbackupStorageType: PVC\n{PVC}toRevision: 42\n"
            )),
            None,
        ),
        "restore-to-revision",
        "spec.toRevision: is supported for S3, ABS and GCS only",
    );
}

//! A bounded, reproducible fuzz run of the admission handler, in-process, on stable Rust: what
//! `tests/fuzz.rs` (a short run under `cargo test`) and `benches/fuzz.rs` (the long run under
//! `cargo bench`) share.
//!
//! Every input starts from a seed of the corpus in `tests/fuzz-corpus/` (real AdmissionReview
//! bodies: the repository's example, CoreOS' Go client bodies, the rule cases of the server
//! tests) and is mutated, deterministically from `(--seed, input index)`:
//!
//! - structure-aware, on the JSON tree, aimed mostly at `request.object`, its `spec` and
//!   `oldObject`: a node replaced by a value of another type, a key deleted or inserted (names
//!   the rules read, values they parse), arrays and maps duplicated, deep nesting, huge strings,
//!   numbers at the extremes, unicode, strings edited, subtrees spliced from another seed, the
//!   envelope changed (operation, kind, `oldObject`);
//! - byte-level, on the serialized body: bits flipped, bytes set, JSON tokens and invalid UTF-8
//!   inserted, ranges deleted or duplicated, truncation, huge digit runs.
//!
//! Bodies are capped at the webhook's default maximum body size (4 MiB). Each input goes
//! through [`Reviewer::review`] for `/validate` and `/mutate` and through the HTTP router
//! ([`webhook_router`], `tower::ServiceExt::oneshot`, no sockets), each call timed on its own.
//! A failure is a panic (caught per call, with its stack), a
//! [`etcd_webhook::admission::ReviewError::Internal`], an HTTP 5xx, an answer that is not an
//! AdmissionReview for the request's uid, a mutate patch that does not apply to the request's
//! object, a message, warning or error text over [`MAX_ECHO`] bytes (an echo of the request),
//! or a call slower than the stated bound. Each failing
//! input is written to a file whose path is printed, with the command that replays it.

#![allow(dead_code)]

use std::backtrace::Backtrace;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use arbitrary::Unstructured;
use axum::body::Body;
use base64::Engine as _;
use clap::Parser as _;
use etcd_webhook::Args;
use etcd_webhook::admission::{Endpoint, Reviewer};
use etcd_webhook::http::{WebhookState, webhook_router};
use etcd_webhook::inflight::InflightBudget;
use etcd_webhook::metrics::Metrics;
use http_body_util::BodyExt as _;
use serde_json::{Map, Number, Value, json};
use tower::ServiceExt as _;

/// The webhook's default `--max-request-body-size` (4Mi): no generated body is larger.
pub const MAX_BODY_BYTES: usize = etcd_webhook::args::DEFAULT_MAX_REQUEST_BODY;

/// The longest warning, cause or HTTP error text an answer may hold, bytes: the
/// rules clip what they quote to well under 1 KiB (issue 14, item 6), so a longer one echoes
/// the request.
pub const MAX_ECHO: usize = 4096;

/// The longest status message of a refusal, bytes: the shared rules list at most 25
/// violations, each clipped to 256 bytes of field and 700 of message.
pub const MAX_MESSAGE: usize = 25 * (256 + 700 + 2) + 256;

/// How a run is configured; every field has a flag and an environment variable.
#[derive(Debug, Clone)]
pub struct Options {
    /// `--seed` / `FUZZ_SEED`: input `i` is generated from `(seed, i)` alone.
    pub seed: u64,
    /// `--inputs` / `FUZZ_INPUTS`: how many inputs.
    pub inputs: u64,
    /// `--first` / `FUZZ_FIRST`: index of the first input (with `--inputs 1`, replays one).
    pub first: u64,
    /// `--max-latency-ms` / `FUZZ_MAX_LATENCY_MS`: the bound on every call, plus
    /// `latency_per_mib` for each MiB of its body.
    pub max_latency: Duration,
    /// `--latency-per-mib-ms` / `FUZZ_LATENCY_PER_MIB_MS`: what each MiB of body adds to the
    /// bound (the work is linear in the body: the bound says it stays so).
    pub latency_per_mib: Duration,
    /// `--replay FILE`: run this body (a saved failure) instead of generated inputs.
    pub replay: Option<PathBuf>,
    /// `--corpus DIR` / `FUZZ_CORPUS`: the seed directory.
    pub corpus: PathBuf,
    /// `--out DIR` / `FUZZ_OUT`: where failing inputs are written.
    pub out: PathBuf,
    /// `--progress-secs` / `FUZZ_PROGRESS_SECS`: a progress line this often (0: none).
    pub progress: Duration,
}

impl Options {
    /// The defaults of a run (`inputs` and `max_latency` as given), overridden by the
    /// environment, then by the command line (`cargo test`/`cargo bench` flags are skipped).
    pub fn from_env_and_args(
        inputs: u64,
        max_latency: Duration,
        latency_per_mib: Duration,
    ) -> Options {
        let mut o = Options {
            seed: 14,
            inputs,
            first: 0,
            max_latency,
            latency_per_mib,
            replay: None,
            corpus: Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz-corpus"),
            out: Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz-failures"),
            progress: Duration::from_secs(10),
        };
        let env = |k: &str| std::env::var(k).ok();
        let num = |s: Option<String>| s.and_then(|v| v.replace('_', "").parse::<u64>().ok());
        if let Some(v) = num(env("FUZZ_SEED")) {
            o.seed = v;
        }
        if let Some(v) = num(env("FUZZ_INPUTS")) {
            o.inputs = v;
        }
        if let Some(v) = num(env("FUZZ_FIRST")) {
            o.first = v;
        }
        if let Some(v) = num(env("FUZZ_MAX_LATENCY_MS")) {
            o.max_latency = Duration::from_millis(v);
        }
        if let Some(v) = num(env("FUZZ_LATENCY_PER_MIB_MS")) {
            o.latency_per_mib = Duration::from_millis(v);
        }
        if let Some(v) = num(env("FUZZ_PROGRESS_SECS")) {
            o.progress = Duration::from_secs(v);
        }
        if let Some(v) = env("FUZZ_CORPUS") {
            o.corpus = v.into();
        }
        if let Some(v) = env("FUZZ_OUT") {
            o.out = v.into();
        }
        let mut args = std::env::args().skip(1);
        while let Some(a) = args.next() {
            let (flag, inline) = match a.split_once('=') {
                Some((f, v)) => (f.to_string(), Some(v.to_string())),
                None => (a.clone(), None),
            };
            let mut value = || inline.clone().or_else(|| args.next());
            match flag.as_str() {
                "--seed" => o.seed = num(value()).unwrap_or(o.seed),
                "--inputs" => o.inputs = num(value()).unwrap_or(o.inputs),
                "--first" => o.first = num(value()).unwrap_or(o.first),
                "--max-latency-ms" => {
                    o.max_latency = num(value()).map_or(o.max_latency, Duration::from_millis)
                }
                "--latency-per-mib-ms" => {
                    o.latency_per_mib =
                        num(value()).map_or(o.latency_per_mib, Duration::from_millis)
                }
                "--progress-secs" => {
                    o.progress = num(value()).map_or(o.progress, Duration::from_secs)
                }
                "--replay" => o.replay = value().map(PathBuf::from),
                "--corpus" => o.corpus = value().map_or(o.corpus.clone(), PathBuf::from),
                "--out" => o.out = value().map_or(o.out.clone(), PathBuf::from),
                _ => {} // --bench, --nocapture and the like from cargo
            }
        }
        o
    }
}

/// One seed of the corpus.
pub struct Seed {
    /// The file name.
    pub name: String,
    /// The body as stored.
    pub bytes: Vec<u8>,
    /// The body parsed (every seed is JSON).
    pub value: Value,
}

/// Reads every `*.json` of `dir`, sorted by name (so input `i` is the same everywhere).
pub fn load_corpus(dir: &Path) -> Vec<Seed> {
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read the corpus {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    names.sort();
    let seeds: Vec<Seed> = names
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).expect("a readable seed");
            let value = serde_json::from_slice(&bytes)
                .unwrap_or_else(|e| panic!("seed {} is not JSON: {e}", p.display()));
            Seed {
                name: p.file_name().unwrap().to_string_lossy().into_owned(),
                bytes,
                value,
            }
        })
        .collect();
    assert!(!seeds.is_empty(), "no *.json seeds in {}", dir.display());
    seeds
}

/// A generated input: the body and how it was made.
pub struct Input {
    /// The request body.
    pub body: Vec<u8>,
    /// The seed it started from.
    pub seed: String,
    /// The mutations applied, in order.
    pub mutations: Vec<String>,
}

/// A 64-bit mix (splitmix64's finalizer): input `i` of seed `s` gets an unrelated stream.
fn mix(seed: u64, index: u64) -> u64 {
    let mut z = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(index.wrapping_add(1).wrapping_mul(0xBF58_476D_1CE4_E5B9));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Field names the rules and decoders read, used as keys when inserting.
const KEYS: &[&str] = &[
    "apiVersion",
    "kind",
    "metadata",
    "spec",
    "status",
    "request",
    "object",
    "oldObject",
    "operation",
    "uid",
    "name",
    "namespace",
    "generateName",
    "labels",
    "annotations",
    "managedFields",
    "finalizers",
    "deletionTimestamp",
    "size",
    "version",
    "repository",
    "paused",
    "pod",
    "TLS",
    "static",
    "member",
    "peerSecret",
    "serverSecret",
    "operatorSecret",
    "etcdEnv",
    "value",
    "valueFrom",
    "secretKeyRef",
    "resources",
    "requests",
    "limits",
    "cpu",
    "memory",
    "storage",
    "ephemeral-storage",
    "persistentVolumeClaimSpec",
    "storageClassName",
    "accessModes",
    "volumeMode",
    "storageMedium",
    "ClusterDomain",
    "DNSTimeoutInSecond",
    "busyboxImage",
    "antiAffinity",
    "affinity",
    "nodeSelector",
    "tolerations",
    "securityContext",
    "sysctls",
    "capabilities",
    "privileged",
    "runAsUser",
    "topologySpreadConstraints",
    "maxSkew",
    "currentVersion",
    "targetVersion",
    "phase",
    "conditions",
    "members",
    "dryRun",
    "patch",
    "x-future",
    "",
];

/// Strings the rules parse: quantities, versions, names, images, env names, enums, unicode.
const STRINGS: &[&str] = &[
    "",
    " ",
    "0",
    "-1",
    "+1",
    "1",
    "0e999",
    "1e308Ei",
    "1e-999",
    "-0",
    ".5",
    "1.",
    "1Ei",
    "8Ei",
    "9223372036854775807",
    "9223372036854775808m",
    "99999999999999999999999999999999Ki",
    "0.000000001m",
    "1.5Gi",
    "64Mi",
    "63.99999999999Mi",
    "1Gi",
    "512Mi",
    "500m",
    "1500m",
    "NaN",
    "Infinity",
    "1e",
    "Mi",
    "3.6.16",
    "v3.6.16",
    "3.5.35",
    "3.7.3",
    "3.2.13",
    "3.6",
    "3.6.",
    "3..6",
    "3.6.16-rc.1+build.5",
    "3.6.99999999999999999999",
    "18446744073709551616.0.0",
    "v",
    "latest",
    "4.0.0",
    "0.0.0",
    "demo",
    "a-b",
    "1etcd",
    "Bad_Name",
    "-",
    "a.b",
    "quay.io/coreos/etcd",
    "quay.io/coreos/etcd:v3.5.0",
    "registry:5000/etcd",
    "etcd@sha256:0000000000000000000000000000000000000000000000000000000000000000",
    "UPPER/Case",
    "a//b",
    "ETCD_NAME",
    "ETCD_LOGGER",
    "ETCD_CONFIG_FILE",
    "ETCD_FORCE_NEW_CLUSTER",
    "ETCD_UNSAFE_NO_FSYNC",
    "ETCD_ENABLE_V2",
    "ETCD_PEER_CERT_FILE",
    "ETCD_CLIENT_CERT_AUTH",
    "ETCD_QUOTA_BACKEND_BYTES",
    "POD_IP",
    "app",
    "etcd_cluster",
    "example.com/owner",
    "kubernetes.io/x",
    "not ok",
    "CREATE",
    "UPDATE",
    "DELETE",
    "CONNECT",
    "create",
    "Memory",
    "HugePages",
    "ReadWriteOnce",
    "ReadWriteMany",
    "Block",
    "Filesystem",
    "NoSchedule",
    "Exists",
    "Equal",
    "kernel.msgmax",
    "SYS_ADMIN",
    "Running",
    "Failed",
    "cluster.local",
    ".cluster.local",
    "corp.example",
    "admission.k8s.io/v1",
    "admission.k8s.io/v1beta1",
    "AdmissionReview",
    "etcd.database.coreos.com",
    "v1beta2",
    "EtcdCluster",
    "2026-01-01T00:00:00Z",
    "not a time",
    "\u{0}",
    "\u{7f}",
    "é",
    "e\u{301}",
    "\u{202e}rtl",
    "\u{feff}",
    "\u{fffd}",
    "😀",
    "\u{10ffff}",
    "中文",
    "a\nb",
    "\"",
    "\\",
    "${POD_IP}",
    "$(POD_IP)",
    "%s%n",
];

/// Numbers at the extremes of every type the decoders use.
fn extreme_number(rng: &mut fastrand::Rng) -> Value {
    let ints: &[i64] = &[
        0,
        1,
        -1,
        2,
        3,
        7,
        8,
        255,
        256,
        65535,
        i32::MAX as i64,
        i32::MAX as i64 + 1,
        i32::MIN as i64,
        i32::MIN as i64 - 1,
        u32::MAX as i64,
        u32::MAX as i64 + 1,
        (1 << 53) + 1,
        i64::MAX,
        i64::MIN,
    ];
    match rng.u8(0..4) {
        0 => json!(u64::MAX),
        1 => {
            let floats = [
                0.5,
                -0.0,
                1e308,
                -1e308,
                f64::MAX,
                f64::MIN_POSITIVE,
                5e-324,
                3.0000000001,
                2.5,
                1e19,
            ];
            Value::Number(Number::from_f64(floats[rng.usize(..floats.len())]).unwrap())
        }
        _ => json!(ints[rng.usize(..ints.len())]),
    }
}

/// A random JSON value made by `arbitrary` from random bytes, at most `depth` levels deep.
fn arbitrary_value(rng: &mut fastrand::Rng, depth: u32) -> Value {
    let mut bytes = vec![0u8; rng.usize(8..256)];
    rng.fill(&mut bytes);
    let mut u = Unstructured::new(&bytes);
    arb_value(&mut u, depth).unwrap_or(Value::Null)
}

fn arb_value(u: &mut Unstructured<'_>, depth: u32) -> arbitrary::Result<Value> {
    let top = if depth == 0 { 3 } else { 5 };
    Ok(match u.int_in_range(0..=top)? {
        0 => Value::Null,
        1 => Value::Bool(u.arbitrary()?),
        2 => match u.int_in_range(0..=2)? {
            0 => json!(u.arbitrary::<i64>()?),
            1 => json!(u.arbitrary::<u64>()?),
            _ => Number::from_f64(u.arbitrary()?).map_or(Value::Null, Value::Number),
        },
        3 => Value::String(u.arbitrary()?),
        4 => {
            let n = u.int_in_range(0..=4)?;
            let mut a = Vec::with_capacity(n);
            for _ in 0..n {
                a.push(arb_value(u, depth - 1)?);
            }
            Value::Array(a)
        }
        _ => {
            let n = u.int_in_range(0..=4)?;
            let mut m = Map::new();
            for _ in 0..n {
                let key = if u.ratio(1, 2)? {
                    KEYS[u.choose_index(KEYS.len())?].to_string()
                } else {
                    u.arbitrary()?
                };
                m.insert(key, arb_value(u, depth - 1)?);
            }
            Value::Object(m)
        }
    })
}

/// A value the rules find interesting: a dictionary string, an extreme number, a random tree.
fn interesting_value(rng: &mut fastrand::Rng) -> Value {
    match rng.u8(0..10) {
        0..=3 => Value::String(STRINGS[rng.usize(..STRINGS.len())].to_string()),
        4 | 5 => extreme_number(rng),
        6 => Value::Bool(rng.bool()),
        7 => Value::Null,
        _ => arbitrary_value(rng, 3),
    }
}

fn type_of(v: &Value) -> u8 {
    match v {
        Value::Null => 0,
        Value::Bool(_) => 1,
        Value::Number(_) => 2,
        Value::String(_) => 3,
        Value::Array(_) => 4,
        Value::Object(_) => 5,
    }
}

fn count_nodes(v: &Value) -> usize {
    1 + match v {
        Value::Array(a) => a.iter().map(count_nodes).sum(),
        Value::Object(m) => m.values().map(count_nodes).sum(),
        _ => 0,
    }
}

/// The `n`th node of `v` in pre-order.
fn nth_mut<'a>(v: &'a mut Value, n: &mut usize) -> Option<&'a mut Value> {
    if *n == 0 {
        return Some(v);
    }
    *n -= 1;
    match v {
        Value::Array(a) => {
            for x in a {
                if let Some(found) = nth_mut(x, n) {
                    return Some(found);
                }
            }
            None
        }
        Value::Object(m) => {
            for x in m.values_mut() {
                if let Some(found) = nth_mut(x, n) {
                    return Some(found);
                }
            }
            None
        }
        _ => None,
    }
}

fn nth(v: &Value, n: &mut usize) -> Option<Value> {
    if *n == 0 {
        return Some(v.clone());
    }
    *n -= 1;
    let children: Box<dyn Iterator<Item = &Value>> = match v {
        Value::Array(a) => Box::new(a.iter()),
        Value::Object(m) => Box::new(m.values()),
        _ => return None,
    };
    for x in children {
        if let Some(found) = nth(x, n) {
            return Some(found);
        }
    }
    None
}

/// A random node of `doc`, most often inside `request.object` (its spec above all) or
/// `request.oldObject`, where the rules look.
fn pick<'a>(rng: &mut fastrand::Rng, doc: &'a mut Value) -> &'a mut Value {
    const ROOTS: &[&str] = &[
        "",
        "/request",
        "/request/object",
        "/request/object/spec",
        "/request/object/spec",
        "/request/object/spec/pod",
        "/request/object/metadata",
        "/request/object/status",
        "/request/oldObject",
        "/request/oldObject/spec",
    ];
    let root = ROOTS[rng.usize(..ROOTS.len())];
    let target = if doc.pointer(root).is_some() {
        doc.pointer_mut(root).unwrap()
    } else {
        doc
    };
    let mut n = rng.usize(..count_nodes(target));
    nth_mut(target, &mut n).expect("an index below the node count")
}

/// Length of `v` serialized, without allocating the text.
fn serialized_len(v: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    serde_json::to_writer(&mut c, v).expect("a Value serializes");
    c.0
}

/// Picks a random key of `m`.
fn random_key(rng: &mut fastrand::Rng, m: &Map<String, Value>) -> Option<String> {
    if m.is_empty() {
        None
    } else {
        m.keys().nth(rng.usize(..m.len())).cloned()
    }
}

/// How many copies fit `budget` bytes when one copy serializes to `unit` bytes (at least 1).
fn copies(rng: &mut fastrand::Rng, unit: usize, budget: usize) -> usize {
    // Mostly a few copies within 64 KiB; one time in 40 up to the whole body limit.
    let (want, budget) = if rng.u8(0..40) == 0 {
        ([1000, 10_000, 100_000][rng.usize(..3)], budget)
    } else {
        ([2, 3, 10, 100][rng.usize(..4)], budget.min(64 << 10))
    };
    want.min(budget / unit.max(1)).max(1)
}

/// One structure-aware mutation of `doc`, growing it to at most [`MAX_BODY_BYTES`]. Returns
/// what it did.
fn mutate_tree(rng: &mut fastrand::Rng, doc: &mut Value, corpus: &[Seed]) -> String {
    let kind = rng.u8(0..11);
    // Only the mutations that grow the body need its size.
    let budget = if matches!(kind, 3 | 5 | 9) {
        MAX_BODY_BYTES.saturating_sub(serialized_len(doc))
    } else {
        0
    };
    if kind == 10 {
        return mutate_envelope(rng, doc, corpus);
    }
    let splice = (kind == 9).then(|| {
        let other = &corpus[rng.usize(..corpus.len())].value;
        let mut n = rng.usize(..count_nodes(other));
        nth(other, &mut n).unwrap_or(Value::Null)
    });
    let t = pick(rng, doc);
    match kind {
        0 => {
            let was = type_of(t);
            let mut v = interesting_value(rng);
            for _ in 0..8 {
                if type_of(&v) != was {
                    break;
                }
                v = interesting_value(rng);
            }
            *t = v;
            "replace a node with another type".into()
        }
        1 => match t {
            Value::Object(m) => match random_key(rng, m) {
                Some(k) => {
                    m.remove(&k);
                    format!("delete key {k:?}")
                }
                None => "delete from an empty map".into(),
            },
            Value::Array(a) if !a.is_empty() => {
                a.remove(rng.usize(..a.len()));
                "delete an array element".into()
            }
            _ => {
                *t = Value::Null;
                "null a scalar".into()
            }
        },
        2 => match t {
            Value::Object(m) => {
                let key = if rng.u8(0..5) == 0 {
                    arbitrary_value(rng, 0).as_str().unwrap_or("k").to_string()
                } else {
                    KEYS[rng.usize(..KEYS.len())].to_string()
                };
                m.insert(key.clone(), interesting_value(rng));
                format!("insert key {key:?}")
            }
            Value::Array(a) => {
                let v = match a.first() {
                    Some(first) if rng.bool() => {
                        let mut v = first.clone();
                        if let Value::Object(m) = &mut v
                            && let Some(k) = random_key(rng, m)
                        {
                            m.insert(k, interesting_value(rng));
                        }
                        v
                    }
                    _ => interesting_value(rng),
                };
                a.insert(rng.usize(..=a.len()), v);
                "insert an array element".into()
            }
            _ => {
                *t = interesting_value(rng);
                "replace a scalar".into()
            }
        },
        3 => {
            let unit = serialized_len(t);
            let k = copies(rng, unit, budget);
            match t {
                Value::Array(a) if !a.is_empty() => {
                    let copy = a.clone();
                    for _ in 1..k {
                        a.extend(copy.iter().cloned());
                    }
                    format!("array x{k}")
                }
                Value::Object(m) if !m.is_empty() => {
                    let key = random_key(rng, m).unwrap();
                    let value = m[&key].clone();
                    let k = copies(rng, serialized_len(&value) + key.len() + 8, budget);
                    for j in 0..k {
                        m.insert(format!("{key}-{j}"), value.clone());
                    }
                    format!("map entry {key:?} x{k}")
                }
                Value::String(s) if !s.is_empty() => {
                    *s = s.repeat(k);
                    format!("string x{k}")
                }
                other => {
                    *other = Value::Array(vec![other.clone(); k]);
                    format!("scalar as array x{k}")
                }
            }
        }
        4 => {
            let depth = match rng.u8(0..3) {
                0 => rng.u32(2..16),
                1 => rng.u32(120..=130),
                _ => rng.u32(130..=400),
            };
            let key = KEYS[rng.usize(..KEYS.len())];
            let arrays = rng.bool();
            let mut v = t.take();
            for _ in 0..depth {
                v = if arrays {
                    json!([v])
                } else {
                    json!({ key: v })
                };
            }
            *t = v;
            format!("nest {depth} deep")
        }
        5 => {
            const UNITS: &[&str] = &[
                "a", "é", "😀", "\\", "\"", "\u{0}", "9", " ", "\u{202e}", "ab-", "\n",
            ];
            let unit = UNITS[rng.usize(..UNITS.len())];
            // Mostly kilobytes; one time in 60 megabytes, up to the body limit.
            let want = if rng.u8(0..60) == 0 {
                [1 << 20, 3 << 20][rng.usize(..2)]
            } else {
                [64, 256, 4096, 65_536][rng.usize(..4)]
            };
            // A control character serializes to 6 bytes.
            let n = (want / unit.len()).min(budget / 6 / unit.len()).max(1);
            *t = Value::String(unit.repeat(n));
            format!("string of {n} x {unit:?}")
        }
        6 => {
            *t = extreme_number(rng);
            format!("number {t}")
        }
        7 => {
            *t = Value::String(STRINGS[rng.usize(..STRINGS.len())].to_string());
            format!("string {t}")
        }
        8 => edit(rng, t),
        _ => {
            let v = splice.unwrap_or(Value::Null);
            if serialized_len(&v) < budget {
                *t = v;
            }
            "splice a subtree of another seed".into()
        }
    }
}

/// Small edits of a value in place.
fn edit(rng: &mut fastrand::Rng, t: &mut Value) -> String {
    match t {
        Value::String(s) => {
            let chars: Vec<char> = s.chars().collect();
            let at = rng.usize(..=chars.len());
            let mut out: String;
            let what = match rng.u8(0..7) {
                0 => {
                    const CHARS: &[char] = &[
                        '.', '-', '_', '/', ':', '@', '=', ' ', 'e', 'E', 'i', 'm', 'k', 'M', 'G',
                        'v', '0', '9', '+', '\u{0}', 'é', '\u{301}', '\u{feff}', '😀',
                    ];
                    let c = if rng.bool() {
                        CHARS[rng.usize(..CHARS.len())]
                    } else {
                        char::from_u32(rng.u32(0..0x11_0000)).unwrap_or('\u{fffd}')
                    };
                    out = chars[..at].iter().collect();
                    out.push(c);
                    out.extend(&chars[at..]);
                    "insert a character"
                }
                1 if !chars.is_empty() => {
                    let at = at.min(chars.len() - 1);
                    out = chars[..at].iter().chain(&chars[at + 1..]).collect();
                    "delete a character"
                }
                2 => {
                    out = chars[..at].iter().collect();
                    "truncate"
                }
                3 => {
                    out = s.to_uppercase();
                    "uppercase"
                }
                4 => {
                    out = format!("{s}{}", STRINGS[rng.usize(..STRINGS.len())]);
                    "append a dictionary string"
                }
                5 => {
                    let digit = if rng.bool() { "9" } else { "0" };
                    let run = digit.repeat([20, 400, 5000][rng.usize(..3)]);
                    out = chars[..at].iter().collect();
                    out.push_str(&run);
                    out.extend(&chars[at..]);
                    "insert a digit run"
                }
                _ => {
                    out = format!("v{s}");
                    "prefix v"
                }
            };
            *s = out;
            what.into()
        }
        Value::Number(n) => {
            let f = n.as_f64().unwrap_or(0.0);
            let v = match rng.u8(0..5) {
                0 => n
                    .as_i64()
                    .map_or(json!(f + 1.0), |i| json!(i.wrapping_add(1))),
                1 => n
                    .as_i64()
                    .map_or(json!(f - 1.0), |i| json!(i.wrapping_sub(1))),
                2 => n.as_i64().map_or(json!(-f), |i| json!(i.wrapping_neg())),
                3 => json!(f * 1e10),
                _ => Value::String(n.to_string()),
            };
            *t = v;
            "edit a number".into()
        }
        Value::Bool(b) => {
            *t = if rng.bool() {
                Value::Bool(!*b)
            } else {
                Value::String(b.to_string())
            };
            "edit a bool".into()
        }
        Value::Null => {
            *t = interesting_value(rng);
            "fill a null".into()
        }
        Value::Array(a) => {
            if rng.bool() {
                a.reverse();
                "reverse an array".into()
            } else {
                a.clear();
                "clear an array".into()
            }
        }
        Value::Object(m) => {
            if rng.bool() {
                m.clear();
                "clear a map".into()
            } else {
                *t = Value::Array(m.values().cloned().collect());
                "map to array".into()
            }
        }
    }
}

/// Changes the AdmissionReview envelope: operation, kind, objects, versions.
fn mutate_envelope(rng: &mut fastrand::Rng, doc: &mut Value, corpus: &[Seed]) -> String {
    let Some(request) = doc.get_mut("request").and_then(Value::as_object_mut) else {
        *doc = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": doc.take()});
        return "wrap in an envelope".into();
    };
    match rng.u8(0..8) {
        0 => {
            let op = [
                "CREATE", "UPDATE", "DELETE", "CONNECT", "PATCH", "", "create",
            ][rng.usize(..7)];
            request.insert("operation".into(), json!(op));
            format!("operation {op}")
        }
        1 => {
            let object = request.get("object").cloned().unwrap_or_default();
            request.insert("oldObject".into(), object);
            request.insert("operation".into(), json!("UPDATE"));
            "update with oldObject = object".into()
        }
        2 => {
            let object = request.remove("object").unwrap_or_default();
            let old = request.remove("oldObject").unwrap_or_default();
            request.insert("object".into(), old);
            request.insert("oldObject".into(), object);
            "swap object and oldObject".into()
        }
        3 => {
            let key = if rng.bool() { "object" } else { "oldObject" };
            request.remove(key);
            format!("remove {key}")
        }
        4 => {
            let (field, value) = match rng.u8(0..4) {
                0 => ("group", interesting_value(rng)),
                1 => (
                    "version",
                    json!(["v1", "v1beta1", "v1beta2", ""][rng.usize(..4)]),
                ),
                2 => (
                    "kind",
                    json!(["EtcdCluster", "Pod", "etcdcluster", ""][rng.usize(..4)]),
                ),
                _ => ("kind", interesting_value(rng)),
            };
            if let Some(kind) = request.get_mut("kind").and_then(Value::as_object_mut) {
                kind.insert(field.into(), value);
            }
            format!("request.kind.{field} changed")
        }
        5 => {
            let key = ["uid", "name", "namespace", "dryRun", "userInfo", "options"][rng.usize(..6)];
            request.insert(key.into(), interesting_value(rng));
            format!("request.{key} changed")
        }
        6 => {
            let other = &corpus[rng.usize(..corpus.len())].value;
            let key = if rng.bool() { "object" } else { "oldObject" };
            let v = other
                .pointer(&format!("/request/{key}"))
                .cloned()
                .unwrap_or_default();
            request.insert(key.into(), v);
            format!("{key} from another seed")
        }
        _ => {
            let (key, v) = if rng.bool() {
                (
                    "apiVersion",
                    ["admission.k8s.io/v1beta1", "v1", "", "admission.k8s.io/v2"][rng.usize(..4)],
                )
            } else {
                (
                    "kind",
                    ["AdmissionResponse", "admissionreview", ""][rng.usize(..3)],
                )
            };
            doc[key] = json!(v);
            format!("{key} {v:?}")
        }
    }
}

/// One byte-level mutation of `body`; `budget` is how many bytes it may add.
fn mutate_bytes(rng: &mut fastrand::Rng, body: &mut Vec<u8>, budget: usize) -> String {
    const TOKENS: &[&[u8]] = &[
        b"\"",
        b"\\",
        b"{",
        b"}",
        b"[",
        b"]",
        b",",
        b":",
        b"null",
        b"true",
        b"-",
        b"0",
        b"-0",
        b"1e999999",
        b"NaN",
        b"\\u0000",
        b"\\ud800",
        b"\\udc00\\ud800",
        b"\\uZZZZ",
        b"\\x",
        b"{\"\":",
        b"[[[[[[[[",
        b"\xff",
        b"\xc0\xaf",
        b"\xed\xa0\x80",
        b"\xf4\x90\x80\x80",
        b"\xe2\x80\xae",
        b"\x00",
        b"\t\r\n ",
        b"\xef\xbb\xbf",
    ];
    let len = body.len();
    let at = rng.usize(..=len);
    match rng.u8(0..8) {
        0 if len > 0 => {
            let i = rng.usize(..len);
            body[i] ^= 1 << rng.u8(0..8);
            format!("flip a bit at {i}")
        }
        1 if len > 0 => {
            let i = rng.usize(..len);
            body[i] = if rng.bool() {
                TOKENS[rng.usize(..TOKENS.len())][0]
            } else {
                rng.u8(..)
            };
            format!("set byte {i}")
        }
        2 | 3 => {
            let token = TOKENS[rng.usize(..TOKENS.len())];
            // After a quote most of the time, so the token lands inside a string.
            let at = body[..at]
                .iter()
                .rposition(|&b| b == b'"')
                .filter(|_| rng.bool())
                .map_or(at, |q| q + 1);
            body.splice(at..at, token.iter().copied());
            format!("insert {:?} at {at}", String::from_utf8_lossy(token))
        }
        4 if len > 0 => {
            let n = rng.usize(1..=(len - at.min(len - 1)).min(256));
            let at = at.min(len - 1);
            body.drain(at..(at + n).min(len));
            format!("delete {n} bytes at {at}")
        }
        5 if len > 0 => {
            let from = rng.usize(..len);
            let n = rng.usize(1..=(len - from).min(4096)).min(budget.max(1));
            let chunk = body[from..from + n].to_vec();
            body.splice(at..at, chunk);
            format!("duplicate {n} bytes from {from} at {at}")
        }
        6 => {
            body.truncate(at);
            format!("truncate at {at}")
        }
        _ => {
            let digit = if rng.bool() { b'9' } else { b'0' };
            let n = [20, 400, 5000][rng.usize(..3)].min(budget.max(1));
            let at = body[..at]
                .iter()
                .rposition(u8::is_ascii_digit)
                .map_or(at, |d| d + 1);
            body.splice(at..at, std::iter::repeat_n(digit, n));
            format!("insert {n} digits at {at}")
        }
    }
}

/// Generates input `index` of `seed` from `corpus`: the same input every time.
pub fn generate(corpus: &[Seed], seed: u64, index: u64) -> Input {
    let mut rng = fastrand::Rng::with_seed(mix(seed, index));
    let s = &corpus[rng.usize(..corpus.len())];
    let mut mutations = Vec::new();
    let plan = rng.u8(0..100);
    let mut body = match plan {
        0..=2 => s.bytes.clone(),
        3..=5 => {
            // A fresh tree from `arbitrary`, as the request or as the object.
            let v = arbitrary_value(&mut rng, 5);
            let doc = if rng.bool() {
                mutations.push("arbitrary request".to_string());
                json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": v})
            } else {
                mutations.push("arbitrary object".to_string());
                let mut doc = s.value.clone();
                if let Some(r) = doc.get_mut("request").and_then(Value::as_object_mut) {
                    r.insert("object".into(), v);
                }
                doc
            };
            serde_json::to_vec(&doc).expect("a Value serializes")
        }
        _ => {
            // Structure-aware alone 70%, followed by byte-level 13%, byte-level alone 11%.
            let structural = plan < 89;
            let bytes = plan >= 76;
            let mut body = if structural {
                let mut doc = s.value.clone();
                for _ in 0..rng.usize(1..=4) {
                    mutations.push(mutate_tree(&mut rng, &mut doc, corpus));
                }
                serde_json::to_vec(&doc).expect("a Value serializes")
            } else {
                s.bytes.clone()
            };
            if bytes {
                for _ in 0..rng.usize(1..=4) {
                    let budget = MAX_BODY_BYTES.saturating_sub(body.len());
                    mutations.push(mutate_bytes(&mut rng, &mut body, budget));
                }
            }
            body
        }
    };
    if body.len() > MAX_BODY_BYTES {
        body.truncate(MAX_BODY_BYTES);
        mutations.push(format!("truncated to {MAX_BODY_BYTES} bytes"));
    }
    Input {
        body,
        seed: s.name.clone(),
        mutations,
    }
}

thread_local! {
    /// Set while a call runs under `catch_unwind`: the panic hook records instead of printing.
    static CATCHING: RefCell<bool> = const { RefCell::new(false) };
    /// The last panic caught: message, location and stack.
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Installs (once) a panic hook that records the message and stack of a caught panic and
/// leaves every other panic to the default hook.
fn install_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if CATCHING.with(|c| *c.borrow()) {
                let stack = Backtrace::force_capture();
                LAST_PANIC.with(|l| *l.borrow_mut() = Some(format!("{info}\nstack:\n{stack}")));
            } else {
                default(info);
            }
        }));
    });
}

/// Runs `f`, turning a panic into `Err` with its message and stack.
fn catch<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    CATCHING.with(|c| *c.borrow_mut() = true);
    let result = panic::catch_unwind(AssertUnwindSafe(f));
    CATCHING.with(|c| *c.borrow_mut() = false);
    result.map_err(|_| {
        LAST_PANIC
            .with(|l| l.borrow_mut().take())
            .unwrap_or_else(|| "a panic (no message)".into())
    })
}

/// The latencies of one kind of call, in nanoseconds (saturated at about 4.3 s).
#[derive(Default)]
pub struct Latencies {
    nanos: Vec<u32>,
    /// The slowest call: its duration, input index, endpoint and body size.
    pub slowest: Option<(Duration, u64, Endpoint, usize)>,
    /// By body size (up to 1 KiB, 16 KiB, 256 KiB, 1 MiB, 4 MiB): calls, total and max time.
    pub by_size: [(u64, Duration, Duration); 5],
}

/// Upper bounds of [`Latencies::by_size`], bytes.
const SIZE_BUCKETS: [usize; 5] = [1 << 10, 16 << 10, 256 << 10, 1 << 20, MAX_BODY_BYTES];

impl Latencies {
    fn record(&mut self, d: Duration, index: u64, endpoint: Endpoint, bytes: usize) {
        self.nanos
            .push(u32::try_from(d.as_nanos()).unwrap_or(u32::MAX));
        let bucket = SIZE_BUCKETS
            .iter()
            .position(|&b| bytes <= b)
            .unwrap_or(SIZE_BUCKETS.len() - 1);
        let (calls, total, max) = &mut self.by_size[bucket];
        *calls += 1;
        *total += d;
        *max = (*max).max(d);
        if self.slowest.is_none_or(|(s, ..)| d > s) {
            self.slowest = Some((d, index, endpoint, bytes));
        }
    }

    /// Quantiles (`q` in 0..=1, nearest rank) over the sorted latencies.
    fn quantiles(&self, qs: &[f64]) -> Vec<Duration> {
        let mut sorted = self.nanos.clone();
        sorted.sort_unstable();
        qs.iter()
            .map(|q| {
                if sorted.is_empty() {
                    return Duration::ZERO;
                }
                let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
                Duration::from_nanos(u64::from(sorted[rank - 1]))
            })
            .collect()
    }

    /// The largest latency recorded.
    pub fn max(&self) -> Duration {
        self.slowest.map_or(Duration::ZERO, |(d, ..)| d)
    }

    /// `p50 .. p99 .. p99.99 .. max` as text.
    fn summary(&self) -> String {
        let q = self.quantiles(&[0.5, 0.99, 0.999, 0.9999]);
        let slowest = self.slowest.map_or(String::new(), |(_, i, e, b)| {
            format!(" (input {i}, /{}, {b} bytes)", e.as_str())
        });
        format!(
            "{} calls: p50 {}, p99 {}, p99.9 {}, p99.99 {}, max {}{slowest}",
            self.nanos.len(),
            ms(q[0]),
            ms(q[1]),
            ms(q[2]),
            ms(q[3]),
            ms(self.max()),
        )
    }

    /// Mean and max by body size, as text.
    fn by_size_summary(&self) -> String {
        let names = ["<=1KiB", "<=16KiB", "<=256KiB", "<=1MiB", "<=4MiB"];
        let parts: Vec<String> = names
            .iter()
            .zip(&self.by_size)
            .filter(|(_, (calls, ..))| *calls > 0)
            .map(|(name, (calls, total, max))| {
                format!(
                    "{name}: {calls} calls, mean {}, max {}",
                    ms(*total / u32::try_from(*calls).unwrap_or(u32::MAX)),
                    ms(*max)
                )
            })
            .collect();
        parts.join("; ")
    }
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

/// A failing call, written to `file`.
#[derive(Debug, Clone)]
pub struct Failure {
    /// The input index.
    pub index: u64,
    /// `panic`, `internal`, `http-5xx`, `bad-answer`, `bad-patch`, `echo` or `slow`.
    pub kind: &'static str,
    /// The endpoint.
    pub endpoint: Endpoint,
    /// What happened (a panic's message and stack).
    pub detail: String,
    /// Where the input was written (`None` past the first 50).
    pub file: Option<PathBuf>,
}

/// What a run found.
#[derive(Default)]
pub struct Report {
    /// Inputs run.
    pub inputs: u64,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// Of which generating the inputs.
    pub generating: Duration,
    /// Panics caught (direct or through the router).
    pub panics: u64,
    /// `ReviewError::Internal` answers of [`Reviewer::review`].
    pub internal: u64,
    /// HTTP answers of 500 or above.
    pub http_5xx: u64,
    /// Answers that are not an `admission.k8s.io/v1` AdmissionReview for the request's uid.
    pub bad_answers: u64,
    /// Mutate patches that do not apply to the request's object.
    pub bad_patches: u64,
    /// Calls slower than the bound.
    pub slow: u64,
    /// Answers quoting more than [`MAX_ECHO`] bytes in one message, warning or error.
    pub echoes: u64,
    /// The bound: this, plus `per_mib` for each MiB of body.
    pub bound: Duration,
    /// What each MiB of body adds to the bound.
    pub per_mib: Duration,
    /// Answers of `review`: allowed, denied, with a patch.
    pub allowed: u64,
    /// Refusals.
    pub denied: u64,
    /// Mutate answers with a patch, each applied to the request's object.
    pub patches: u64,
    /// Mutate answers with a patch not applied: the object is over serde_json's 128 levels.
    pub patches_unchecked: u64,
    /// `review` errors by kind.
    pub errors: BTreeMap<String, u64>,
    /// HTTP statuses.
    pub statuses: BTreeMap<u16, u64>,
    /// Refusal rules reached, with counts.
    pub rules: BTreeMap<&'static str, u64>,
    /// HTTP status and `review` outcome disagreeing (a 200 for an error or the reverse).
    pub mismatches: u64,
    /// Latencies of `Reviewer::review`.
    pub review: Latencies,
    /// Latencies through the router.
    pub http: Latencies,
    /// Largest body generated.
    pub largest_body: usize,
    /// Largest answer: bytes, input index, body bytes.
    pub largest_answer: (usize, u64, usize),
    /// Total bytes generated.
    pub bytes: u64,
    /// Where the inputs with the largest answer and the slowest review were written.
    pub kept: Vec<String>,
    /// The failures (every one counted above, the first 50 written to files).
    pub failures: Vec<Failure>,
}

impl Report {
    /// Failing calls of every kind.
    pub fn failed(&self) -> u64 {
        self.panics
            + self.internal
            + self.http_5xx
            + self.bad_answers
            + self.bad_patches
            + self.slow
            + self.echoes
    }

    /// The report as printed at the end of a run.
    pub fn text(&self, options: &Options, corpus: &[Seed]) -> String {
        let mut t = String::new();
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        let corpus_bytes: usize = corpus.iter().map(|s| s.bytes.len()).sum();
        let _ = writeln!(
            t,
            "fuzz: seed {}, inputs {}..{}, corpus {} seeds ({} bytes) in {}",
            options.seed,
            options.first,
            options.first + self.inputs,
            corpus.len(),
            corpus_bytes,
            options.corpus.display()
        );
        let _ = writeln!(
            t,
            "  {} inputs in {:.1} s ({:.1} s generating them): {:.0} inputs/s, {} calls (review and HTTP router, /validate and /mutate each), {:.1} MB generated, largest body {} bytes",
            self.inputs,
            secs,
            self.generating.as_secs_f64(),
            self.inputs as f64 / secs,
            self.review.nanos.len() + self.http.nanos.len(),
            self.bytes as f64 / 1e6,
            self.largest_body
        );
        let _ = writeln!(
            t,
            "  failures: {} panics, {} internal errors, {} HTTP 5xx, {} bad answers, {} bad patches, {} echoes, {} calls over {} + {} per MiB of body",
            self.panics,
            self.internal,
            self.http_5xx,
            self.bad_answers,
            self.bad_patches,
            self.echoes,
            self.slow,
            ms(self.bound),
            ms(self.per_mib)
        );
        let _ = writeln!(t, "  latency review: {}", self.review.summary());
        let _ = writeln!(t, "  latency HTTP:   {}", self.http.summary());
        let _ = writeln!(
            t,
            "  review by body size: {}",
            self.review.by_size_summary()
        );
        let _ = writeln!(
            t,
            "  answers: {} allowed ({} with a patch, each applied to its object, and {} with a patch on an object too deep for a JSON tree), {} denied; errors {:?}; HTTP {:?}; {} status/outcome mismatches",
            self.allowed,
            self.patches,
            self.patches_unchecked,
            self.denied,
            self.errors,
            self.statuses,
            self.mismatches
        );
        let (size, index, body) = self.largest_answer;
        let _ = writeln!(
            t,
            "  largest answer: {size} bytes (input {index}, body {body} bytes)"
        );
        let _ = writeln!(t, "  {} rules reached: {:?}", self.rules.len(), self.rules);
        for k in &self.kept {
            let _ = writeln!(t, "  kept {k}");
        }
        for f in &self.failures {
            let first = f.detail.lines().next().unwrap_or("");
            let file = f
                .file
                .as_ref()
                .map_or("(not written)".to_string(), |p| p.display().to_string());
            let _ = writeln!(
                t,
                "  FAILED input {} /{} {}: {first}\n    input: {file}",
                f.index,
                f.endpoint.as_str(),
                f.kind
            );
        }
        t
    }
}

/// The fuzz run: the corpus, the reviewer, the router and the counts.
pub struct Fuzzer {
    options: Options,
    corpus: Vec<Seed>,
    reviewer: Reviewer,
    router: axum::Router,
    runtime: tokio::runtime::Runtime,
    report: Report,
    /// The inputs with the largest answer and the slowest review, written at the end.
    kept: [Option<(u64, Vec<u8>)>; 2],
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a tokio runtime")
}

impl Fuzzer {
    /// A run with `options`, on the corpus they name, against the default policy and the
    /// router as the binary builds it from its default flags (body limit, request timeout,
    /// in-flight memory budget).
    pub fn new(options: Options) -> Fuzzer {
        install_panic_hook();
        let corpus = load_corpus(&options.corpus);
        let reviewer = Reviewer::default();
        // The binary's defaults, as `server::start` builds its state from them.
        let args = Args::try_parse_from([
            "etcd-webhook",
            "--tls-cert-file=unused",
            "--tls-private-key-file=unused",
        ])
        .expect("the default arguments");
        let metrics = Metrics::new().expect("metrics");
        let state = Arc::new(WebhookState {
            reviewer: reviewer.clone(),
            metrics: metrics.clone(),
            max_body_bytes: args.max_request_body_size,
            request_timeout: args.request_timeout,
            budget: InflightBudget::new(
                args.max_in_flight_memory,
                Duration::from_secs(1),
                metrics.reserved_bytes().clone(),
            ),
        });
        let report = Report {
            bound: options.max_latency,
            per_mib: options.latency_per_mib,
            ..Report::default()
        };
        Fuzzer {
            options,
            corpus,
            reviewer,
            router: webhook_router(state),
            runtime: runtime(),
            report,
            kept: [None, None],
        }
    }

    /// The corpus.
    pub fn corpus(&self) -> &[Seed] {
        &self.corpus
    }

    /// The options.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// Runs every input (or the `--replay` file) and returns the report.
    pub fn run(mut self) -> (Report, Options, Vec<Seed>) {
        let started = Instant::now();
        let mut last = started;
        if let Some(path) = self.options.replay.clone() {
            let body = std::fs::read(&path)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
            let input = Input {
                body,
                seed: format!("replay of {}", path.display()),
                mutations: Vec::new(),
            };
            self.one(self.options.first, &input);
        } else {
            let first = self.options.first;
            for index in first..first + self.options.inputs {
                let generating = Instant::now();
                let input = generate(&self.corpus, self.options.seed, index);
                self.report.generating += generating.elapsed();
                self.one(index, &input);
                if !self.options.progress.is_zero() && last.elapsed() >= self.options.progress {
                    last = Instant::now();
                    let done = index + 1 - first;
                    eprintln!(
                        "fuzz: {done}/{} inputs, {:.0}/s, {} failures, max review {} / HTTP {}",
                        self.options.inputs,
                        done as f64 / started.elapsed().as_secs_f64(),
                        self.report.failed(),
                        ms(self.report.review.max()),
                        ms(self.report.http.max()),
                    );
                }
            }
        }
        self.report.elapsed = started.elapsed();
        for (what, kept) in ["largest-answer", "slowest"].iter().zip(&self.kept) {
            if let Some((index, body)) = kept {
                let dir = &self.options.out;
                let path = dir.join(format!("seed{}-{what}.json", self.options.seed));
                if std::fs::create_dir_all(dir)
                    .and_then(|()| std::fs::write(&path, body))
                    .is_ok()
                {
                    self.report
                        .kept
                        .push(format!("{what}: input {index}, {}", path.display()));
                }
            }
        }
        (self.report, self.options, self.corpus)
    }

    /// Runs one input through both endpoints, directly and through the router.
    fn one(&mut self, index: u64, input: &Input) {
        self.report.inputs += 1;
        self.report.bytes += input.body.len() as u64;
        self.report.largest_body = self.report.largest_body.max(input.body.len());
        let body = axum::body::Bytes::from(input.body.clone());
        for endpoint in [Endpoint::Validate, Endpoint::Mutate] {
            let direct_ok = self.direct(index, input, endpoint);
            let status = self.http(index, input, endpoint, body.clone());
            if let (Some(ok), Some(status)) = (direct_ok, status)
                && ok != (status == 200)
            {
                self.report.mismatches += 1;
            }
        }
    }

    /// `Reviewer::review`; `Some(answered)` unless it panicked.
    fn direct(&mut self, index: u64, input: &Input, endpoint: Endpoint) -> Option<bool> {
        let started = Instant::now();
        let result = catch(|| self.reviewer.review(endpoint, &input.body));
        let took = started.elapsed();
        if took > self.report.review.max() {
            self.kept[1] = Some((index, input.body.clone()));
        }
        self.report
            .review
            .record(took, index, endpoint, input.body.len());
        if took > self.bound(input.body.len()) {
            self.report.slow += 1;
            self.fail(
                index,
                input,
                endpoint,
                "slow",
                format!("Reviewer::review took {took:?}"),
            );
        }
        match result {
            Err(panic) => {
                self.report.panics += 1;
                self.fail(index, input, endpoint, "panic", panic);
                None
            }
            Ok(Err(e)) => {
                // The variant's name, from its Debug form (new variants need no change here).
                let debug = format!("{e:?}");
                let kind = debug
                    .split(['(', ' ', '{'])
                    .next()
                    .unwrap_or_default()
                    .to_string();
                *self.report.errors.entry(kind).or_default() += 1;
                let text = e.to_string();
                if text.len() > MAX_ECHO {
                    self.report.echoes += 1;
                    let head: String = text.chars().take(200).collect();
                    let detail = format!("echo: an error of {} bytes: {head}...", text.len());
                    self.fail(index, input, endpoint, "echo", detail);
                }
                if e.http_status() >= 500 {
                    self.report.internal += 1;
                    self.fail(index, input, endpoint, "internal", format!("{e:?}"));
                }
                Some(false)
            }
            Ok(Ok(answer)) => {
                if answer.verdict.allowed {
                    self.report.allowed += 1;
                } else {
                    self.report.denied += 1;
                }
                for rule in &answer.verdict.rules {
                    *self.report.rules.entry(rule).or_default() += 1;
                }
                if answer.body.len() > self.report.largest_answer.0 {
                    self.report.largest_answer = (answer.body.len(), index, input.body.len());
                    self.kept[0] = Some((index, input.body.clone()));
                }
                match check_answer(endpoint, &input.body, &answer.body) {
                    Err(why) => {
                        let kind = if why.starts_with("patch") {
                            self.report.bad_patches += 1;
                            "bad-patch"
                        } else if why.starts_with("echo") {
                            self.report.echoes += 1;
                            "echo"
                        } else {
                            self.report.bad_answers += 1;
                            "bad-answer"
                        };
                        self.fail(index, input, endpoint, kind, why);
                    }
                    Ok(Checked::Patch) => self.report.patches += 1,
                    Ok(Checked::PatchUnchecked) => self.report.patches_unchecked += 1,
                    Ok(Checked::Answer) => {}
                }
                Some(true)
            }
        }
    }

    /// The router's answer; `Some(status)` unless it panicked.
    fn http(
        &mut self,
        index: u64,
        input: &Input,
        endpoint: Endpoint,
        body: axum::body::Bytes,
    ) -> Option<u16> {
        let request = axum::http::Request::builder()
            .method("POST")
            .uri(format!("/{}", endpoint.as_str()))
            .header("content-type", "application/json")
            .body(Body::from(body))
            .expect("a request");
        let router = self.router.clone();
        let started = Instant::now();
        let result = catch(|| {
            self.runtime.block_on(async move {
                let response = router.oneshot(request).await.expect("infallible");
                let status = response.status().as_u16();
                let body = response.into_body().collect().await.map(|b| b.to_bytes());
                (status, body.map(|b| b.len()).map_err(|e| e.to_string()))
            })
        });
        let took = started.elapsed();
        self.report
            .http
            .record(took, index, endpoint, input.body.len());
        if took > self.bound(input.body.len()) {
            self.report.slow += 1;
            self.fail(
                index,
                input,
                endpoint,
                "slow",
                format!("the HTTP router took {took:?}"),
            );
        }
        match result {
            Err(panic) => {
                self.report.panics += 1;
                self.fail(
                    index,
                    input,
                    endpoint,
                    "panic",
                    format!("through the router: {panic}"),
                );
                // The runtime unwound mid-poll: start a fresh one.
                self.runtime = runtime();
                None
            }
            Ok((status, read)) => {
                *self.report.statuses.entry(status).or_default() += 1;
                if status != 200 && read.as_ref().is_ok_and(|&n| n > MAX_ECHO + 1) {
                    self.report.echoes += 1;
                    let detail = format!("echo: an HTTP {status} answer of {read:?} bytes");
                    self.fail(index, input, endpoint, "echo", detail);
                }
                if status >= 500 || read.is_err() {
                    self.report.http_5xx += 1;
                    self.fail(
                        index,
                        input,
                        endpoint,
                        "http-5xx",
                        format!("HTTP {status} ({read:?})"),
                    );
                }
                Some(status)
            }
        }
    }

    /// The latency bound of a call with a body of `bytes`.
    fn bound(&self, bytes: usize) -> Duration {
        self.options.max_latency
            + self
                .options
                .latency_per_mib
                .mul_f64(bytes as f64 / 1048576.0)
    }

    /// Counts a failure and writes its input (the first 50) next to a description.
    fn fail(
        &mut self,
        index: u64,
        input: &Input,
        endpoint: Endpoint,
        kind: &'static str,
        detail: String,
    ) {
        let file = (self.report.failures.len() < 50).then(|| {
            let dir = &self.options.out;
            std::fs::create_dir_all(dir).expect("the failure directory");
            let stem = format!(
                "seed{}-input{index}-{}-{kind}",
                self.options.seed,
                endpoint.as_str()
            );
            let path = dir.join(format!("{stem}.json"));
            std::fs::write(&path, &input.body).expect("the failing input written");
            let mut about = std::fs::File::create(dir.join(format!("{stem}.txt"))).expect("a file");
            let _ = writeln!(
                about,
                "input {index} of seed {} from {}\nmutations: {:?}\n{kind} on /{}: {detail}\n\nreplay: cargo test -p etcd-webhook --test fuzz -- --replay {}\nregenerate: cargo test -p etcd-webhook --test fuzz -- --seed {} --first {index} --inputs 1",
                self.options.seed,
                input.seed,
                input.mutations,
                endpoint.as_str(),
                path.display(),
                self.options.seed,
            );
            eprintln!("fuzz: input {index} failed ({kind} on /{}), written to {}", endpoint.as_str(), path.display());
            path
        });
        self.report.failures.push(Failure {
            index,
            kind,
            endpoint,
            detail,
            file,
        });
    }
}

/// Checks an answer: an `admission.k8s.io/v1` AdmissionReview with the request's uid (read
/// from the request itself: the verdict's is clipped for the logs), and on `/mutate` a base64
/// JSONPatch that applies to the request's object.
fn check_answer(endpoint: Endpoint, body: &[u8], answer: &[u8]) -> Result<Checked, String> {
    // Only the uid is read (the rest skipped, as the webhook skips the objects: a tree of
    // them may nest deeper than serde_json's recursion limit).
    #[derive(serde::Deserialize)]
    struct UidReview {
        request: UidRequest,
    }
    #[derive(serde::Deserialize)]
    struct UidRequest {
        uid: String,
    }
    let review: UidReview = serde_json::from_slice(body)
        .map_err(|e| format!("an answered request has no readable request.uid: {e}"))?;
    let uid = review.request.uid.as_str();
    let answer: Value =
        serde_json::from_slice(answer).map_err(|e| format!("the answer is not JSON: {e}"))?;
    if answer["apiVersion"] != "admission.k8s.io/v1" || answer["kind"] != "AdmissionReview" {
        return Err(format!(
            "not an admission.k8s.io/v1 AdmissionReview: {answer}"
        ));
    }
    let response = &answer["response"];
    if response["uid"] != uid || !response["allowed"].is_boolean() {
        return Err(format!(
            "the response has no uid {uid:?} or allowed: {response}"
        ));
    }
    // The message joins the listed violations (25 at most, each clipped to about 1 KiB).
    if let Some(message) = response["status"]["message"].as_str()
        && message.len() > MAX_MESSAGE
    {
        return Err(format!(
            "echo: a status message of {} bytes: {}...",
            message.len(),
            message.chars().take(200).collect::<String>()
        ));
    }
    let mut texts: Vec<&Value> = Vec::new();
    if let Some(causes) = response["status"]["details"]["causes"].as_array() {
        texts.extend(causes.iter().flat_map(|c| [&c["message"], &c["field"]]));
    }
    if let Some(warnings) = response["warnings"].as_array() {
        texts.extend(warnings);
    }
    if let Some(long) = texts
        .iter()
        .filter_map(|t| t.as_str())
        .find(|t| t.len() > MAX_ECHO)
    {
        return Err(format!(
            "echo: a message of {} bytes in the answer: {}...",
            long.len(),
            long.chars().take(200).collect::<String>()
        ));
    }
    let Some(patch) = response.get("patch") else {
        return Ok(Checked::Answer);
    };
    if endpoint != Endpoint::Mutate || response["patchType"] != "JSONPatch" {
        return Err(format!(
            "patch without JSONPatch type or on /{}",
            endpoint.as_str()
        ));
    }
    let patch = base64::engine::general_purpose::STANDARD
        .decode(patch.as_str().unwrap_or_default())
        .map_err(|e| format!("patch is not base64: {e}"))?;
    let patch: json_patch::Patch =
        serde_json::from_slice(&patch).map_err(|e| format!("patch is not a JSONPatch: {e}"))?;
    // The object as the webhook reads it: a slice of the body (other parts are skipped, as
    // deep as they are), then as a tree, which serde_json refuses past 128 levels.
    #[derive(serde::Deserialize)]
    struct Envelope<'a> {
        #[serde(borrow)]
        request: Request<'a>,
    }
    #[derive(serde::Deserialize)]
    struct Request<'a> {
        #[serde(borrow)]
        object: &'a serde_json::value::RawValue,
    }
    let object = std::str::from_utf8(body)
        .ok()
        .and_then(|text| serde_json::from_str::<Envelope<'_>>(text).ok())
        .and_then(|e| serde_json::from_str::<Value>(e.request.object.get()).ok());
    let Some(mut object) = object else {
        return Ok(Checked::PatchUnchecked);
    };
    json_patch::patch(&mut object, &patch)
        .map_err(|e| format!("patch does not apply to the object: {e}"))?;
    Ok(Checked::Patch)
}

/// What [`check_answer`] could check.
enum Checked {
    /// The answer, no patch in it.
    Answer,
    /// The answer and its patch, applied to the object.
    Patch,
    /// The answer; its patch not, the object being too deep for a JSON tree.
    PatchUnchecked,
}

//! The reviewer end to end: AdmissionReview bodies in, answers out.

use super::*;
use base64::Engine as _;
use serde_json::{Value, json};

fn review_body(operation: &str, object: Value, old: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": {"group": "etcd.database.coreos.com", "version": "v1beta2", "kind": "EtcdCluster"},
            "resource": {"group": "etcd.database.coreos.com", "version": "v1beta2", "resource": "etcdclusters"},
            "name": "demo",
            "namespace": "default",
            "operation": operation,
            "userInfo": {"username": "admin"},
            "object": object,
            "oldObject": old,
            "dryRun": false
        }
    }))
    .unwrap()
}

/// A malformed object is refused with a message on both endpoints, never answered 500
/// (issue 14, item 4: `spec: []` on /mutate was a 500).
#[test]
fn malformed_specs_are_refused_not_internal_errors() {
    let r = Reviewer::default();
    for spec in [json!([]), json!("x"), json!(3), json!({"size": "three"})] {
        for endpoint in [Endpoint::Validate, Endpoint::Mutate] {
            let body = review_body("CREATE", cluster(spec.clone()), Value::Null);
            let answer = r.review(endpoint, &body).unwrap_or_else(|e| {
                panic!("{spec} on {endpoint:?}: HTTP {}: {e}", e.http_status())
            });
            let response = response(&answer);
            assert_eq!(
                response["allowed"],
                json!(false),
                "{spec} on {endpoint:?}: {response}"
            );
            let message = response["status"]["message"].as_str().unwrap_or_default();
            assert!(
                message.contains("spec"),
                "{spec} on {endpoint:?}: {message}"
            );
        }
    }
}

/// Values of any size in the request are quoted clipped in refusals, warnings and errors,
/// never whole (found by the fuzz run, tests/fuzz.rs: a 100 KB `spec.size` string came
/// back twice in the refusal, a huge `apiVersion` or unknown `operation` whole in the 400).
#[test]
fn large_values_are_never_echoed() {
    let r = Reviewer::default();
    let big = "a".repeat(100_000);
    let short = |text: &str, what: &str| {
        assert!(text.len() < 1024, "{what}: {} bytes", text.len());
        // Cut, with the length of what was cut (a string of the wrong type is quoted from
        // the copy with long strings cut, so that length can be the copy's).
        assert!(text.contains(" bytes)"), "{what}: {text}");
    };
    let texts = |answer: &Answer| -> Vec<String> {
        let resp = response(answer);
        let mut texts = vec![resp["status"]["message"].as_str().unwrap_or("").to_string()];
        for c in resp["status"]["details"]["causes"]
            .as_array()
            .into_iter()
            .flatten()
        {
            texts.push(c["message"].as_str().unwrap_or("").to_string());
            texts.push(c["field"].as_str().unwrap_or("").to_string());
        }
        for w in resp["warnings"].as_array().into_iter().flatten() {
            texts.push(w.as_str().unwrap_or("").to_string());
        }
        texts
    };
    // A value of the wrong type, and a map key in the field path.
    let mut labels = cluster(json!({"size": 3}));
    labels["metadata"]["labels"] = json!({ big.clone(): 1 });
    for object in [cluster(json!({"size": big.clone()})), labels] {
        for endpoint in [Endpoint::Validate, Endpoint::Mutate] {
            let a = r
                .review(
                    endpoint,
                    &review_body("CREATE", object.clone(), Value::Null),
                )
                .expect("answered");
            assert!(a.body.len() < 4096, "{endpoint:?}: {} bytes", a.body.len());
            let texts = texts(&a);
            short(&texts[0], "message");
        }
    }
    // The stored object's decode error, as a warning.
    let a = r
        .review(
            Endpoint::Validate,
            &review_body(
                "UPDATE",
                cluster(json!({"size": 3})),
                cluster(json!({"size": big.clone()})),
            ),
        )
        .expect("answered");
    let warning = texts(&a)
        .into_iter()
        .find(|w| w.starts_with("the stored object could not be read"))
        .expect("the warning");
    short(&warning, "warning");
    // Another kind.
    let mut body: Value =
        serde_json::from_slice(&review_body("CREATE", cluster(json!({})), Value::Null)).unwrap();
    body["request"]["kind"]["kind"] = json!(big.clone());
    let a = r
        .review(Endpoint::Validate, &serde_json::to_vec(&body).unwrap())
        .expect("answered");
    short(&texts(&a)[0], "another kind");
    // Envelope errors: the HTTP layer answers their text.
    let envelope = |path: &str| {
        let mut body: Value =
            serde_json::from_slice(&review_body("CREATE", cluster(json!({})), Value::Null))
                .unwrap();
        *body.pointer_mut(path).unwrap() = json!(big.clone());
        serde_json::to_vec(&body).unwrap()
    };
    for path in [
        "/apiVersion",
        "/kind",
        "/request/operation",
        "/request/dryRun",
    ] {
        let e = r
            .review(Endpoint::Mutate, &envelope(path))
            .expect_err("not a usable review");
        short(&e.to_string(), path);
    }
}

/// What the logs see of a review (its [`Verdict`]) quotes at most a bounded prefix of the
/// request's identifiers, and the answer's `details.name` too (issue 14, item 6: a 3 MiB
/// value made a 3 MiB log line): a caller's huge name or namespace, or a huge label.
#[test]
fn verdicts_and_details_quote_huge_identifiers_clipped() {
    let r = Reviewer::default();
    let big = |c: char| c.to_string().repeat(1 << 20);
    let mut object = cluster(json!({"size": 3, "pod": {"labels": {"team": big('v')}}}));
    object["metadata"]["name"] = json!(big('n'));
    let mut body: Value =
        serde_json::from_slice(&review_body("CREATE", object, Value::Null)).unwrap();
    body["request"]["name"] = json!(big('n'));
    body["request"]["namespace"] = json!(big('s'));
    let body = serde_json::to_vec(&body).unwrap();
    for endpoint in [Endpoint::Validate, Endpoint::Mutate] {
        let a = r.review(endpoint, &body).expect("answered");
        let v = &a.verdict;
        assert!(
            v.name.len() < 300,
            "{endpoint:?} name: {} bytes",
            v.name.len()
        );
        let namespace = v.namespace.as_deref().unwrap_or("");
        assert!(
            namespace.len() < 300,
            "{endpoint:?} namespace: {} bytes",
            namespace.len()
        );
        assert!(
            v.name.ends_with(" bytes)"),
            "{}",
            &v.name[v.name.len() - 30..]
        );
        let logged = v.message.as_deref().unwrap_or("").len()
            + v.warnings.iter().map(String::len).sum::<usize>();
        assert!(
            logged < 8192,
            "{endpoint:?}: {logged} bytes of message and warnings"
        );
        assert!(
            a.body.len() < 8192,
            "{endpoint:?}: an answer of {} bytes",
            a.body.len()
        );
    }
    let refused = r.review(Endpoint::Validate, &body).expect("answered");
    assert!(!refused.verdict.allowed);
    let details_name = response(&refused)["status"]["details"]["name"].clone();
    assert!(
        details_name.as_str().is_some_and(|n| n.len() < 300),
        "{details_name:.100}"
    );
    // A huge uid is echoed (the API server matches answers by it) but not logged whole.
    let mut body: Value = serde_json::from_slice(&body).unwrap();
    body["request"]["uid"] = json!(big('u'));
    let a = r
        .review(Endpoint::Validate, &serde_json::to_vec(&body).unwrap())
        .expect("answered");
    assert!(
        a.verdict.uid.len() < 300,
        "uid: {} bytes",
        a.verdict.uid.len()
    );
    assert_eq!(response(&a)["uid"].as_str().map(str::len), Some(1 << 20));
}

fn cluster(spec: Value) -> Value {
    json!({
        "apiVersion": "etcd.database.coreos.com/v1beta2",
        "kind": "EtcdCluster",
        "metadata": {"name": "demo", "namespace": "default"},
        "spec": spec
    })
}

fn response(answer: &Answer) -> Value {
    let v: Value = serde_json::from_slice(&answer.body).unwrap();
    v["response"].clone()
}

/// A review of an object of `kind` (`resource`) in namespace `prod`.
fn review_of(kind: &str, resource: &str, operation: &str, object: Value, old: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-2",
            "kind": {"group": "etcd.database.coreos.com", "version": "v1beta2", "kind": kind},
            "resource": {"group": "etcd.database.coreos.com", "version": "v1beta2", "resource": resource},
            "name": "x",
            "namespace": "prod",
            "operation": operation,
            "userInfo": {"username": "admin"},
            "object": object,
            "oldObject": old
        }
    }))
    .unwrap()
}

fn backup(spec: Value) -> Value {
    json!({"apiVersion": "etcd.database.coreos.com/v1beta2", "kind": "EtcdBackup",
           "metadata": {"name": "x", "namespace": "prod"}, "spec": spec})
}

fn restore(spec: Value) -> Value {
    json!({"apiVersion": "etcd.database.coreos.com/v1beta2", "kind": "EtcdRestore",
           "metadata": {"name": "x", "namespace": "prod"}, "spec": spec})
}

fn good_backup_spec() -> Value {
    json!({"etcdEndpoints": ["http://demo-client:2379"], "storageType": "S3",
           "s3": {"path": "etcd-backups/demo/snapshot.db", "awsSecret": "aws"}})
}

fn good_restore_spec() -> Value {
    json!({"etcdCluster": {"name": "demo"}, "backupStorageType": "S3",
           "s3": {"path": "etcd-backups/demo/snapshot.db", "awsSecret": "aws"}})
}

/// EtcdBackups and EtcdRestores are judged by their own rules (shared::admission), with
/// the field at fault in the refusal and its cause; nothing is ever patched.
#[test]
fn backups_and_restores_are_judged_by_their_rules() {
    let r = Reviewer::default();
    let judge = |endpoint, body: Vec<u8>| response(&r.review(endpoint, &body).expect("answered"));

    for endpoint in [Endpoint::Validate, Endpoint::Mutate] {
        let ok = judge(
            endpoint,
            review_of(
                "EtcdBackup",
                "etcdbackups",
                "CREATE",
                backup(good_backup_spec()),
                Value::Null,
            ),
        );
        assert_eq!(ok["allowed"], json!(true), "{ok}");
        assert!(ok.get("patch").is_none(), "{ok}");
        let ok = judge(
            endpoint,
            review_of(
                "EtcdRestore",
                "etcdrestores",
                "CREATE",
                restore(good_restore_spec()),
                Value::Null,
            ),
        );
        assert_eq!(ok["allowed"], json!(true), "{ok}");
    }

    // Endpoints of two clusters; an unsupported storage type; a key object_store rewrites.
    let mut spec = good_backup_spec();
    spec["etcdEndpoints"] = json!(["http://a-client:2379", "http://b-client:2379"]);
    let no = judge(
        Endpoint::Validate,
        review_of(
            "EtcdBackup",
            "etcdbackups",
            "CREATE",
            backup(spec),
            Value::Null,
        ),
    );
    assert_eq!(no["allowed"], json!(false), "{no}");
    assert_eq!(no["status"]["code"], json!(422), "{no}");
    assert_eq!(no["status"]["details"]["kind"], json!("EtcdBackup"), "{no}");
    assert!(
        no["status"]["message"]
            .as_str()
            .unwrap()
            .contains("spec.etcdEndpoints"),
        "{no}"
    );

    let mut spec = good_backup_spec();
    spec["storageType"] = json!("OSS");
    let no = judge(
        Endpoint::Validate,
        review_of(
            "EtcdBackup",
            "etcdbackups",
            "CREATE",
            backup(spec),
            Value::Null,
        ),
    );
    assert_eq!(no["allowed"], json!(false), "{no}");
    assert!(
        no["status"]["message"].as_str().unwrap().contains("OSS"),
        "{no}"
    );

    let mut spec = good_restore_spec();
    spec["s3"]["path"] = json!("bucket//snapshot.db");
    let no = judge(
        Endpoint::Validate,
        review_of(
            "EtcdRestore",
            "etcdrestores",
            "CREATE",
            restore(spec),
            Value::Null,
        ),
    );
    assert_eq!(no["allowed"], json!(false), "{no}");
    assert!(
        no["status"]["message"]
            .as_str()
            .unwrap()
            .contains("spec.s3.path"),
        "{no}"
    );

    // A restore's spec is immutable; its labels are not.
    let mut moved = good_restore_spec();
    moved["etcdCluster"]["name"] = json!("other");
    let no = judge(
        Endpoint::Validate,
        review_of(
            "EtcdRestore",
            "etcdrestores",
            "UPDATE",
            restore(moved),
            restore(good_restore_spec()),
        ),
    );
    assert_eq!(no["allowed"], json!(false), "{no}");
    let mut labelled = restore(good_restore_spec());
    labelled["metadata"]["labels"] = json!({"team": "db"});
    let ok = judge(
        Endpoint::Validate,
        review_of(
            "EtcdRestore",
            "etcdrestores",
            "UPDATE",
            labelled,
            restore(good_restore_spec()),
        ),
    );
    assert_eq!(ok["allowed"], json!(true), "{ok}");

    // A spec of the wrong shape is a 422 naming the field, never an HTTP error.
    for (kind, resource, object) in [
        (
            "EtcdBackup",
            "etcdbackups",
            backup(json!({"etcdEndpoints": "http://demo-client:2379"})),
        ),
        ("EtcdRestore", "etcdrestores", restore(json!([]))),
    ] {
        for endpoint in [Endpoint::Validate, Endpoint::Mutate] {
            let no = judge(
                endpoint,
                review_of(kind, resource, "CREATE", object.clone(), Value::Null),
            );
            assert_eq!(no["allowed"], json!(false), "{kind}: {no}");
            assert_eq!(no["status"]["code"], json!(422), "{kind}: {no}");
            assert!(
                no["status"]["message"]
                    .as_str()
                    .unwrap()
                    .contains(&format!("not a valid {kind}")),
                "{no}"
            );
        }
    }

    // Another kind of the group is refused as a bad request.
    let no = judge(
        Endpoint::Validate,
        review_of(
            "EtcdThing",
            "etcdthings",
            "CREATE",
            backup(good_backup_spec()),
            Value::Null,
        ),
    );
    assert_eq!(no["status"]["code"], json!(400), "{no}");
    assert!(
        no["status"]["message"]
            .as_str()
            .unwrap()
            .contains("EtcdBackup"),
        "{no}"
    );
}

#[test]
fn decode_tolerates_a_missing_spec() {
    let mut c = cluster(json!(null));
    c.as_object_mut().unwrap().remove("spec");
    let decode = |v: &Value| decode::decode(&serde_json::value::to_raw_value(v).unwrap());
    assert_eq!(decode(&c).unwrap().spec, Default::default());
    assert_eq!(
        decode(&cluster(json!(null))).unwrap().spec,
        Default::default()
    );
    let e = decode(&cluster(json!({"size": "three"}))).unwrap_err();
    assert_eq!(e.field(), "spec.size");
}

#[test]
fn mutate_patches_only_what_is_missing() {
    let r = Reviewer::default();
    let a = r
        .review(
            Endpoint::Mutate,
            &review_body(
                "CREATE",
                cluster(json!({"size": 5, "x-unknown": 1})),
                Value::Null,
            ),
        )
        .unwrap();
    let resp = response(&a);
    assert_eq!(resp["allowed"], true);
    assert_eq!(resp["uid"], "u-1");
    assert_eq!(resp["patchType"], "JSONPatch");
    let patch = base64::engine::general_purpose::STANDARD
        .decode(resp["patch"].as_str().unwrap())
        .unwrap();
    let patch: Value = serde_json::from_slice(&patch).unwrap();
    assert_eq!(
        patch,
        json!([
            {"op": "add", "path": "/spec/repository", "value": "quay.io/coreos/etcd"},
            {"op": "add", "path": "/spec/version", "value": "3.6.16"}
        ])
    );
    assert_eq!(a.verdict.patch_operations, 2);
}

#[test]
fn validate_refuses_with_field_and_rule() {
    let r = Reviewer::default();
    let a = r
        .review(
            Endpoint::Validate,
            &review_body("CREATE", cluster(json!({"size": 0})), Value::Null),
        )
        .unwrap();
    let resp = response(&a);
    assert_eq!(resp["allowed"], false);
    assert_eq!(resp["status"]["code"], 422);
    assert_eq!(resp["status"]["reason"], "Invalid");
    assert_eq!(
        resp["status"]["message"],
        "spec.size: must be between 1 and 7, got 0"
    );
    assert_eq!(resp["status"]["details"]["causes"][0]["field"], "spec.size");
    assert_eq!(a.verdict.rules, vec!["size-range"]);
}

/// A request that is a long string is refused by its type without quoting it (the
/// 1,000,000-input fuzz run: 233,000 U+202E characters took 85-140 ms to quote).
#[test]
fn a_request_that_is_no_object_is_refused_by_its_type() {
    let r = Reviewer::default();
    let long = "\u{202e}".repeat(233_000);
    for (request, kind) in [
        (json!(long), "a string"),
        (json!([1, 2]), "sequence"),
        (json!(7), "a number"),
        (json!(true), "boolean `true`"),
    ] {
        let body = serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": request,
        }))
        .unwrap();
        let started = std::time::Instant::now();
        let got = r.review(Endpoint::Mutate, &body);
        let took = started.elapsed();
        match got {
            Err(ReviewError::NotAdmissionReview(m)) => assert_eq!(
                m,
                format!("request: invalid type: {kind}, expected an AdmissionRequest object")
            ),
            other => panic!("{kind}: {other:?}"),
        }
        // Quoting took 85-140 ms in a release build, seconds in a debug one.
        assert!(
            took < std::time::Duration::from_millis(500),
            "{kind}: {took:?}"
        );
    }
}

#[test]
fn bad_envelopes_are_errors() {
    let r = Reviewer::default();
    assert!(matches!(
        r.review(Endpoint::Validate, b"{"),
        Err(ReviewError::NotJson(_))
    ));
    assert!(matches!(
        r.review(
            Endpoint::Validate,
            b"{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\"}"
        ),
        Err(ReviewError::MissingRequest)
    ));
    assert!(matches!(
        r.review(Endpoint::Validate, b"[]"),
        Err(ReviewError::NotAdmissionReview(_))
    ));
    let mut v1beta1: Value =
        serde_json::from_slice(&review_body("CREATE", cluster(json!({})), Value::Null)).unwrap();
    v1beta1["apiVersion"] = json!("admission.k8s.io/v1beta1");
    assert!(matches!(
        r.review(Endpoint::Validate, &serde_json::to_vec(&v1beta1).unwrap()),
        Err(ReviewError::UnsupportedVersion { .. })
    ));
    assert!(matches!(
        r.review(
            Endpoint::Validate,
            &review_body("CREATE", Value::Null, Value::Null)
        ),
        Err(ReviewError::MissingObject { .. })
    ));
}

/// A CoreOS-client object: its Go structs always write `status`, and `resources: {}` and
/// `ClusterDomain: ""` whenever `pod` is set.
fn coreos(spec: Value, status: Value) -> Value {
    let mut c = cluster(spec);
    c["metadata"]["creationTimestamp"] = Value::Null;
    c["status"] = status;
    c
}

fn allowed(r: &Reviewer, endpoint: Endpoint, op: &str, object: Value, old: Value) -> Value {
    let a = r
        .review(endpoint, &review_body(op, object, old))
        .expect("answered");
    let resp = response(&a);
    assert_eq!(resp["allowed"], true, "{resp}");
    resp
}

#[test]
fn coreos_statuses_are_never_judged() {
    let r = Reviewer::default();
    let spec = json!({"size": 3, "version": "3.6.16", "pod": {"resources": {}, "ClusterDomain": "", "persistentVolumeClaimSpec": {"resources": {"requests": {"storage": "1Gi"}}}}});
    for status in [
        json!({"phase": "", "size": 0, "members": {}, "currentVersion": "", "targetVersion": ""}),
        json!({"phase": "Failed", "reason": "boom", "conditions": [{"type": "Recovering", "status": "True", "lastUpdateTime": "2018-03-01T10:00:00Z", "reason": "Disaster recovery"}], "size": 0, "members": {}, "currentVersion": "", "targetVersion": ""}),
        json!({"phase": 1, "conditions": "garbage"}),
    ] {
        let object = coreos(spec.clone(), status.clone());
        let resp = allowed(
            &r,
            Endpoint::Validate,
            "CREATE",
            object.clone(),
            Value::Null,
        );
        assert!(resp.get("warnings").is_none(), "{status}: {resp}");
        let resp = allowed(&r, Endpoint::Mutate, "CREATE", object.clone(), Value::Null);
        let patch = base64::engine::general_purpose::STANDARD
            .decode(resp["patch"].as_str().expect("a patch"))
            .expect("base64");
        let patch: Value = serde_json::from_slice(&patch).expect("JSON");
        assert_eq!(
            patch,
            json!([{"op": "add", "path": "/spec/repository", "value": "quay.io/coreos/etcd"}]),
            "only the missing repository, nothing in status: {status}"
        );
        // An update as CoreOS' client makes it: the whole object, status included, on both
        // sides.
        let mut paused = object.clone();
        paused["spec"]["paused"] = json!(true);
        let resp = allowed(
            &r,
            Endpoint::Validate,
            "UPDATE",
            paused.clone(),
            object.clone(),
        );
        assert!(resp.get("warnings").is_none(), "{status}: {resp}");
        allowed(&r, Endpoint::Mutate, "UPDATE", paused, object);
    }
}

#[test]
fn a_stored_status_of_any_shape_leaves_the_update_rules_on() {
    let r = Reviewer::default();
    let at = |v: &str, status: Value| coreos(json!({"size": 3, "version": v}), status);
    for status in [
        json!({"phase": "", "currentVersion": ""}),
        json!({"phase": 1, "currentVersion": ["3.5.35"], "conditions": "garbage"}),
        json!("garbage"),
    ] {
        let a = r
            .review(
                Endpoint::Validate,
                &review_body(
                    "UPDATE",
                    at("3.7.3", json!({})),
                    at("3.5.35", status.clone()),
                ),
            )
            .expect("answered");
        let resp = response(&a);
        assert_eq!(resp["allowed"], false, "{status}: {resp}");
        assert_eq!(a.verdict.rules, vec!["version-skip"], "{status}");
    }
    // A readable currentVersion still guards an upgrade in progress.
    let mid = at(
        "3.6.16",
        json!({"phase": "Running", "reason": "", "currentVersion": "3.5.35", "targetVersion": ""}),
    );
    let a = r
        .review(
            Endpoint::Validate,
            &review_body("UPDATE", at("3.7.3", json!({})), mid),
        )
        .expect("answered");
    assert_eq!(a.verdict.rules, vec!["version-upgrade-in-progress"]);
}

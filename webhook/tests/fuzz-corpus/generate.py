#!/usr/bin/env python3
"""Writes the fuzz seed corpus: real AdmissionReview bodies, as the API server sends them, built
from the repository's own examples (shared/examples/example-etcd-cluster.yaml), the CoreOS Go
client bodies of webhook/tests/coreos_clients.rs and the rule cases of webhook/tests/server.rs.

Run from anywhere: python3 webhook/tests/fuzz-corpus/generate.py (rewrites every *.json here
except the regression-*.json seeds: inputs the fuzz run found failing, kept as found, shrunk by
hand; regression-echo-*: a value of 4,500 bytes that came back whole in a message or error).
"""
import copy
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
KIND = {"group": "etcd.database.coreos.com", "version": "v1beta2", "kind": "EtcdCluster"}
RESOURCE = {"group": "etcd.database.coreos.com", "version": "v1beta2", "resource": "etcdclusters"}
# Go's encoding of CoreOS' ClusterStatus{} and of a failed and a running cluster.
EMPTY_STATUS = {"phase": "", "size": 0, "members": {}, "currentVersion": "", "targetVersion": ""}
FAILED_STATUS = json.loads(r'''{"phase":"Failed","reason":"Fail to create seed member: timed out","controlPaused":true,"conditions":[{"type":"Available","status":"False","lastUpdateTime":"2018-03-01T10:00:00Z","lastTransitionTime":"2018-03-01T09:00:00Z","reason":"Cluster unavailable"},{"type":"Recovering","status":"True","lastUpdateTime":"2018-03-01T10:00:00Z","reason":"Disaster recovery","message":"Majority is down. Recovering from backup"}],"size":1,"serviceName":"failed-client","clientPort":2379,"members":{"unready":["failed-0000"]},"currentVersion":"3.2.13","targetVersion":""}''')
RUNNING_STATUS = json.loads(r'''{"phase":"Running","conditions":[{"type":"Available","status":"True","lastUpdateTime":"2018-03-01T10:00:00Z","lastTransitionTime":"2018-03-01T10:00:00Z","reason":"Cluster available"}],"size":3,"serviceName":"updated-client","clientPort":2379,"members":{"ready":["updated-0000","updated-0001","updated-0002"]},"currentVersion":"3.5.35","targetVersion":""}''')
OWN_STATUS = {"phase": "Running", "conditions": [{"type": "Available", "status": "True", "reason": "QuorumHealthy", "message": "3 of 3 voting members are healthy", "observedGeneration": 4, "lastTransitionTime": "2026-01-01T00:00:00Z"}], "observedGeneration": 4, "size": 3, "readyMembers": 3, "currentVersion": "3.5.35", "members": {"ready": ["demo-0", "demo-1", "demo-2"]}}
EVERY_FIELD_SPEC = {
    "size": 3, "repository": "quay.io/coreos/etcd", "version": "3.5.35", "paused": False,
    "pod": {
        "labels": {"team": "storage"}, "nodeSelector": {"disktype": "ssd"},
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "disktype", "operator": "In", "values": ["ssd"]}]}]}}},
        "antiAffinity": True,
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "etcd", "effect": "NoSchedule"}],
        "etcdEnv": [{"name": "ETCD_QUOTA_BACKEND_BYTES", "value": "4294967296"}],
        "persistentVolumeClaimSpec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "standard", "resources": {"requests": {"storage": "1Gi"}}},
        "annotations": {"example.com/owner": "storage-team"},
        "busyboxImage": "busybox:1.28.0-glibc",
        "securityContext": {"runAsUser": 1000, "runAsNonRoot": True, "fsGroup": 1000},
        "DNSTimeoutInSecond": 10, "ClusterDomain": ".cluster.local",
    },
    "TLS": {"static": {"member": {"peerSecret": "etcd-peer-tls", "serverSecret": "etcd-server-tls"}, "operatorSecret": "etcd-client-tls"}},
}


def cluster(name, spec, status=None, meta=None):
    """An EtcdCluster as kube-apiserver hands it to a webhook (support::cluster)."""
    obj = {
        "apiVersion": "etcd.database.coreos.com/v1beta2",
        "kind": "EtcdCluster",
        "metadata": meta or {
            "name": name, "namespace": "default",
            "uid": "5f1b5d1e-0000-4000-8000-000000000001",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "annotations": {"example.com/note": "kept as is"},
            "managedFields": [{"manager": "kubectl", "operation": "Update", "apiVersion": "etcd.database.coreos.com/v1beta2", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}],
        },
    }
    if spec is not None:
        obj["spec"] = spec
    if status is not None:
        obj["status"] = status
    return obj


def coreos(name, spec, status):
    """A whole EtcdCluster as CoreOS' Go client encodes it: kind first, status always there."""
    return {"kind": "EtcdCluster", "apiVersion": "etcd.database.coreos.com/v1beta2",
            "metadata": {"name": name, "namespace": "default", "creationTimestamp": None},
            "spec": spec, "status": status}


def review(uid, operation, obj, old=None, dry_run=False):
    """support::review: an admission.k8s.io/v1 AdmissionReview."""
    name = (obj or old or {}).get("metadata", {}).get("name", "")
    return {
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": uid, "kind": KIND, "resource": RESOURCE, "requestKind": KIND, "requestResource": RESOURCE,
            "name": name, "namespace": "default", "operation": operation,
            "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters", "system:authenticated"]},
            "object": obj, "oldObject": old, "dryRun": dry_run,
            "options": {"kind": {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions"}.get(operation, "DeleteOptions"), "apiVersion": "meta.k8s.io/v1"},
        },
    }


def quiet(extra):
    spec = {"pod": {"persistentVolumeClaimSpec": {"resources": {"requests": {"storage": "1Gi"}}}}}
    merge(spec, extra)
    return spec


def merge(into, src):
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            merge(into[k], v)
        else:
            into[k] = v


def v(version):
    return quiet({"version": version})


def claim(cls, size):
    return {"pod": {"persistentVolumeClaimSpec": {"storageClassName": cls, "resources": {"requests": {"storage": size}}}}}


seeds = {}


def seed(name, body):
    seeds[name] = body


# shared/examples/example-etcd-cluster.yaml
example = {"apiVersion": "etcd.database.coreos.com/v1beta2", "kind": "EtcdCluster",
           "metadata": {"name": "example-etcd-cluster"}, "spec": {"size": 3, "version": "3.2.13"}}
seed("example-create", review("ex-1", "CREATE", example))
seed("example-update-resize", review("ex-2", "UPDATE", dict(example, spec={"size": 5, "version": "3.2.13"}), example))

# webhook/tests/server.rs, rule_cases: (name, spec) for CREATE, (name, old, new) for UPDATE.
creates = [
    ("size-3", quiet({"size": 3})), ("size-0", quiet({"size": 0})), ("size-8", quiet({"size": 8})),
    ("version-v-prefix", v("v3.6.16")), ("version-latest", v("latest")), ("version-3.8.0", v("3.8.0")),
    ("version-3.2-eol", v("3.2.13")),
    ("env-tuning", quiet({"pod": {"etcdEnv": [{"name": "ETCD_QUOTA_BACKEND_BYTES", "value": "4294967296"}]}})),
    ("env-reserved", quiet({"pod": {"etcdEnv": [{"name": "ETCD_NAME", "value": "x"}, {"name": "ETCD_ENABLE_V2", "value": "true"}, {"name": "SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}})),
    ("resources", quiet({"pod": {"resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}}})),
    ("resources-bad", quiet({"pod": {"resources": {"requests": {"cpu": "2", "memory": "lots"}, "limits": {"cpu": "1500m", "memory": "0e999"}}}})),
    ("labels", quiet({"pod": {"labels": {"team": "storage", "app": "x", "bad": "not ok"}}})),
    ("tls-complete", quiet({"TLS": {"static": {"member": {"peerSecret": "peer", "serverSecret": "server"}, "operatorSecret": "op"}}})),
    ("tls-incomplete", quiet({"TLS": {"static": {"member": {"serverSecret": "server", "peerSecret": "Bad_Name"}}}})),
    ("repository-tag", quiet({"repository": "quay.io/coreos/etcd:v3.5.0"})),
    ("ephemeral", {"size": 3}),
    ("every-violation", {"size": 9, "version": "latest", "repository": "etcd:v3"}),
    ("mutate-unknown-fields", {"size": 5, "x-future": {"nested": [1, 2]}, "paused": False}),
    ("mutate-empty-repository", {"size": 1, "version": "3.5.35", "repository": ""}),
]
for name, spec in creates:
    seed(f"rule-create-{name}", review(name, "CREATE", cluster("demo", spec)))
seed("rule-create-name-57", review("long", "CREATE", cluster("a" * 57, quiet({}))))
seed("rule-create-name-syntax", review("1etcd", "CREATE", cluster("1etcd", quiet({}))))
seed("mutate-no-spec", review("nospec", "CREATE", cluster("demo", None)))
spec_null = cluster("demo", None)
spec_null["spec"] = None
seed("mutate-spec-null", review("specnull", "CREATE", spec_null))
# Issue 14, item 4: `spec: []` on /mutate was a 500.
seed("mutate-spec-array", review("specarray", "CREATE", cluster("demo", [])))
seed("create-dry-run", review("dry", "CREATE", cluster("demo", {"size": 0}), dry_run=True))

updates = [
    ("upgrade", v("3.5.35"), v("3.6.16")), ("patch-downgrade", v("3.6.16"), v("3.6.12")),
    ("version-skip", v("3.5.35"), v("3.7.3")), ("minor-downgrade", v("3.6.16"), v("3.5.35")),
    ("prerequisite", v("3.5.20"), v("3.6.16")), ("major", v("3.6.16"), v("4.0.0")),
    ("claim-grows", claim("fast", "1Gi"), claim("fast", "2Gi")),
    ("storage-class", claim("fast", "1Gi"), claim("slow", "1Gi")),
    ("claim-shrinks", claim("fast", "1Gi"), claim("fast", "512Mi")),
    ("emptydir-to-claim", {"size": 3}, claim("fast", "1Gi")),
    ("medium", {"size": 3}, {"pod": {"storageMedium": "Memory"}}),
    ("peer-tls-on", quiet({}), quiet({"TLS": {"static": {"member": {"peerSecret": "peer"}}}})),
    ("peer-secret-rotated", quiet({"TLS": {"static": {"member": {"peerSecret": "peer"}}}}), quiet({"TLS": {"static": {"member": {"peerSecret": "peer-2"}}}})),
    ("cluster-domain", quiet({}), quiet({"pod": {"ClusterDomain": "corp.local"}})),
    ("mutate-dropped-fields", {"size": 5, "version": "3.5.35", "repository": "gcr.io/etcd-development/etcd"}, {"paused": True}),
    ("stored-unreadable", {"size": "three"}, quiet({})),
]
for name, old, new in updates:
    seed(f"rule-update-{name}", review(name, "UPDATE", cluster("demo", new), cluster("demo", old)))
in_progress_old = cluster("demo", v("3.6.16"), status={"currentVersion": "3.5.35"})
seed("rule-update-upgrade-in-progress", review("inprog", "UPDATE", cluster("demo", v("3.7.3")), in_progress_old))
seed("update-own-status", review("own", "UPDATE", cluster("demo", quiet({"size": 3, "version": "3.6.16"}), status=OWN_STATUS), cluster("demo", quiet({"size": 3, "version": "3.5.35"}), status=OWN_STATUS)))

# Other requests: another kind, DELETE and CONNECT.
pod = review("pod", "CREATE", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}})
pod["request"]["kind"] = {"group": "", "version": "v1", "kind": "Pod"}
seed("other-kind-pod", pod)
seed("delete", review("del", "DELETE", None, cluster("demo", {"size": 0})))
seed("connect", review("con", "CONNECT", None, cluster("demo", {"size": 3})))

# webhook/tests/coreos_clients.rs: CoreOS' Go client bodies, byte for byte in field order.
seed("coreos-minimal", review("c1", "CREATE", coreos("minimal", {"size": 3, "version": "3.2.13"}, EMPTY_STATUS)))
seed("coreos-pod", review("c2", "CREATE", coreos("pod", json.loads(r'{"size":3,"version":"3.5.35","pod":{"labels":{"team":"storage"},"antiAffinity":true,"resources":{},"busyboxImage":"busybox:1.28.0-glibc","DNSTimeoutInSecond":10,"ClusterDomain":""}}'), EMPTY_STATUS)))
seed("coreos-tls", review("c3", "CREATE", coreos("tls", json.loads(r'{"size":3,"version":"3.5.35","TLS":{"static":{"member":{"peerSecret":"etcd-peer-tls","serverSecret":"etcd-server-tls"},"operatorSecret":"etcd-client-tls"}}}'), EMPTY_STATUS)))
seed("coreos-failed-status", review("c4", "CREATE", coreos("failed", {"size": 3, "version": "3.5.35"}, FAILED_STATUS)))
seed("coreos-size-0", review("c5", "CREATE", coreos("no-size", {"size": 0, "version": "3.5.35"}, EMPTY_STATUS)))
old_meta = {"name": "updated", "namespace": "default", "uid": "0b5c3e0e-1111-4222-8333-444455556666", "resourceVersion": "4711", "generation": 1, "creationTimestamp": "2026-01-01T00:00:00Z"}
stored = coreos("updated", {"size": 3, "version": "3.5.35"}, RUNNING_STATUS)
stored["metadata"] = old_meta
for name, spec in [
    ("resize", json.loads(r'{"size":5,"repository":"quay.io/coreos/etcd","version":"3.5.35","pod":{"resources":{},"ClusterDomain":""}}')),
    ("upgrade-dot-domain", json.loads(r'{"size":5,"repository":"quay.io/coreos/etcd","version":"3.6.16","pod":{"resources":{},"ClusterDomain":".cluster.local"}}')),
    ("other-domain", json.loads(r'{"size":5,"repository":"quay.io/coreos/etcd","version":"3.6.16","pod":{"resources":{},"ClusterDomain":"corp.example"}}')),
]:
    new = copy.deepcopy(stored)
    new["spec"] = spec
    seed(f"coreos-update-{name}", review(name, "UPDATE", new, stored))
seed("coreos-every-field", review("every", "CREATE", coreos("every-field", EVERY_FIELD_SPEC, EMPTY_STATUS)))
seed("coreos-every-field-update", review("every-u", "UPDATE", coreos("every-field", dict(EVERY_FIELD_SPEC, size=5), RUNNING_STATUS), coreos("every-field", EVERY_FIELD_SPEC, RUNNING_STATUS)))

# A few large ones: many env entries, long managedFields, a big annotation.
big_env = quiet({"size": 3, "pod": {"etcdEnv": [{"name": f"TUNING_{i}", "value": "x" * 16} for i in range(400)]}})
seed("large-env", review("big-env", "CREATE", cluster("demo", big_env)))
big_meta = cluster("demo", quiet({"size": 3, "version": "3.6.16"}))
big_meta["metadata"]["managedFields"] = [
    {"manager": f"controller-{i}", "operation": "Apply", "apiVersion": "etcd.database.coreos.com/v1beta2", "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {f"f:l{i}": {}}}, "f:spec": {"f:size": {}, "f:version": {}}}}
    for i in range(60)
]
big_meta["metadata"]["labels"] = {f"example.com/l{i}": f"v{i}" for i in range(60)}
seed("large-managed-fields", review("big-meta", "UPDATE", big_meta, cluster("demo", quiet({"size": 3, "version": "3.6.16"}))))
big_ann = cluster("demo", quiet({"size": 3, "pod": {"annotations": {"example.com/blob": "b" * 8000}}}))
seed("large-annotation", review("big-ann", "CREATE", big_ann))

# EtcdBackup and EtcdRestore (validated, never defaulted), and a cluster's safetyBackup.
S3 = {"path": "etcd-backups/demo/snapshot.db", "awsSecret": "aws", "endpoint": "http://minio.minio.svc:9000", "forcePathStyle": True}


def of_kind(body, kind, resource):
    k = {"group": "etcd.database.coreos.com", "version": "v1beta2", "kind": kind}
    r = {"group": "etcd.database.coreos.com", "version": "v1beta2", "resource": resource}
    body["request"].update({"kind": k, "requestKind": k, "resource": r, "requestResource": r})
    return body


def backup(name, spec):
    return {"apiVersion": "etcd.database.coreos.com/v1beta2", "kind": "EtcdBackup", "metadata": {"name": name, "namespace": "default"}, "spec": spec}


def restore(name, spec):
    return {"apiVersion": "etcd.database.coreos.com/v1beta2", "kind": "EtcdRestore", "metadata": {"name": name, "namespace": "default"}, "spec": spec}


good_backup = {"etcdEndpoints": ["http://demo-client:2379"], "storageType": "S3", "backupPolicy": {"backupIntervalInSecond": 3600, "maxBackups": 24, "timeoutInSecond": 60}, "s3": S3, "clientTLSSecret": "etcd-client-tls"}
seed("backup-create", of_kind(review("bk-1", "CREATE", backup("bk", good_backup)), "EtcdBackup", "etcdbackups"))
seed("backup-create-bad", of_kind(review("bk-2", "CREATE", backup("bk", {"etcdEndpoints": ["https://a-0.a.other.svc:2379", "http://b-client:2379"], "storageType": "GCS", "gcs": {"path": "b//k", "gcpSecret": "Bad_Name"}, "s3": dict(S3, path="x/../k"), "backupPolicy": {"backupIntervalInSecond": -1, "maxBackups": -2}})), "EtcdBackup", "etcdbackups"))
good_restore = {"etcdCluster": {"name": "demo"}, "backupStorageType": "S3", "s3": S3}
seed("restore-create", of_kind(review("rs-1", "CREATE", restore("demo", good_restore)), "EtcdRestore", "etcdrestores"))
seed("restore-update-spec", of_kind(review("rs-2", "UPDATE", restore("demo", dict(good_restore, etcdCluster={"name": "other"})), restore("demo", good_restore)), "EtcdRestore", "etcdrestores"))
seed("rule-create-safety-backup", review("safety", "CREATE", cluster("demo", quiet({"size": 3, "version": "3.6.16", "safetyBackup": {"storageType": "S3", "s3": S3}}))))

for old in os.listdir(HERE):
    if old.endswith(".json") and not old.startswith("regression-"):
        os.remove(os.path.join(HERE, old))
for name, body in seeds.items():
    with open(os.path.join(HERE, f"{name}.json"), "w") as f:
        json.dump(body, f, separators=(",", ":"), ensure_ascii=False)
        f.write("\n")
print(f"{len(seeds)} seeds, {sum(os.path.getsize(os.path.join(HERE, n + '.json')) for n in seeds)} bytes")

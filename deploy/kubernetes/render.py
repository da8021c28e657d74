"""Render the Kubernetes manifests for the sidecar pattern from a policy directory and an invariants directory.

    python deploy/kubernetes/render.py [POLICIES_DIR [INVARIANTS_DIR]] > deploy/kubernetes/memwarden.yaml

One pod runs Chroma bound to 127.0.0.1 (reachable only from inside the pod) and memwarden in
front of it on :8080. Policies come from a ConfigMap (every file under POLICIES_DIR, sub-directories
``invariants/`` and ``tests/`` included: ConfigMap keys cannot hold ``/``, so each file is a key
with ``/`` written as ``__`` and the volume's ``items`` map it back). The organisation's pinned
invariants (INVARIANTS_DIR, default ``deploy/kubernetes/invariants``) come from a second ConfigMap,
``memwarden-invariants``, mounted apart at ``/etc/memwarden/invariants`` (``MEMWARDEN_INVARIANTS_DIR``):
whoever may edit the policy ConfigMap cannot edit what bounds it (grant the two ConfigMaps to different
owners). memwarden always checks the baseline invariants of its package too; a policy set that fails
any of them is never served, at start-up or on reload. The PostgreSQL ledger URL
(with its password) and the optional backend credential come from a Secret (API keys themselves live,
hashed, in the ledger: create them with ``memwarden keys create`` against the same ledger URL). An init container applies ledger migrations; the main
container then refuses to start on an old schema.

The Service carries the API port only. The metrics/operator port (9464: Prometheus text, and readiness with
its details — policy paths, reload errors — at ``/_memwarden/readyz``) is reachable only through the pod, and
a NetworkPolicy admits it from Prometheus alone: pods labelled ``MONITORING_POD_LABELS`` in the namespace
labelled ``MONITORING_NAMESPACE_LABELS`` (``kubernetes.io/metadata.name: monitoring``, set by Kubernetes on
every namespace; ``app.kubernetes.io/name: prometheus``, the label of the Prometheus Operator's and the
prometheus Helm chart's server pods). Change both to your Prometheus's. The API port stays open to every
client (restrict it with a policy of your own).

TLS: the API port serves HTTPS with the certificate and key of the Secret ``TLS_SECRET`` (type
``kubernetes.io/tls``: ``tls.crt``, ``tls.key``), mounted read-only at ``/etc/memwarden/tls`` and named by
``MEMWARDEN_TLS_CERT``/``MEMWARDEN_TLS_KEY``. It is not rendered here (a private key does not belong in a
manifest): create it before the pod can start, with cert-manager (a ``Certificate`` whose ``secretName`` is
``memwarden-tls``) or ``kubectl create secret tls memwarden-tls --cert=server.crt --key=server.key``. A renewed
certificate is picked up without a restart (``MEMWARDEN_TLS_RELOAD_INTERVAL_S``: the Secret volume's update swaps
the files). The probes use HTTPS (the kubelet does not verify the certificate). For mutual TLS add
``MEMWARDEN_TLS_CLIENT_CA`` (e.g. the Secret's ``ca.crt``) and see README "TLS and identity" (the probes then need
``MEMWARDEN_TLS_CLIENT_AUTH=optional``).

Identity and the decision log's collector come from an optional ConfigMap, ``CONFIG``: each key below, when
present, sets its variable, and a missing key (or a missing ConfigMap) leaves the setting off — bearer JWTs off,
no shipping — so the manifest applies as it is:

    kubectl create configmap memwarden-config \
      --from-literal=jwt-issuer=https://issuer.example.com/ --from-literal=jwt-audience=memwarden \
      --from-literal=jwt-jwks-url=https://issuer.example.com/.well-known/jwks.json \
      --from-literal=jwt-claims='{"tenant": "org", "fleet": "team", "agent": "sub"}' \
      --from-literal=decision-log-url=https://collector.example.com/v1/decisions

(``CONFIG_KEYS``: key -> variable.) Every shipped decision event names its pod (``MEMWARDEN_DECISION_LOG_INSTANCE``
from the pod's name); at shutdown the buffered events get ``DECISION_LOG_SHUTDOWN_S`` seconds to reach the collector.

Stopping: ``preStop`` sleeps ``PRESTOP_SLEEP_S`` (endpoint removal reaches kube-proxy and ingress controllers
meanwhile; the ``sleep`` action, Kubernetes >= 1.30), then SIGTERM: memwarden answers readyz 503 and keeps
serving for ``MEMWARDEN_SHUTDOWN_DRAIN_S``, then stops listening and gives requests in flight up to
``MEMWARDEN_SHUTDOWN_TIMEOUT_S`` (sidecar/drain.py), then sends the buffered decision events for up to
``MEMWARDEN_DECISION_LOG_SHUTDOWN_S``; ``terminationGracePeriodSeconds`` covers the four. Needs
PyYAML.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

NAME = "memwarden"
IMAGE = "memwarden:0.1.0"
CHROMA_IMAGE = "chromadb/chroma:1.5.9"
LABELS = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/component": "memory"}
# Who may reach the metrics/operator port (the NetworkPolicy): the Prometheus server pods of the monitoring namespace.
MONITORING_NAMESPACE_LABELS = {"kubernetes.io/metadata.name": "monitoring"}
MONITORING_POD_LABELS = {"app.kubernetes.io/name": "prometheus"}
PRESTOP_SLEEP_S = 5
SHUTDOWN_DRAIN_S = 5
SHUTDOWN_TIMEOUT_S = 30
DECISION_LOG_SHUTDOWN_S = 5
TLS_SECRET = f"{NAME}-tls"  # kubernetes.io/tls, created apart (cert-manager or kubectl): never rendered
TLS_DIR = "/etc/memwarden/tls"
CONFIG = f"{NAME}-config"  # optional ConfigMap: identity (JWT/OIDC) and the decision-log collector
# Key of the optional ConfigMap -> the setting it sets (absent: the setting's default, i.e. off).
CONFIG_KEYS = {
    "jwt-issuer": "MEMWARDEN_JWT_ISSUER",
    "jwt-audience": "MEMWARDEN_JWT_AUDIENCE",
    "jwt-jwks-url": "MEMWARDEN_JWT_JWKS_URL",
    "jwt-claims": "MEMWARDEN_JWT_CLAIMS",
    "jwt-algorithms": "MEMWARDEN_JWT_ALGORITHMS",
    "decision-log-url": "MEMWARDEN_DECISION_LOG_URL",
    "decision-log-format": "MEMWARDEN_DECISION_LOG_FORMAT",
}


def policy_files(root: Path) -> dict[str, str]:
    """ConfigMap key -> relative path, for every regular file under `root` (hidden files skipped)."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if p.is_file() and not any(part.startswith(".") for part in rel.parts):
            out[str(rel).replace("/", "__")] = str(rel)
    return out


def manifests(root: Path, invariants: Path) -> list[dict[str, Any]]:
    files = policy_files(root)
    pinned = {p.name: p.name for p in sorted(invariants.glob("*.cedar"))}

    def probe(path: str, period: int) -> dict[str, Any]:
        return {"httpGet": {"path": path, "port": "http", "scheme": "HTTPS"}, "periodSeconds": period, "timeoutSeconds": 3,
                "failureThreshold": 3}

    memwarden_env: list[dict[str, Any]] = [
        {"name": "MEMWARDEN_BACKEND", "value": "chroma"},
        {"name": "MEMWARDEN_BACKEND_URL", "value": "http://127.0.0.1:8000"},
        {"name": "MEMWARDEN_POLICIES_DIR", "value": "/etc/memwarden/policies"},
        # Pinned invariants from their own ConfigMap: added to the baseline, never replaceable by the policies.
        {"name": "MEMWARDEN_INVARIANTS_DIR", "value": "/etc/memwarden/invariants"},
        {"name": "MEMWARDEN_LEDGER_URL", "valueFrom": {"secretKeyRef": {"name": NAME, "key": "ledger-url"}}},
        {"name": "MEMWARDEN_LEDGER_MIGRATE_ON_START", "value": "false"},
        # The credential memwarden sends to the backend, for backends that require one (optional).
        {"name": "MEMWARDEN_BACKEND_TOKEN",
         "valueFrom": {"secretKeyRef": {"name": NAME, "key": "backend-token", "optional": True}}},
        # Prometheus scrapes the pod on its own port; the Service exposes only the API port and the
        # NetworkPolicy admits the metrics port from Prometheus only, so agents cannot watch decision counters
        # move nor read readiness details.
        {"name": "MEMWARDEN_METRICS_HOST", "value": "0.0.0.0"},
        {"name": "MEMWARDEN_METRICS_PORT", "value": "9464"},
        # SIGTERM: readyz 503 and still serving for the drain, then in-flight requests get the timeout.
        {"name": "MEMWARDEN_SHUTDOWN_DRAIN_S", "value": str(SHUTDOWN_DRAIN_S)},
        {"name": "MEMWARDEN_SHUTDOWN_TIMEOUT_S", "value": str(SHUTDOWN_TIMEOUT_S)},
        # HTTPS on the API port: the certificate and key of the TLS Secret, mounted read-only (reloaded when renewed).
        {"name": "MEMWARDEN_TLS_CERT", "value": f"{TLS_DIR}/tls.crt"},
        {"name": "MEMWARDEN_TLS_KEY", "value": f"{TLS_DIR}/tls.key"},
        # Bearer JWTs (OIDC) and the decision log's HTTP collector: set by the optional ConfigMap's keys, else off.
        *({"name": var, "valueFrom": {"configMapKeyRef": {"name": CONFIG, "key": key, "optional": True}}}
          for key, var in CONFIG_KEYS.items()),
        # Each shipped decision event names its pod; at shutdown the buffered events get this long to ship.
        {"name": "MEMWARDEN_DECISION_LOG_INSTANCE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "MEMWARDEN_DECISION_LOG_SHUTDOWN_S", "value": str(DECISION_LOG_SHUTDOWN_S)},
    ]
    restricted = {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001, "allowPrivilegeEscalation": False,
                  "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}
    policies_mount = {"name": "policies", "mountPath": "/etc/memwarden/policies", "readOnly": True}
    invariants_mount = {"name": "invariants", "mountPath": "/etc/memwarden/invariants", "readOnly": True}
    tls_mount = {"name": "tls", "mountPath": TLS_DIR, "readOnly": True}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": NAME, "labels": LABELS},
         "automountServiceAccountToken": False},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{NAME}-policies", "labels": LABELS},
         "data": {key: (root / rel).read_text(encoding="utf-8") for key, rel in files.items()}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{NAME}-invariants", "labels": LABELS},
         "data": {key: (invariants / rel).read_text(encoding="utf-8") for key, rel in pinned.items()}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": NAME, "labels": LABELS}, "type": "Opaque",
         "stringData": {"ledger-url": "postgresql://memwarden:CHANGE-ME@postgres.memwarden.svc:5432/memwarden",
                        "backend-token": ""}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": NAME, "labels": LABELS},
         "spec": {"selector": LABELS, "ports": [{"name": "http", "port": 8080, "targetPort": "http"}]}},
        {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": NAME, "labels": LABELS},
         "spec": {"podSelector": {"matchLabels": LABELS}, "policyTypes": ["Ingress"], "ingress": [
             {"ports": [{"protocol": "TCP", "port": "http"}]},  # the API: every client
             {"from": [{"namespaceSelector": {"matchLabels": MONITORING_NAMESPACE_LABELS},
                        "podSelector": {"matchLabels": MONITORING_POD_LABELS}}],
              "ports": [{"protocol": "TCP", "port": "metrics"}]},  # metrics and readiness details: Prometheus only
         ]}},
        {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": NAME, "labels": LABELS},
         "spec": {
             # One pod: Chroma's data lives on this pod's volume, so it is not replicated by scaling.
             "replicas": 1, "serviceName": NAME, "selector": {"matchLabels": LABELS},
             "template": {
                 "metadata": {"labels": LABELS, "annotations": {
                     "prometheus.io/scrape": "true", "prometheus.io/port": "9464", "prometheus.io/path": "/metrics"}},
                 "spec": {
                     "serviceAccountName": NAME, "automountServiceAccountToken": False,
                     "terminationGracePeriodSeconds": PRESTOP_SLEEP_S + SHUTDOWN_DRAIN_S + SHUTDOWN_TIMEOUT_S
                     + DECISION_LOG_SHUTDOWN_S + 10,
                     "securityContext": {"fsGroup": 10001, "seccompProfile": {"type": "RuntimeDefault"}},
                     "initContainers": [{
                         "name": "ledger-migrate", "image": IMAGE, "args": ["ledger", "migrate"],
                         "env": [e for e in memwarden_env if e["name"] == "MEMWARDEN_LEDGER_URL"],
                         "securityContext": restricted,
                         "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
                     }],
                     "containers": [
                         {
                             "name": "memwarden", "image": IMAGE,
                             "args": ["serve", "--host", "0.0.0.0", "--port", "8080"],
                             "ports": [{"name": "http", "containerPort": 8080}, {"name": "metrics", "containerPort": 9464}],
                             "env": memwarden_env,
                             "readinessProbe": probe("/_memwarden/readyz", 5),
                             "livenessProbe": probe("/_memwarden/healthz", 10),
                             "startupProbe": {**probe("/_memwarden/healthz", 2), "failureThreshold": 30},
                             "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_SLEEP_S}}},
                             "resources": {"requests": {"cpu": "250m", "memory": "256Mi"},
                                           "limits": {"memory": "768Mi"}},
                             "securityContext": restricted,
                             "volumeMounts": [policies_mount, invariants_mount, tls_mount,
                                              {"name": "tmp", "mountPath": "/tmp"}],
                         },
                         {
                             "name": "chroma", "image": CHROMA_IMAGE,
                             # Bound to localhost: only containers of this pod (memwarden) can reach it.
                             "command": ["chroma", "run", "--host", "127.0.0.1", "--port", "8000", "--path", "/data"],
                             "env": [{"name": "ANONYMIZED_TELEMETRY", "value": "False"}],
                             "resources": {"requests": {"cpu": "250m", "memory": "512Mi"},
                                           "limits": {"memory": "2Gi"}},
                             "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                             "volumeMounts": [{"name": "chroma-data", "mountPath": "/data"}],
                         },
                     ],
                     "volumes": [
                         {"name": "policies", "configMap": {
                             "name": f"{NAME}-policies",
                             "items": [{"key": key, "path": rel} for key, rel in files.items()]}},
                         {"name": "invariants", "configMap": {
                             "name": f"{NAME}-invariants",
                             "items": [{"key": key, "path": rel} for key, rel in pinned.items()]}},
                         # The key is readable by the pod's group (fsGroup) only: memwarden runs as 10001:10001.
                         {"name": "tls", "secret": {"secretName": TLS_SECRET, "defaultMode": 0o440}},
                         {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
                     ],
                 },
             },
             "volumeClaimTemplates": [{
                 "metadata": {"name": "chroma-data"},
                 "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}}},
             }],
         }},
    ]


DEFAULT_INVARIANTS = Path(__file__).resolve().parent / "invariants"


def render(root: Path, invariants: Path = DEFAULT_INVARIANTS) -> str:
    header = ("# Generated by deploy/kubernetes/render.py from policies/ and deploy/kubernetes/invariants/; re-run it\n"
              "# after changing either:\n"
              "#   python deploy/kubernetes/render.py policies > deploy/kubernetes/memwarden.yaml\n")
    return header + yaml.safe_dump_all(manifests(root, invariants), sort_keys=False, default_flow_style=False, width=120)


if __name__ == "__main__":
    sys.stdout.write(render(Path(sys.argv[1] if len(sys.argv) > 1 else "policies"),
                            Path(sys.argv[2]) if len(sys.argv) > 2 else DEFAULT_INVARIANTS))

"""deploy/ validated offline (no Docker engine, no cluster here): YAML parses, the image's entrypoint
is the console script the package installs, every MEMWARDEN_* variable is a real setting, and the
Kubernetes manifests pass the bundled Kubernetes 1.37 OpenAPI schemas (kubernetes-validate, strict)."""

from __future__ import annotations

import json
import re
import shlex
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from dotenv import dotenv_values

from sidecar.config import Settings
from sidecar.policy import PolicyEngine

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S_VERSION = "1.37.0"
sys.path.insert(0, str(DEPLOY / "kubernetes"))
import render  # noqa: E402

from tests.tls_certs import make_certs  # noqa: E402
from tests.wheelutil import (EVALUATION_REQUIREMENTS, PACKAGED_POLICIES, base_requirements, build_stage_sources,  # noqa: E402
                             build_wheel, evaluation_leftovers, policy_files)


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of deploy/Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (DEPLOY / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def settings_env(env: dict[str, Any] | list[dict[str, Any]]) -> set[str]:
    names = set(env) if isinstance(env, dict) else {e["name"] for e in env}
    return {n for n in names if n.startswith("MEMWARDEN_")}


def assert_real_settings(names: set[str]) -> None:
    fields = {f"MEMWARDEN_{name.upper()}" for name in Settings.model_fields}
    assert names and names <= fields, names - fields


def test_image_builds_the_product_alone() -> None:
    """The build stage copies the product's sources and installs ``.`` only: not the evaluation package."""
    sources = build_stage_sources()
    assert {"pyproject.toml", "sidecar", "invariants", "policies"} <= set(sources)
    assert not [s for s in sources if s.rstrip("/").split("/")[0] in ("evaluation", "tests", "bench")], sources
    installs = [a for i, a in dockerfile() if i == "RUN" and "pip install" in a]
    assert installs and not any("evaluation" in a or "[" in a for a in installs), installs


def test_dockerfile_is_slim_non_root_with_healthcheck() -> None:
    ins = dockerfile()
    froms = [a for i, a in ins if i == "FROM"]
    assert froms and all("-slim" in a for a in froms)
    users = [a for i, a in ins if i == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    health = [a for i, a in ins if i == "HEALTHCHECK"]
    assert len(health) == 1 and "/_memwarden/healthz" in health[0]
    for i, a in ins:
        if i == "COPY" and "--from" not in a:
            for src in shlex.split(a)[:-1]:
                assert (ROOT / src).exists(), src  # the build context (repository root) has it
    assert_real_settings({w.split("=")[0] for i, a in ins if i == "ENV" for w in a.split() if w.startswith("MEMWARDEN_")})


def test_entrypoint_is_the_installed_console_script(tmp_path: Path) -> None:
    ins = dict(dockerfile())
    entrypoint, cmd = json.loads(ins["ENTRYPOINT"]), json.loads(ins["CMD"])
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert entrypoint == ["memwarden"] and scripts["memwarden"] == "sidecar.cli:app"
    # The wheel the image's `pip install .` builds declares that console script and ships the package.
    # Built from a copy of what the Dockerfile's build stage copies (no build/ or egg-info left in the work tree).
    wheel = build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        entry_points = zf.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "memwarden = sidecar.cli:app" in entry_points
    assert "sidecar/cli.py" in names and "sidecar/ledger/postgres.py" in names and "invariants/cli.py" in names
    # The product only: no demo, probe, benchmark, harness or embeddings module, no evaluation command or requirement.
    assert not evaluation_leftovers(names), evaluation_leftovers(names)
    assert {n.split("/")[0] for n in names} == {"sidecar", "invariants", "memwarden-0.1.0.dist-info"}
    assert "memwarden-eval" not in entry_points and "memwarden_eval" not in entry_points
    with zipfile.ZipFile(wheel) as zf:
        metadata = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    required = base_requirements(metadata)
    assert any(r.startswith("cedarpy") for r in required) and any(r.startswith("fastapi") for r in required)
    assert not [r for r in required if r.lower().startswith(EVALUATION_REQUIREMENTS)], required
    # The baseline invariants are package data of the wheel, byte for byte.
    baseline = sorted((ROOT / "invariants" / "baseline").glob("*.cedar"))
    assert baseline
    with zipfile.ZipFile(wheel) as zf:
        for f in baseline:
            assert zf.read(f"invariants/baseline/{f.name}") == f.read_bytes()
        # The default policy set is the build-time copy of policies/ (setup.py): the same files, byte for byte.
        packaged = {n[len(PACKAGED_POLICIES):]: zf.read(n) for n in names
                    if n.startswith(PACKAGED_POLICIES) and not n.endswith("/")}
    expected = policy_files(ROOT / "policies")
    assert "memwarden.cedarschema" in expected and "default.cedar" in expected
    assert any(name.startswith("tests/") for name in expected)
    assert packaged == expected
    # The CMD (and the compose/k8s arguments) are accepted by that command.
    from typer.testing import CliRunner

    from sidecar.cli import app

    for args in (cmd, ["ledger", "migrate"]):
        result = CliRunner().invoke(app, [*args, "--help"])
        assert result.exit_code == 0, (args, result.output)


def test_compose_file() -> None:
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"postgres", "chroma", "memwarden", "migrate"} <= set(services)
    published = {name for name, svc in services.items() if svc.get("ports")}
    assert published == {"memwarden"}  # the backend and the ledger are not reachable from outside
    mw = services["memwarden"]
    assert mw["environment"]["MEMWARDEN_BACKEND_URL"] == "http://chroma:8000"
    assert mw["environment"]["MEMWARDEN_LEDGER_URL"].startswith("postgresql://")
    assert "readyz" in " ".join(mw["healthcheck"]["test"])
    assert services["migrate"]["build"]["dockerfile"] == "deploy/Dockerfile"
    assert (DEPLOY / services["migrate"]["build"]["context"] / "deploy" / "Dockerfile").exists()
    assert services["migrate"]["command"] == ["ledger", "migrate"]
    assert mw["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    for svc in services.values():
        if "environment" in svc and any(k.startswith("MEMWARDEN_") for k in svc["environment"]):
            assert_real_settings(settings_env(svc["environment"]))


_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's interpolation (compose-spec "Interpolation") of ``${VAR}``, ``${VAR:-default}``,
    ``${VAR-default}``, ``${VAR:?error}`` and ``${VAR?error}``; raises ValueError(error) for a required variable
    unset (``?``) or unset or empty (``:?``), as ``docker compose`` refuses to start. (``$$`` and bare ``$VAR``
    are not used in the file: asserted.)"""
    assert "$$" not in text and not re.search(r"\$[A-Za-z_]", text)

    def one(m: re.Match[str]) -> str:
        name, op, arg = m.group(1), m.group(2), m.group(3)
        value = env.get(name)
        missing = value is None or (op is not None and op.startswith(":") and value == "")
        if op is not None and op.endswith("?") and missing:
            raise ValueError(f"required variable {name} is missing a value: {arg}")
        if op is not None and op.endswith("-") and missing:
            return arg
        return value or ""
    return _VARIABLE.sub(one, text)


def test_compose_refuses_to_start_without_a_password() -> None:
    """Issue 34, finding 12: no fallback password. Every use of MW_PG_PASSWORD is required (``:?``): unset or
    empty, compose stops with the message; set, it is the PostgreSQL password and in both ledger URLs."""
    text = (DEPLOY / "docker-compose.yml").read_text()
    assert "change-me" not in text.lower()
    uses = [m for m in _VARIABLE.finditer(text) if m.group(1) == "MW_PG_PASSWORD"]
    assert len(uses) == 3 and all(m.group(2) == ":?" and "MW_PG_PASSWORD" in m.group(3) for m in uses)
    for env in ({}, {"MW_PG_PASSWORD": ""}):
        with pytest.raises(ValueError, match="MW_PG_PASSWORD"):
            interpolate(text, env)
    services = yaml.safe_load(interpolate(text, {"MW_PG_PASSWORD": "s3cret-pw"}))["services"]
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"] == "s3cret-pw"
    for name in ("migrate", "memwarden"):
        assert services[name]["environment"]["MEMWARDEN_LEDGER_URL"] == \
            "postgresql://memwarden:s3cret-pw@postgres:5432/memwarden"
    # `docker compose stop` leaves memwarden its drain and the requests in flight their time (sidecar/drain.py).
    grace = int(services["memwarden"]["stop_grace_period"].removesuffix("s"))
    defaults = Settings.model_fields
    assert grace > defaults["shutdown_drain_s"].default + defaults["shutdown_timeout_s"].default


def _docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


@pytest.mark.parametrize("source", ["committed", "rendered"])
def test_kubernetes_manifests_pass_the_schema(source: str) -> None:
    text = (DEPLOY / "kubernetes" / "memwarden.yaml").read_text() if source == "committed" else render.render(ROOT / "policies")
    docs = _docs(text)
    assert {d["kind"] for d in docs} == {"ServiceAccount", "ConfigMap", "Secret", "Service", "NetworkPolicy", "StatefulSet"}
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_schema_check_is_not_vacuous() -> None:
    sts = next(d for d in _docs(render.render(ROOT / "policies")) if d["kind"] == "StatefulSet")
    sts["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGett"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, K8S_VERSION, strict=True)


def test_kubernetes_sidecar_pattern(tmp_path: Path) -> None:
    docs = {d["kind"]: d for d in _docs(render.render(ROOT / "policies"))}
    pod = docs["StatefulSet"]["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    assert set(containers) == {"memwarden", "chroma"}
    chroma, mw = containers["chroma"], containers["memwarden"]
    assert chroma["command"][chroma["command"].index("--host") + 1] == "127.0.0.1" and "ports" not in chroma
    assert [p["targetPort"] for p in docs["Service"]["spec"]["ports"]] == ["http"]
    assert mw["ports"] == [{"name": "http", "containerPort": 8080}, {"name": "metrics", "containerPort": 9464}]
    assert mw["readinessProbe"]["httpGet"]["path"] == "/_memwarden/readyz"
    assert mw["livenessProbe"]["httpGet"]["path"] == "/_memwarden/healthz"
    for c in [*pod["containers"], *pod["initContainers"]]:
        assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
    assert mw["securityContext"]["runAsNonRoot"] and mw["securityContext"]["readOnlyRootFilesystem"]
    env = {e["name"]: e for e in mw["env"]}
    assert env["MEMWARDEN_LEDGER_URL"]["valueFrom"]["secretKeyRef"] == {"name": "memwarden", "key": "ledger-url"}
    assert env["MEMWARDEN_BACKEND_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "memwarden"
    assert {"ledger-url", "backend-token"} <= set(docs["Secret"]["stringData"])
    assert_real_settings(settings_env(mw["env"]))
    assert pod["initContainers"][0]["args"] == ["ledger", "migrate"]
    # The ConfigMap projected through the volume's items is a policy directory that loads.
    volume = next(v for v in pod["volumes"] if v["name"] == "policies")["configMap"]
    configmaps = {d["metadata"]["name"]: d for d in _docs(render.render(ROOT / "policies")) if d["kind"] == "ConfigMap"}
    data = configmaps["memwarden-policies"]["data"]
    assert {i["key"] for i in volume["items"]} == set(data)
    for item in volume["items"]:
        (tmp_path / item["path"]).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / item["path"]).write_text(data[item["key"]])
    PolicyEngine.load(tmp_path)
    mount = next(m for m in mw["volumeMounts"] if m["name"] == "policies")
    assert mount["mountPath"] == env["MEMWARDEN_POLICIES_DIR"]["value"]
    # The pinned invariants: a second ConfigMap on a mount of its own, named by MEMWARDEN_INVARIANTS_DIR,
    # never inside the policy directory; projected, it is a directory of invariants the policies pass.
    pinned = configmaps["memwarden-invariants"]["data"]
    assert pinned and not any(k.startswith("invariants__") for k in data)
    inv_volume = next(v for v in pod["volumes"] if v["name"] == "invariants")["configMap"]
    assert inv_volume["name"] == "memwarden-invariants" and {i["key"] for i in inv_volume["items"]} == set(pinned)
    inv_mount = next(m for m in mw["volumeMounts"] if m["name"] == "invariants")
    assert inv_mount["readOnly"] and inv_mount["mountPath"] == env["MEMWARDEN_INVARIANTS_DIR"]["value"]
    assert not inv_mount["mountPath"].startswith(mount["mountPath"] + "/")
    pinned_dir = tmp_path / "pinned"
    pinned_dir.mkdir()
    for item in inv_volume["items"]:
        (pinned_dir / item["path"]).write_text(pinned[item["key"]])
    from invariants.gate import admit

    res = admit(tmp_path, [pinned_dir])
    assert res.passed, res.problems
    assert res.invariants == res.baseline + len(pinned)
    # Prometheus scrapes the metrics port on the pod; the Service carries only the API port.
    assert env["MEMWARDEN_METRICS_PORT"]["value"] == "9464" and env["MEMWARDEN_METRICS_HOST"]["value"] == "0.0.0.0"
    assert docs["StatefulSet"]["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == "9464"
    # Every file of policies/ the sidecar reads is in the ConfigMap (single-valued predicates included).
    assert "single_valued.txt" in data


def test_committed_manifest_is_the_rendered_one() -> None:
    assert (DEPLOY / "kubernetes" / "memwarden.yaml").read_text() == render.render(ROOT / "policies"), \
        "re-run: python deploy/kubernetes/render.py policies > deploy/kubernetes/memwarden.yaml"


def test_kubernetes_metrics_port_is_for_prometheus_only() -> None:
    """Issue 34, finding 12: the metrics/operator port (exposition text, readiness details) is not on the
    Service the clients use, and a NetworkPolicy admits it only from the Prometheus pods of the monitoring
    namespace; the API port stays open to clients."""
    docs = {d["kind"]: d for d in _docs(render.render(ROOT / "policies"))}
    pod_labels = docs["StatefulSet"]["spec"]["template"]["metadata"]["labels"]
    assert [p["targetPort"] for p in docs["Service"]["spec"]["ports"]] == ["http"]
    policy = docs["NetworkPolicy"]["spec"]
    assert policy["podSelector"]["matchLabels"] == pod_labels and policy["policyTypes"] == ["Ingress"]
    rules = {tuple(p["port"] for p in rule["ports"]): rule for rule in policy["ingress"]}
    assert set(rules) == {("http",), ("metrics",)}
    assert "from" not in rules[("http",)]
    assert rules[("metrics",)]["from"] == [{"namespaceSelector": {"matchLabels": render.MONITORING_NAMESPACE_LABELS},
                                            "podSelector": {"matchLabels": render.MONITORING_POD_LABELS}}]
    assert render.MONITORING_NAMESPACE_LABELS == {"kubernetes.io/metadata.name": "monitoring"}
    mw = next(c for c in docs["StatefulSet"]["spec"]["template"]["spec"]["containers"] if c["name"] == "memwarden")
    named = {p["name"]: p["containerPort"] for p in mw["ports"]}
    env = {e["name"]: e.get("value") for e in mw["env"]}
    assert named["metrics"] == int(env["MEMWARDEN_METRICS_PORT"]) and named["http"] == 8080


def test_kubernetes_pod_drains_before_it_stops() -> None:
    """Issue 34, finding 12: preStop, then memwarden's own drain on SIGTERM (readyz 503, still serving), then
    the requests in flight; terminationGracePeriodSeconds covers all three."""
    pod = next(d for d in _docs(render.render(ROOT / "policies")) if d["kind"] == "StatefulSet")["spec"]["template"]["spec"]
    mw = next(c for c in pod["containers"] if c["name"] == "memwarden")
    env = {e["name"]: e.get("value") for e in mw["env"]}
    assert_real_settings({"MEMWARDEN_SHUTDOWN_DRAIN_S", "MEMWARDEN_SHUTDOWN_TIMEOUT_S"})
    sleep = mw["lifecycle"]["preStop"]["sleep"]["seconds"]
    drain, timeout = float(env["MEMWARDEN_SHUTDOWN_DRAIN_S"]), float(env["MEMWARDEN_SHUTDOWN_TIMEOUT_S"])
    assert sleep > 0 and drain > 0 and timeout > 0
    assert pod["terminationGracePeriodSeconds"] > sleep + drain + timeout


def test_compose_serves_tls_from_secrets_and_takes_identity_and_shipping_settings(tmp_path: Path) -> None:
    """Issue 37: the compose service serves HTTPS with a certificate and key mounted read-only as compose secrets
    (files under deploy/tls/, git-ignored), checks its health over HTTPS, and reads the JWT/OIDC and decision-log
    shipping settings from an optional env file whose example holds only real settings that load together."""
    compose = yaml.safe_load(interpolate((DEPLOY / "docker-compose.yml").read_text(), {"MW_PG_PASSWORD": "pw"}))
    mw = compose["services"]["memwarden"]
    env = mw["environment"]
    assert set(mw["secrets"]) == {"memwarden-tls-cert", "memwarden-tls-key"}
    assert env["MEMWARDEN_TLS_CERT"] == "/run/secrets/memwarden-tls-cert"  # where compose mounts a secret, read-only
    assert env["MEMWARDEN_TLS_KEY"] == "/run/secrets/memwarden-tls-key"
    files = {name: secret["file"] for name, secret in compose["secrets"].items()}
    assert files == {"memwarden-tls-cert": "./tls/tls.crt", "memwarden-tls-key": "./tls/tls.key"}
    ignored = (DEPLOY / ".gitignore").read_text().split()
    assert "tls/" in ignored and "memwarden.env" in ignored  # keys and settings files stay out of git
    check = " ".join(mw["healthcheck"]["test"])
    assert "https://127.0.0.1:8080/_memwarden/readyz" in check and "http://" not in check
    assert mw["env_file"] == [{"path": "./memwarden.env", "required": False}]
    example = dotenv_values(DEPLOY / "memwarden.env.example")
    assert {"MEMWARDEN_JWT_ISSUER", "MEMWARDEN_JWT_AUDIENCE", "MEMWARDEN_JWT_JWKS_URL", "MEMWARDEN_JWT_CLAIMS",
            "MEMWARDEN_DECISION_LOG_URL"} <= set(example)
    assert_real_settings(set(example) | settings_env(env))
    # What the container would run with: the example's settings, the compose TLS variables pointing at a real pair.
    certs = make_certs(tmp_path)
    values: dict[str, Any] = {k.removeprefix("MEMWARDEN_").lower(): v for k, v in example.items()}
    values["jwt_claims"] = json.loads(values["jwt_claims"])
    s = Settings(**values, tls_cert=certs.server_cert, tls_key=certs.server_key,
                 decision_log_instance=env["MEMWARDEN_DECISION_LOG_INSTANCE"])
    assert s.jwt_issuer == example["MEMWARDEN_JWT_ISSUER"] and s.decision_log_url is not None


def test_kubernetes_tls_secret_identity_and_decision_log_settings(tmp_path: Path) -> None:
    """Issue 37: the pod serves HTTPS with the kubernetes.io/tls Secret's tls.crt/tls.key mounted read-only (key
    readable by the pod's group only), probes over HTTPS, takes the JWT/OIDC settings and the decision-log URL from
    optional ConfigMap keys (absent: off, so the manifest applies as it is), names itself in shipped events and
    leaves the final flush its time before the kill."""
    docs = {d["kind"]: d for d in _docs(render.render(ROOT / "policies"))}
    pod = docs["StatefulSet"]["spec"]["template"]["spec"]
    mw = next(c for c in pod["containers"] if c["name"] == "memwarden")
    env = {e["name"]: e for e in mw["env"]}
    volume = next(v for v in pod["volumes"] if v["name"] == "tls")
    assert volume["secret"]["secretName"] == render.TLS_SECRET == "memwarden-tls"
    assert volume["secret"]["defaultMode"] == 0o440 and pod["securityContext"]["fsGroup"] == 10001
    assert "memwarden-tls" not in {d["metadata"]["name"] for d in docs.values() if d["kind"] == "Secret"}  # never rendered
    mount = next(m for m in mw["volumeMounts"] if m["name"] == "tls")
    assert mount["readOnly"] is True
    # the keys of a kubernetes.io/tls Secret, under the mount
    assert env["MEMWARDEN_TLS_CERT"]["value"] == f"{mount['mountPath']}/tls.crt"
    assert env["MEMWARDEN_TLS_KEY"]["value"] == f"{mount['mountPath']}/tls.key"
    assert "MEMWARDEN_TLS_CLIENT_CA" not in env  # mTLS is opt-in: the kubelet's probes present no certificate
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert mw[probe]["httpGet"]["scheme"] == "HTTPS"
    for key, var in render.CONFIG_KEYS.items():
        assert env[var]["valueFrom"]["configMapKeyRef"] == {"name": render.CONFIG, "key": key, "optional": True}
    assert {"MEMWARDEN_JWT_ISSUER", "MEMWARDEN_JWT_AUDIENCE", "MEMWARDEN_JWT_JWKS_URL", "MEMWARDEN_JWT_CLAIMS",
            "MEMWARDEN_DECISION_LOG_URL"} <= set(render.CONFIG_KEYS.values())
    assert render.CONFIG not in {d["metadata"]["name"] for d in _docs(render.render(ROOT / "policies"))}
    assert env["MEMWARDEN_DECISION_LOG_INSTANCE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert_real_settings(settings_env(mw["env"]))
    # The settings load as the pod sees them: the literal values with a real certificate at the mounted names, and
    # again with the ConfigMap of the render docstring's example.
    certs = make_certs(tmp_path)
    literal = {n.removeprefix("MEMWARDEN_").lower(): e["value"] for n, e in env.items() if "value" in e
               and n not in ("MEMWARDEN_TLS_CERT", "MEMWARDEN_TLS_KEY", "MEMWARDEN_POLICIES_DIR", "MEMWARDEN_INVARIANTS_DIR")}
    base = {**literal, "tls_cert": certs.server_cert, "tls_key": certs.server_key}
    assert Settings(**base).decision_log_url is None and Settings(**base).jwt_issuer is None
    example = dict(re.findall(r"--from-literal=([a-z-]+)=('[^']*'|\S+)", render.__doc__ or ""))
    assert set(example) <= set(render.CONFIG_KEYS) and {"jwt-issuer", "decision-log-url"} <= set(example)
    configured = {render.CONFIG_KEYS[k].removeprefix("MEMWARDEN_").lower(): v.strip("'") for k, v in example.items()}
    configured["jwt_claims"] = json.loads(configured["jwt_claims"])
    s = Settings(**base, **configured, decision_log_instance="memwarden-0")
    assert s.jwt_audience == "memwarden" and str(s.decision_log_url).startswith("https://")
    # SIGTERM: preStop, drain, requests in flight, then the decision log's final flush, all before the kill.
    grace = pod["terminationGracePeriodSeconds"]
    assert grace > sum(float(x) for x in (mw["lifecycle"]["preStop"]["sleep"]["seconds"],
                                           env["MEMWARDEN_SHUTDOWN_DRAIN_S"]["value"],
                                           env["MEMWARDEN_SHUTDOWN_TIMEOUT_S"]["value"],
                                           env["MEMWARDEN_DECISION_LOG_SHUTDOWN_S"]["value"]))

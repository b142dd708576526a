"""What a real node's images cost: the node store cloned by hard links (what ``hack/localcluster/nodes.py`` does for
every node) against importing the same images into a fresh containerd (what each node would pay without the
store), side by side in one run: seconds, and bytes of disk added.

    python bench/node_store.py [--clones 2] [--import]

``--import`` also times ``podman save | ctr import`` of the trainer image into a fresh containerd root, once; it needs
the trainer image in buildah's storage (``hack/images/build.sh`` removes it once the store holds it, so rebuild it
with ``bash hack/images/build.sh --images`` after deleting the store, or run this right after a build).
Root only (containerd, overlayfs).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def store_path() -> Path:
    out = subprocess.run(
        ["bash", str(ROOT / "hack" / "images" / "build.sh")], stdout=subprocess.PIPE, text=True, check=True
    ).stdout
    return Path(out.strip().splitlines()[-1])


def time_clones(store: Path, clones: int, work: Path) -> list[dict[str, float]]:
    from hack.localcluster.nodes import clone_store

    rows = []
    for i in range(clones):
        before = free_bytes(work)
        t0 = time.perf_counter()
        clone_store(store / "root", work / f"node-{i}")
        rows.append(
            {
                "seconds": round(time.perf_counter() - t0, 2),
                "disk_added_mb": round((before - free_bytes(work)) / 2**20, 1),
            }
        )
    return rows


def time_import(image: str, work: Path) -> dict[str, float]:
    env_out = subprocess.run(
        ["bash", str(ROOT / "hack" / "images" / "build.sh"), "--env"], capture_output=True, text=True, check=True
    ).stdout
    env = dict(os.environ)
    for part in env_out.replace("export ", "").split():
        key, _, value = part.partition("=")
        env[key] = value
    root, run = work / "import-root", Path(tempfile.mkdtemp(prefix="ftn-bench-", dir="/run"))
    (work / "import.toml").write_text(
        f'version = 2\nroot = "{root}"\nstate = "{run}"\n'
        f'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
        f'[grpc]\n  address = "{run}/c.sock"\n'
        f'[ttrpc]\n  address = "{run}/c.sock.ttrpc"\n'
    )
    ctd = subprocess.Popen(
        ["containerd", "--config", str(work / "import.toml")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        while not (run / "c.sock").exists():
            time.sleep(0.1)
        before = free_bytes(work)
        t0 = time.perf_counter()
        subprocess.run(
            f"podman save --format docker-archive {image} | ctr --address {run}/c.sock -n k8s.io "
            f"images import --snapshotter overlayfs -",
            shell=True,
            check=True,
            env=env,
            stdout=subprocess.DEVNULL,
        )
        return {
            "seconds": round(time.perf_counter() - t0, 1),
            "disk_added_mb": round((before - free_bytes(work)) / 2**20, 1),
        }
    finally:
        ctd.terminate()
        ctd.wait()
        subprocess.run(f"grep -o ' {run}[^ ]*' /proc/self/mounts | xargs -r -n1 umount -l", shell=True)
        shutil.rmtree(run, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clones", type=int, default=2)
    ap.add_argument("--import", dest="do_import", action="store_true")
    args = ap.parse_args()
    store = store_path()
    du = subprocess.run(["du", "-sb", str(store)], capture_output=True, text=True, check=True).stdout.split()[0]
    images = (store / "images").read_text().split()
    cache = store.parent
    work = Path(tempfile.mkdtemp(prefix="bench-node-store-", dir=cache))
    try:
        report: dict[str, object] = {
            "store": str(store),
            "store_mb": round(int(du) / 2**20, 1),
            "images": images,
            "clones": time_clones(store, args.clones, work),
        }
        if args.do_import:
            trainer = next(i for i in images if "trainer" in i)
            report["import_trainer_once"] = time_import(trainer, work)
        print(json.dumps(report, indent=1))
    finally:
        subprocess.run(f"grep -o ' {work}[^ ]*' /proc/self/mounts | xargs -r -n1 umount -l", shell=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

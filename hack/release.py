"""Release tooling, run by .github/workflows/release.yml, by the local release, and by the chart tests.

    python -m hack.release check --tag v0.2.0
        every version in the repository equals the tag's: Chart.yaml version and appVersion, pyproject.toml,
        trainer-image/pyproject.toml, the operator's default trainer images (settings.py)
    python -m hack.release pin --chart DIR [--registry REG/OWNER] --operator sha256:… [--trainer sha256:…]
            [--trainer-cpu sha256:…] [--trainer-ort sha256:…]
        pin the images a release pushed by digest in the chart's values.yaml (a copy of the chart), and with
        --registry point every image of the chart at REG/OWNER/<image>; an image with no digest keeps its tag
    python -m hack.release publish --version X.Y.Z --registry REG/OWNER --operator sha256:… [...] [--plain-http]
        what the release workflow's chart job runs: a copy of the chart at version X.Y.Z, pinned, linted, packaged and
        pushed to oci://REG/OWNER/charts/finetune-operator
    python -m hack.release local --registry 127.0.0.1:PORT --version X.Y.Z
        the whole release against a registry on this machine (hack/registry): the operator and CPU trainer images
        built here (hack/images/build.sh) pushed (once per build), each labelled with the version in a manifest of
        its own, then `publish` with their digests.
        The CUDA images (trainer, trainer-ort) start from registry bases this machine cannot pull: not built, not
        pinned (their tag stays). Prints what it pushed as JSON.

Exit 1 with every problem listed.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DIGEST = re.compile(r"^sha256:[a-f0-9]{64}$")
SEMVER = re.compile(r"^\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$")


def versions(root: Path = ROOT) -> dict[str, str]:
    """Every place a release version is written, and what it says."""
    chart = (root / "charts" / "finetune-operator" / "Chart.yaml").read_text()
    found = {
        "Chart.yaml version": re.search(r"^version:\s*\"?([^\"\s]+)", chart, re.M),
        "Chart.yaml appVersion": re.search(r"^appVersion:\s*\"?([^\"\s]+)", chart, re.M),
    }
    out = {k: m.group(1) if m else "(missing)" for k, m in found.items()}
    for name in ("pyproject.toml", "trainer-image/pyproject.toml"):
        out[name] = tomllib.loads((root / name).read_text())["project"]["version"]
    settings = (root / "operator" / "finetune_operator" / "settings.py").read_text()
    for image in ("trainer", "trainer-ort"):
        m = re.search(rf'"ghcr\.io/finetune-operator/{image}:([^"]+)"', settings)
        out[f"settings.py {image} image tag"] = m.group(1) if m else "(missing)"
    return out


def check(tag: str, root: Path = ROOT) -> list[str]:
    want = tag.removeprefix("v")
    return [f"{where} is {got}, the tag says {want}" for where, got in versions(root).items() if got != want]


# The chart's values path of each image a release pushes (the workflow's image legs, by name).
IMAGES = {
    "operator": "image",
    "trainer": "trainer.image",
    "trainer-cpu": "trainer.cpuImage",
    "trainer-ort": "trainer.ortImage",
}
CHART_NAME = "finetune-operator"


def pin(chart: Path, digests: dict[str, str], *, registry: str | None = None) -> list[str]:
    """Write ``digests`` (image name: sha256 digest, names from ``IMAGES``) into ``chart``/values.yaml, and with
    ``registry`` (``host/owner``) every image's repository as ``registry/<name>``; comments and layout kept. Returns
    the problems (an unknown image, a digest that is not one, a line not found)."""
    problems = [f"{k}: no such image (one of {', '.join(IMAGES)})" for k in digests if k not in IMAGES]
    problems += [f"{k}: {v!r} is not a sha256 digest" for k, v in digests.items() if not DIGEST.match(v)]
    if problems:
        return problems
    want = {f"{IMAGES[k]}.digest": f'"{v}"' for k, v in digests.items()}
    if registry:
        want |= {f"{key}.repository": f"{registry.rstrip('/')}/{name}" for name, key in IMAGES.items()}
    path = chart / "values.yaml"
    lines = path.read_text().splitlines(keepends=True)
    stack: list[tuple[int, str]] = []
    done = set()
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)([A-Za-z]\w*):(.*)$", line)
        if not m:
            continue
        indent = len(m.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        key = ".".join([k for _, k in stack] + [m.group(2)])
        if key in want:
            lines[i] = f"{m.group(1)}{m.group(2)}: {want[key]}\n"
            done.add(key)
        stack.append((indent, m.group(2)))
    path.write_text("".join(lines))
    return [f"{k}: no such line in {path}" for k in want if k not in done]


def set_version(chart: Path, version: str) -> None:
    """Chart.yaml's version and appVersion (a copy's: the workflow's `check` has made them the tag's already)."""
    path = chart / "Chart.yaml"
    text = re.sub(r"^version:.*$", f"version: {version}", path.read_text(), count=1, flags=re.M)
    path.write_text(re.sub(r"^appVersion:.*$", f'appVersion: "{version}"', text, count=1, flags=re.M))


def helm_binary() -> str:
    """``$HELM``, else helm on PATH (the workflow's), else the one the chart tests build (hack/helmtools)."""
    if os.environ.get("HELM"):
        return os.environ["HELM"]
    if shutil.which("helm"):
        return "helm"
    from hack.helmtools import ensure_tools

    return str(ensure_tools().helm)


def publish(
    version: str, registry: str, digests: dict[str, str], *, plain_http: bool = False, source: Path | None = None
) -> str:
    """The release's chart: a copy of ``charts/finetune-operator`` (the CRD link followed) at ``version``, its images
    pinned (``pin``), linted, packaged and pushed to ``oci://<registry>/charts``. Returns the chart's reference."""
    if not SEMVER.match(version):
        raise ReleaseError([f"version {version!r} is not X.Y.Z (Helm needs a semantic version)"])
    helm = helm_binary()
    plain = ["--plain-http"] if plain_http else []
    with tempfile.TemporaryDirectory(prefix="finetune-release-") as tmp:
        chart = Path(tmp) / CHART_NAME
        shutil.copytree(source or ROOT / "charts" / CHART_NAME, chart, symlinks=False)
        set_version(chart, version)
        problems = pin(chart, digests, registry=registry)
        if problems:
            raise ReleaseError(problems)
        for argv in (
            [helm, "lint", "--strict", str(chart)],
            [helm, "package", str(chart), "--destination", str(Path(tmp) / "dist")],
            [helm, "push", str(Path(tmp) / "dist" / f"{CHART_NAME}-{version}.tgz"), f"oci://{registry}/charts", *plain],
        ):
            proc = subprocess.run(argv, capture_output=True, text=True)
            if proc.returncode != 0:
                raise ReleaseError([f"{' '.join(argv[:2])} failed ({proc.returncode}): {proc.stderr.strip()}"])
    return f"oci://{registry}/charts/{CHART_NAME}"


class ReleaseError(RuntimeError):
    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def _registry_call(url: str, method: str = "GET", data: bytes | None = None, ctype: str | None = None) -> Any:
    """One call of a (plain-HTTP, this machine's) registry's API, asking for OCI manifests; the open response."""
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Accept", OCI_MANIFEST)
    if ctype:
        req.add_header("Content-Type", ctype)
    return urllib.request.urlopen(req, timeout=60)


def push_build(image: str, repository: str, env: dict[str, str]) -> str:
    """``image`` (an image buildah holds in the storage ``env`` names, tagged with the key of what it is built from)
    pushed once to ``repository`` (``host:port/owner/name``, a plain-HTTP registry of this machine) under that key;
    returns the reference it has there. A registry that holds the tag already is not pushed to again."""
    ref = f"{repository}:build-{image.rsplit(':', 1)[1]}"
    host, path = ref.split("/", 1)
    name, tag = path.rsplit(":", 1)
    manifest = f"http://{host}/v2/{name}/manifests/{tag}"
    with contextlib.suppress(urllib.error.HTTPError), _registry_call(manifest, "HEAD"):
        return ref
    _drop_older_builds(host, name)
    argv = ["buildah", "push", "--quiet", "--tls-verify=false", "--format", "oci", image, f"docker://{ref}"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise ReleaseError([f"buildah push {image}: {proc.stderr.strip()[-500:]}"])
    return ref


def _drop_older_builds(host: str, name: str) -> None:
    """Delete the repository's other ``build-…`` manifests (the registry collects their layers at its next start);
    the releases tagged from them stay."""
    base = f"http://{host}/v2/{name}"
    with contextlib.suppress(urllib.error.HTTPError), _registry_call(f"{base}/tags/list") as r:
        tags = json.loads(r.read()).get("tags") or []
        for tag in (t for t in tags if t.startswith("build-")):
            with _registry_call(f"{base}/manifests/{tag}", "HEAD") as h:
                digest = h.headers["Docker-Content-Digest"]
            _registry_call(f"{base}/manifests/{digest}", "DELETE").close()


def tag_release(build: str, version: str) -> str:
    """The release's image: ``build`` (``host:port/owner/name:build-…``) with the label
    ``org.opencontainers.image.version`` set to ``version`` in its config, as the workflow's metadata action labels
    its images (so each release has its own digest, as each release's build does), tagged ``version``; the layers are
    the build's, not uploaded again. Returns the new manifest's digest."""
    host, path = build.split("/", 1)
    name, tag = path.rsplit(":", 1)
    base = f"http://{host}/v2/{name}"
    with _registry_call(f"{base}/manifests/{tag}") as r:
        manifest = json.loads(r.read())
    with _registry_call(f"{base}/blobs/{manifest['config']['digest']}") as r:
        config = json.loads(r.read())
    labels = config.setdefault("config", {}).get("Labels") or {}
    config["config"]["Labels"] = {**labels, "org.opencontainers.image.version": version}
    blob = json.dumps(config, separators=(",", ":")).encode()
    digest = "sha256:" + hashlib.sha256(blob).hexdigest()
    with _registry_call(f"{base}/blobs/uploads/", "POST", b"") as r:
        upload = urllib.parse.urljoin(f"http://{host}", r.headers["Location"])
    sep = "&" if "?" in upload else "?"
    _registry_call(f"{upload}{sep}digest={digest}", "PUT", blob, "application/octet-stream").close()
    manifest["config"] = {**manifest["config"], "digest": digest, "size": len(blob)}
    body = json.dumps(manifest, separators=(",", ":")).encode()
    with _registry_call(f"{base}/manifests/{version}", "PUT", body, manifest.get("mediaType", OCI_MANIFEST)) as r:
        return str(r.headers["Docker-Content-Digest"])


def _storage_env() -> dict[str, str]:
    """The podman/buildah storage hack/images/build.sh builds into (under the cache, not /var/lib/containers)."""
    out = subprocess.run(["bash", str(ROOT / "hack" / "images" / "build.sh"), "--env"], capture_output=True, text=True)
    return dict(re.findall(r"(\w+)=(\S+)", out.stdout.strip().removeprefix("export ")))


def local(registry: str, version: str, owner: str = "finetune-operator") -> dict[str, object]:
    """The release against a registry on this machine: the images built here pushed, the chart published."""
    from hack.localcluster.nodes import image_names

    names = image_names()
    prefix = f"{registry}/{owner}"
    built = {"operator": names["operator"], "trainer-cpu": names["trainer"]}
    env = {**os.environ, **_storage_env()}
    missing = [
        image
        for image in built.values()
        if subprocess.run(["podman", "image", "exists", image], env=env, capture_output=True).returncode != 0
    ]
    if missing:
        raise ReleaseError([f"{image}: not built here; build it with `bash hack/images/build.sh`" for image in missing])
    digests = {name: tag_release(push_build(image, f"{prefix}/{name}", env), version) for name, image in built.items()}
    chart = publish(version, prefix, digests, plain_http=True)
    return {
        "chart": chart,
        "version": version,
        "images": {name: f"{prefix}/{name}@{digest}" for name, digest in digests.items()},
        "not built here": sorted(set(IMAGES) - set(built)),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m hack.release", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check")
    c.add_argument("--tag", required=True)
    for name in ("pin", "publish"):
        p = sub.add_parser(name)
        if name == "pin":
            p.add_argument("--chart", required=True, type=Path)
            p.add_argument("--registry", help="host/owner the images were pushed under")
        else:
            p.add_argument("--version", required=True)
            p.add_argument("--registry", required=True, help="host/owner: images under it, the chart under .../charts")
            p.add_argument("--plain-http", action="store_true", help="a registry of this machine, without TLS")
        p.add_argument("--operator", required=True)
        for image in ("trainer", "trainer-cpu", "trainer-ort"):
            p.add_argument(f"--{image}")
    lo = sub.add_parser("local")
    lo.add_argument("--registry", required=True, help="host:port of a registry on this machine (plain HTTP)")
    lo.add_argument("--version", required=True)
    args = ap.parse_args(argv)
    digests = {
        name: getattr(args, name.replace("-", "_"))
        for name in IMAGES
        if getattr(args, name.replace("-", "_"), None) is not None
    }
    try:
        if args.command == "check":
            problems = check(args.tag)
        elif args.command == "pin":
            problems = pin(args.chart, digests, registry=args.registry)
        elif args.command == "publish":
            print(publish(args.version, args.registry, digests, plain_http=args.plain_http))
            problems = []
        else:
            print(json.dumps(local(args.registry, args.version), indent=1))
            problems = []
    except ReleaseError as e:
        problems = e.problems
    for problem in problems:
        print(f"release: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

"""Release tooling, run by .github/workflows/release.yml (and by the chart tests, on a copy of the chart).

    python -m hack.release check --tag v0.2.0
        every version in the repository equals the tag's: Chart.yaml version and appVersion, pyproject.toml,
        trainer-image/pyproject.toml, the operator's default trainer images (settings.py)
    python -m hack.release pin --chart DIR --operator sha256:… --trainer sha256:… --trainer-ort sha256:…
        pin the three images the release pushed by digest in the chart's values.yaml (a copy of the chart:
        the workflow packages that copy), so a released chart always runs exactly the images built with it

Exit 1 with every mismatch listed.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DIGEST = re.compile(r"^sha256:[a-f0-9]{64}$")


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


def pin(chart: Path, *, operator: str, trainer: str, trainer_ort: str) -> list[str]:
    """Write the digests into ``chart``/values.yaml (its image.digest, trainer.image.digest, trainer.ortImage.digest
    lines, comments and layout kept); returns the problems (bad digests, a line not found)."""
    digests = {"image": operator, "trainer.image": trainer, "trainer.ortImage": trainer_ort}
    problems = [f"{k}: {v!r} is not a sha256 digest" for k, v in digests.items() if not DIGEST.match(v)]
    if problems:
        return problems
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
        parent = key.rpartition(".")[0]
        if m.group(2) == "digest" and parent in digests:
            lines[i] = f'{m.group(1)}digest: "{digests[parent]}"\n'
            done.add(parent)
        stack.append((indent, m.group(2)))
    path.write_text("".join(lines))
    return [f"{k}.digest: no such line in {path}" for k in digests if k not in done]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m hack.release", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check")
    c.add_argument("--tag", required=True)
    p = sub.add_parser("pin")
    p.add_argument("--chart", required=True, type=Path)
    p.add_argument("--operator", required=True)
    p.add_argument("--trainer", required=True)
    p.add_argument("--trainer-ort", required=True)
    args = ap.parse_args(argv)
    if args.command == "check":
        problems = check(args.tag)
    else:
        problems = pin(args.chart, operator=args.operator, trainer=args.trainer, trainer_ort=args.trainer_ort)
    for problem in problems:
        print(f"release: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

"""Static checks as part of the unit tier: ruff (lint and format) over the whole tree and mypy --strict on the
operator and the trainer's deciding modules (pyproject.toml lists them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def test_ruff_lint_over_the_whole_tree() -> None:
    proc = subprocess.run([str(BIN / "ruff"), "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_format_over_the_whole_tree() -> None:
    """Formatting is ruff's, everywhere: `ruff format` fixes what this finds."""
    proc = subprocess.run([str(BIN / "ruff"), "format", "--check", "."], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_strict() -> None:
    proc = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


TIERS = ("unit", "integration", "trainer", "ort", "chart", "e2e", "realnodes", "faults")


def test_every_test_file_names_its_tier() -> None:
    """A test module without ``pytestmark = pytest.mark.<tier>`` is silently skipped by `make test-<tier>`."""
    import ast

    missing = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        tree = ast.parse(path.read_text())
        marks = [
            ast.unparse(node.value)
            for node in tree.body
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets)
        ]
        if not any(f"pytest.mark.{tier}" in mark for mark in marks for tier in TIERS):
            missing.append(str(path.relative_to(ROOT)))
    assert missing == [], f"add pytestmark = pytest.mark.<{'|'.join(TIERS)}> to: {missing}"

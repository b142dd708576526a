"""Static checks as part of the unit tier: ruff (lint) and mypy --strict on the operator package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def test_ruff() -> None:
    proc = subprocess.run([str(BIN / "ruff"), "check", "operator", "tests/conftest.py", "tests/integration",
                           "tests/unit", "tests/localcluster", "tests/waiting.py"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_strict() -> None:
    proc = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr

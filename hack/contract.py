"""Copy the trainer's config contract into the operator package: ``trainer-image/src/finetune_trainer/
config.schema.json`` (the source) → ``operator/finetune_operator/contract.schema.json`` (generated, committed).

    python -m hack.contract          # rewrite the operator's copy
    python -m hack.contract --check  # exit 1 when the copy differs from the source (drift gate)

The trainer validates every config against its schema; the operator reads the same file for what it must agree on
(the TrainingArguments fields that ``training.extraArgs`` may not set, and who sets them: ``x-managedBy``). The two
images build from different contexts and the trainer never imports the operator, so the operator ships a copy.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "trainer-image" / "src" / "finetune_trainer" / "config.schema.json"
COPY = ROOT / "operator" / "finetune_operator" / "contract.schema.json"


def main(argv: list[str]) -> int:
    text = SOURCE.read_text(encoding="utf-8")
    if "--check" in argv:
        if not COPY.exists() or COPY.read_text(encoding="utf-8") != text:
            print(
                f"{COPY.relative_to(ROOT)} differs from {SOURCE.relative_to(ROOT)}: run `make generate`",
                file=sys.stderr,
            )
            return 1
        return 0
    COPY.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""``python -m trainers.reward_model``: collect labelled frames, train, report (see ``__init__``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import trainers.reward_model as package
from nets.errors import run_cli
from trainers.config import parse
from trainers.reward_model.train import MODEL_FILE, REPORT_MD, RewardModelConfig, run


def gather_policies(argv: list[str]) -> list[str]:
    """Repeated ``--policy SPEC`` flags -> one ``--policy '[...]'`` JSON list (the config's form)."""
    specs, rest, i = [], [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--policy" and i + 1 < len(argv):
            value, i = argv[i + 1], i + 2
        elif arg.startswith("--policy="):
            value, i = arg.split("=", 1)[1], i + 1
        else:
            rest.append(arg)
            i += 1
            continue
        specs += json.loads(value) if value.lstrip().startswith("[") else [value]
    return rest + (["--policy", json.dumps(specs)] if specs else [])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = gather_policies(list(sys.argv[1:] if argv is None else argv))
    description = (package.__doc__ or "").splitlines()[0]
    cfg: RewardModelConfig = parse({"reward_model": RewardModelConfig}, argv, description=description)[
        "reward_model"
    ]
    report = run(cfg)
    if "held_out_frames" in report:
        print((Path(cfg.out) / REPORT_MD).read_text())
        print(f"reward model: wrote {Path(cfg.out) / MODEL_FILE}")
    return report


if __name__ == "__main__":
    run_cli(main)

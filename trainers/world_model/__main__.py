"""``python -m trainers.world_model``: train a world model on demos, write its bundle (see ``__init__``)."""

from __future__ import annotations

from typing import Any

import trainers.world_model as package
from nets.errors import run_cli
from trainers import parallel
from trainers.config import parse_cli
from trainers.world_model.train import run


def main(argv: list[str] | None = None) -> dict[str, Any]:
    cfg = parse_cli({"world_model": package.WorldModelConfig}, argv, description=package.__doc__)[
        "world_model"
    ]
    record = run(cfg)
    if not parallel.from_env().is_main:  # torchrun: rank 0 reports
        return record
    losses = record["losses"]
    start, end = losses["start"], losses["end"]
    key = "eval/loss" if "eval/loss" in start else "eval/train_loss"
    print(
        f"world model: {record['steps']} steps, {key} {start.get(key, float('nan')):.4f} -> "
        f"{end.get(key, float('nan')):.4f} ({record['wall_s_this_call']:.0f} s); bundle {cfg.out}"
    )
    return record


if __name__ == "__main__":
    run_cli(main)

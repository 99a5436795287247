"""The trainers' one command line: ``--algo`` picks GRPO, PPO, SAC or SIL (self-imitation), every
other flag is a field of ``RunConfig`` or of the algorithm's config, and ``--config FILE`` (a run's
``config.json`` or a recipe under ``configs/``) gives the starting values.

    python -m trainers --config configs/libero_spatial_sil.json         # the main job (README)
    python -m trainers --config configs/libero_spatial_sac.json         # SAC with prior data (RLPD)
    python -m trainers --config configs/libero_spatial_grpo.json --total-steps 100000 --device cuda
    python -m trainers --algo ppo --env CartPole-v1 --total-steps 100000
    python -m trainers --algo sac --env Pendulum-v1 --num-envs 1 --total-steps 20000
    python -m trainers --resume runs/grpo-Libero-Spatial-v0-s0-20261121-071500
    python -m trainers --policy-help pi05     # a policy's options (--policy-kwargs), then exit

Without ``--algo`` the algorithm is the one the config file has a section for (else GRPO); with
it, the config's sections for other algorithms are ignored. ``python -m trainers.grpo``,
``python -m trainers.ppo``, ``python -m trainers.sac`` and ``python -m trainers.sil`` are the same
command with the algorithm fixed.
"""

from __future__ import annotations

import argparse
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nets.errors import BadInput, program_name, run_cli
from trainers.config import describe_fields, parse_cli, read_json
from trainers.grpo.algorithm import GRPOConfig
from trainers.grpo.train import train as train_grpo
from trainers.ppo.algorithm import PPOConfig
from trainers.ppo.train import train as train_ppo
from trainers.run import RunConfig
from trainers.sac.algorithm import SACConfig
from trainers.sac.train import train as train_sac
from trainers.sil.algorithm import SILConfig
from trainers.sil.train import train as train_sil

ALGOS: dict[str, tuple[type, Callable[..., dict[str, float]]]] = {
    "grpo": (GRPOConfig, train_grpo),
    "ppo": (PPOConfig, train_ppo),
    "sac": (SACConfig, train_sac),
    "sil": (SILConfig, train_sil),
}


def config_algo(argv: list[str]) -> str | None:
    """The algorithm section of the ``--config`` file (or of the ``--resume`` run's config)."""
    pre = argparse.ArgumentParser(prog=program_name(), add_help=False, allow_abbrev=False)
    pre.add_argument("--config", type=Path)
    pre.add_argument("--resume", type=Path)
    known, _ = pre.parse_known_args(argv)
    path = known.config
    if path is None and known.resume is not None:
        run_dir = known.resume.parent.parent if known.resume.is_file() else known.resume
        path = run_dir / "config.json"
    if path is None or not path.is_file():
        return None
    sections = [k for k in read_json(path) if k in ALGOS]
    if len(sections) > 1:
        raise BadInput(f"{path} has sections for {sections}: choose one with --algo")
    return sections[0] if sections else None


def policy_help(name: str) -> str:
    """What ``--policy-help NAME`` prints: the keywords ``--policy-kwargs`` gives the policy ``name``.
    A policy with an options type (the pretrained VLAs, ``policies/options.py``) lists its fields
    with their types, defaults and docstrings (and those of its ``KEYWORD_GROUPS``); another one
    shows its class docstring."""
    from policies.options import keyword_groups
    from policies.registry import policy_class, resolve_policy

    cls = policy_class(name)
    where = f"{name} ({resolve_policy(name, None)})"
    options = getattr(cls, "options_type", None)
    if options is None:
        return f"{where} has no options type; its keywords are its constructor's:\n\n{inspect.getdoc(cls)}"
    parts = [f"{where}: --policy-kwargs is a JSON object of these keywords ({options.__name__})", ""]
    parts.append(describe_fields(options))
    for field, (group, defaults) in keyword_groups(options).items():
        parts += ["", f"{group.__name__}'s fields, keywords too (or together as {field}, a JSON object):"]
        parts.append(describe_fields(group, defaults))
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    pre = argparse.ArgumentParser(
        prog=program_name(), add_help=False, allow_abbrev=False
    )  # --policy is not --policy-help
    pre.add_argument("--algo", choices=sorted(ALGOS))
    pre.add_argument("--policy-help", metavar="NAME")
    known, rest = pre.parse_known_args(argv)
    if known.policy_help is not None:
        try:
            print(policy_help(known.policy_help))
        except (ValueError, ImportError, AttributeError) as e:
            raise SystemExit(f"--policy-help {known.policy_help}: {e}") from None
        return {}
    algo = known.algo or config_algo(rest) or "grpo"
    config_cls, train = ALGOS[algo]
    others = [name for name in ALGOS if name != algo]
    description = __doc__ + (
        f"\n--algo {{{','.join(sorted(ALGOS))}}}: the algorithm (now: {algo}).\n--policy-help NAME: the "
        "options --policy-kwargs gives the policy NAME (type, default and meaning of each), then exit."
    )
    configs = parse_cli({"run": RunConfig, algo: config_cls}, rest, description, ignore=others)
    return train(configs["run"], configs[algo])


if __name__ == "__main__":
    run_cli(main)

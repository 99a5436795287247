"""Demonstrations: run a policy (e.g. the scripted LIBERO expert) in a vector env and keep its
episodes in a demos file (format: ``trainers/datasets/demos.py``) for behaviour cloning and prior data.

    python -m trainers.demos --env envs:Libero-Spatial-v0 --policy libero_expert \\
        --env-kwargs '{"task_state": true, "image_size": 64}' --episodes 200 --out demos/spatial.h5

The file appears once complete; a run killed or stopped by an error leaves the episodes written so far
in ``<out>.<pid>.tmp``, a readable demos file (see ``write_demos``). An existing ``--out`` is replaced
only with ``--overwrite``, and only if it is a demos file. Only successful episodes are kept unless
``keep_failures``. A ``(D,)`` action space is stored with K = 1. Starts: envs with ``initial_frames``
(this project's) go through a seeded permutation of their frame ids, so ``--episodes len(frames)``
covers every (task, init state) once; other envs are seeded per round.

The file format's names (``Episode``, ``Demos``, ``write_demos``, ``read_demos``, ``check_format``,
``FORMAT``, ``VERSION``) live in ``trainers.datasets.demos`` and are importable from here as before.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from nets.errors import BadInput, run_cli
from nets.files import check_output
from policies.base import ActionChunkPolicy
from trainers.datasets.demos import (
    FORMAT,
    VERSION,
    Demos,
    Episode,
    check_format,
    is_demos_file,
    read_demos,
    write_demos,
)
from trainers.env_contract import episode_success, initial_frames, start_options
from trainers.rollout import Collector

__all__ = [
    "FORMAT",
    "VERSION",
    "DemoConfig",
    "Demos",
    "Episode",
    "check_format",
    "collect_episodes",
    "main",
    "read_demos",
    "write_demos",
]


def collect_episodes(
    env: gym.vector.VectorEnv,
    policy: ActionChunkPolicy,
    num_episodes: int,
    *,
    seed: int = 0,
    deterministic: bool = True,
    frame_ids: Sequence[int] | None = None,
    max_steps: int = 100_000,
    info_keys: Sequence[str] = (),
) -> Iterator[Episode]:
    """Yield ``num_episodes`` episodes (successful or not), one per env per round.

    Every round resets all envs and records each env's first episode: the observation before each
    step, the actions sent, the executed sub-steps, the observation after the last step
    (``final_obs``) and, for each of ``info_keys``, the env's entry of ``info[key]`` at every step
    (``Episode.info``; e.g. ``chunk_success``, or ``frames`` of an env with ``record_frames``). Envs
    with ``initial_frames`` start from ``frame_ids`` in order (default: a permutation of all ids
    drawn with ``seed``). A round runs at most ``max_steps`` policy steps; an env whose episode has
    not ended by then is an error.
    """
    n = env.num_envs
    frames = initial_frames(env)
    order = None
    if frame_ids is not None:
        if not frames:
            raise BadInput("frame_ids needs an env with initial_frames (this project's envs)")
        order = np.asarray(frame_ids, np.int64)
    elif frames:
        order = np.random.default_rng(seed).permutation(len(frames))
    # each env's first episode per round; finished envs wait (Disabled) or are ignored (autoreset)
    collector = Collector(env, policy, bootstrap="none", reset_finished=False, clip_actions=False)
    done_count, rnd = 0, 0
    while done_count < num_episodes:
        ids = None
        if order is not None:
            ids = [int(order[(rnd * n + i) % len(order)]) for i in range(n)]
        obs = collector.reset(seed=seed + rnd, options=start_options(ids) if ids is not None else None)
        instructions = (
            list(obs["instruction"]) if isinstance(obs, dict) and "instruction" in obs else [""] * n
        )
        infos: list[dict[str, Any]] = []
        rollout = collector.collect(
            max_steps,
            deterministic=deterministic,
            until_all_done=True,
            record_obs=True,
            on_step=infos.append if info_keys else None,
        )
        arrays = [
            {k: np.asarray(v) for k, v in o.items() if k != "instruction"}
            if isinstance(o, dict)
            else {"obs": np.asarray(o)}
            for o in rollout.observations or []
        ]
        dones = rollout.dones.numpy()
        unfinished = [i for i in range(n) if not dones[:, i].any()]
        if unfinished:
            raise RuntimeError(
                f"collect_episodes: envs {unfinished} did not finish an episode in max_steps={max_steps} "
                "policy steps (an env without a time limit? wrap it in gymnasium's TimeLimit)"
            )
        for i in range(min(n, num_episodes - done_count)):
            end = int(np.flatnonzero(dones[:, i])[0])  # the step that ended env i's first episode
            stats = next((ep for ep in rollout.episodes if int(ep["env"]) == i), {})
            frame = ids[i] if ids is not None else -1
            final = (rollout.final_observations or {}).get((end, i))
            yield Episode(
                obs={key: np.stack([a[key][i] for a in arrays[: end + 1]]) for key in arrays[0]},
                actions=rollout.actions[: end + 1, i].numpy(),
                valid=rollout.valid[: end + 1, i].numpy(),
                rewards=rollout.rewards[: end + 1, i].numpy(),
                instruction=str(instructions[i]),
                task=frames[frame].task if ids is not None else "",
                initial_frame=frame,
                success=episode_success(stats, bool(rollout.terminated[end, i])),
                final_obs=_arrays(final) if final is not None else None,
                info={key: [_env_entry(info, key, i) for info in infos[: end + 1]] for key in info_keys},
            )
            done_count += 1
        rnd += 1


def _arrays(obs: Any) -> dict[str, np.ndarray]:
    """One env's observation as ``{key: array}`` (text keys dropped; a plain array is ``obs``)."""
    if isinstance(obs, dict):
        return {k: np.asarray(v) for k, v in obs.items() if k != "instruction"}
    return {"obs": np.asarray(obs)}


def _env_entry(info: dict[str, Any], key: str, i: int) -> Any:
    """Env ``i``'s entry of ``info[key]``, None when absent or masked out by ``info["_" + key]``; a
    nested dict (``final_info``, ``episode``) gives a dict of env ``i``'s entries."""
    if key not in info or ("_" + key in info and not np.asarray(info["_" + key])[i]):
        return None
    value = info[key]
    if isinstance(value, dict):
        return {k: _env_entry(value, k, i) for k in value if not k.startswith("_")}
    return value[i]


@dataclass
class DemoConfig:
    """Settings of ``python -m trainers.demos``."""

    env: str = "envs:Libero-Spatial-v0"
    """a gymnasium id; "module:Env-v0" imports module first"""
    env_kwargs: dict[str, Any] = field(default_factory=lambda: {"task_state": True, "image_size": 64})
    """JSON object passed to the env"""
    num_envs: int = 4
    """envs collecting in parallel (one episode each per round)"""
    policy: str = "libero_expert"
    """a policy name (see policies.registry), or use checkpoint"""
    policy_kwargs: dict[str, Any] = field(default_factory=dict)
    """JSON object: the policy's arguments"""
    checkpoint: str | None = None
    """a run directory or checkpoint file: its trained policy"""
    episodes: int = 100
    """episodes run (kept: the successful ones, unless keep_failures)"""
    keep_failures: bool = False
    """also keep the episodes that did not succeed"""
    deterministic: bool = True
    """the policy's deterministic actions (False: sampled)"""
    seed: int = 0
    """seeds the starts (the order of the initial frames, else each round's reset) and the policy's
    sampling"""
    out: str = "demos/demos.h5"
    """the demos file written"""
    overwrite: bool = False
    """replace an existing --out (only a vla-gym demos file is replaced)"""


def main(argv: list[str] | None = None) -> Path:
    from policies.registry import make_policy, resolve_policy
    from trainers.checkpoint import load_policy
    from trainers.config import parse
    from trainers.env_factory import make_vec_env

    cfg: DemoConfig = parse({"demos": DemoConfig}, argv, description=__doc__.splitlines()[0])["demos"]
    check_output(cfg.out, overwrite=cfg.overwrite, ours=is_demos_file, what="a demos file")
    env = make_vec_env(cfg.env, cfg.num_envs, cfg.env_kwargs, autoreset="disabled_native")
    obs_space, act_space = env.single_observation_space, env.single_action_space
    if cfg.checkpoint:
        policy = load_policy(cfg.checkpoint, obs_space, act_space)
        name = f"checkpoint:{cfg.checkpoint}"
    else:
        policy = make_policy(cfg.policy, obs_space, act_space, **cfg.policy_kwargs)
        name = resolve_policy(cfg.policy, act_space)
    policy.eval()
    policy.seed(cfg.seed)
    meta: dict[str, Any] = {
        "env": cfg.env,
        "env_kwargs": cfg.env_kwargs,
        "policy": name,
        "policy_kwargs": cfg.policy_kwargs,
        "seed": cfg.seed,
        "episodes_run": 0,
        "episodes_successful": 0,
    }

    def kept() -> Iterator[Episode]:
        for ep in collect_episodes(env, policy, cfg.episodes, seed=cfg.seed, deterministic=cfg.deterministic):
            meta["episodes_run"] += 1
            meta["episodes_successful"] += int(ep.success)
            run, ok = meta["episodes_run"], meta["episodes_successful"]
            print(f"\rdemos: {run}/{cfg.episodes} episodes, {ok} successful", end="", flush=True)
            if ep.success or cfg.keep_failures:
                meta["chunk_size"], meta["action_dim"] = (int(v) for v in ep.actions.shape[1:])
                yield ep

    try:
        path = write_demos(cfg.out, kept(), meta)
    finally:
        env.close()
    rate = meta["episodes_successful"] / max(meta["episodes_run"], 1)
    print(f"\ndemos: wrote {path} (success rate {rate:.1%})")
    return path


if __name__ == "__main__":
    run_cli(main)

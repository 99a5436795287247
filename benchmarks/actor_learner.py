"""Where a SAC or self-imitation recipe's core-time goes: the env alone, the learner alone, the sync
loop and the async actor-learner, side by side in one run.

    python -m benchmarks.actor_learner --recipe configs/libero_spatial_sil.json   # the main job
    python -m benchmarks.actor_learner --recipe configs/libero_spatial_dsrl.json --seconds 120
    python -m benchmarks.actor_learner --rows updates                   # update cost only (no env)
    python -m benchmarks.actor_learner --settings '{"gradient_steps": 32, "actor_every": 8}' \
        --async-variants '{"nice 19": {"sac": {"actor_nice": 19}}}'      # other settings, more rows

Rows (the recipe's env, envs, start policy and algorithm settings, its ``sac`` or ``sil`` entry;
``--seconds`` of measurement each, after a warm-up that excludes start-up and ``learning_starts``):

* ``env alone``: the recipe's vector env driven by its start policy (sampled chunks, no learning);
* ``learner alone``: the recipe's update on batches of its prior data (SAC: or of random rows when
  it has none), on ``--learner-threads`` torch threads: milliseconds per update; for SAC also with
  the actor stepped once per round of ``gradient_steps`` critic steps (``actor_every``);
* ``sync loop`` / ``async loop``: ``python -m trainers --config RECIPE --loop sync|async``.

Columns: env steps/s, updates/s, updates per stored chunk (in the window: SAC's replay rows,
self-imitation's kept chunk-steps of successful episodes), and the share of the
machine's core-time (``cores x wall``) that the processes spent on the CPU (``/proc``: user + system
time of the process tree): the learner's process, and everything that steps envs (the simulator
workers, and the actor process in the async loop; in the sync loop the learner's process also
drives the envs, so its time counts as "learner + driver"). Idle = the rest.

Writes ``actor_learner.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.report import table, write_json
from nets.errors import BadInput, program_name, run_cli
from trainers.callbacks import Callback

CLOCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds: user + system) of a live process, from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / CLOCK


def cpu_times(root: int) -> dict[int, float]:
    """CPU seconds of ``root`` and every live descendant, by pid."""
    table_: dict[int, tuple[int, float]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (s := _stat(int(entry.name))) is not None:
            table_[int(entry.name)] = s
    out, frontier = {}, [root]
    while frontier:
        pid = frontier.pop()
        if pid in table_:
            out[pid] = table_[pid][1]
            frontier += [p for p, (ppid, _) in table_.items() if ppid == pid]
    return out


class Window:
    """CPU seconds of the learner's process and of the rest of its tree between ``start`` and
    ``stop`` (processes alive at both ends)."""

    def start(self) -> None:
        self.t0, self.cpu0 = time.perf_counter(), cpu_times(os.getpid())

    def stop(self) -> dict[str, float]:
        wall, cpu1 = time.perf_counter() - self.t0, cpu_times(os.getpid())
        me = os.getpid()
        learner = cpu1.get(me, 0.0) - self.cpu0.get(me, 0.0)
        others = sum(v - self.cpu0[p] for p, v in cpu1.items() if p != me and p in self.cpu0)
        return {"wall_s": wall, "learner_cpu_s": learner, "env_cpu_s": others}


def _row(name: str, w: dict[str, float], env_steps: float, updates: float, chunks: float) -> dict[str, Any]:
    cores = os.cpu_count() or 1
    machine = cores * w["wall_s"]
    return {
        "row": name,
        "env_steps_per_s": env_steps / w["wall_s"],
        "updates_per_s": updates / w["wall_s"],
        "updates_per_chunk": updates / chunks if chunks else float("nan"),
        "learner_share": w["learner_cpu_s"] / machine,
        "env_share": w["env_cpu_s"] / machine,
        "busy_share": (w["learner_cpu_s"] + w["env_cpu_s"]) / machine,
        **w,
    }


# ---------------------------------------------------------------------- rows
def env_alone(recipe: dict, seconds: float) -> dict[str, Any]:
    """The recipe's env driven by its start policy (sampled), no learning."""
    from trainers.checkpoint import build_policy
    from trainers.rollout import Collector
    from trainers.run_config import RunConfig

    run = RunConfig(**{k: v for k, v in recipe["run"].items() if k in ("env", "env_kwargs", "num_envs")})
    env = run.make_env(run.num_envs, autoreset="same_step")
    try:
        spec = recipe["run"]
        policy, _ = build_policy(
            spec.get("policy", "auto"),
            spec.get("policy_kwargs", {}),
            env.single_observation_space,
            env.single_action_space,
            init_policy=spec.get("init_policy"),
        )
        collector = Collector(env, policy)
        collector.reset(seed=0)
        for _ in range(3):  # warm-up
            collector.collect(1)
        window, steps, chunks = Window(), 0, 0
        window.start()
        while time.perf_counter() - window.t0 < seconds:
            rollout = collector.collect(1)
            steps += int(rollout.valid.sum())
            chunks += int(rollout.valid.any(-1).sum())
        return _row("env alone", window.stop(), steps, 0, chunks)
    finally:
        env.close()


def learner_alone(recipe: dict, seconds: float, threads: int, actor_every: int | None) -> dict[str, Any]:
    """The recipe's SAC update, timed on batches of its prior data (or random rows)."""
    from policies.torso_policy import box_chunk_shape
    from trainers.checkpoint import build_policy
    from trainers.optim import BadUpdateGuard
    from trainers.run_config import RunConfig
    from trainers.sac.algorithm import Learner, SACConfig, make_optimizer, sac_update
    from trainers.sac.prior import load_prior
    from trainers.sac.replay import Batch, ReplayBuffer, Transition, obs_row

    settings = dict(recipe["sac"])
    if actor_every is not None:
        settings["actor_every"] = actor_every
    config = SACConfig(**settings)
    spec = recipe["run"]
    run = RunConfig(env=spec["env"], env_kwargs=spec.get("env_kwargs", {}), num_envs=1)
    env = run.make_env(1, autoreset="same_step")
    try:
        obs, _ = env.reset(seed=0)
        obs_space, act_space = env.single_observation_space, env.single_action_space
    finally:
        env.close()
    policy, _ = build_policy(
        spec.get("policy", "auto"), spec.get("policy_kwargs", {}), obs_space, act_space,
        init_policy=spec.get("init_policy"),
    )  # fmt: skip
    sac_space = getattr(policy, "sac_action_space", act_space)
    learner = Learner(obs_space, sac_space, config, getattr(policy, "obs_norm", "off"))
    optimizer = make_optimizer(policy, learner, config)
    buffer = ReplayBuffer(obs_space, box_chunk_shape(sac_space), 4096)
    rng = np.random.default_rng(0)
    row = obs_row(obs, 0)
    low, high = np.asarray(sac_space.low), np.asarray(sac_space.high)
    buffer.add(
        [
            Transition(row, rng.uniform(low, high).astype(np.float32), float(rng.random() < 0.1), 0.96, row)
            for _ in range(4096)
        ]
    )
    prior = None
    if config.prior_data:
        prior = load_prior(
            config.prior_data, obs_space, box_chunk_shape(act_space), config.gamma, config.n_step
        )
    generator, guard = torch.Generator().manual_seed(0), BadUpdateGuard()
    online = config.batch_size if prior is None else round(config.batch_size * (1 - config.prior_ratio))
    entropy = -float(np.prod(sac_space.shape))
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    count = 0

    def update() -> None:
        nonlocal count
        batch = buffer.sample(online, generator)
        if prior is not None:
            batch = Batch.cat(batch, prior.sample(config.batch_size - online, generator))
        sac_update(
            policy,
            learner,
            optimizer,
            batch,
            config,
            generator,
            guard,
            entropy,
            count % config.actor_every == 0,
        )
        count += 1

    try:
        for _ in range(10):
            update()
        window, start = Window(), count
        window.start()
        while time.perf_counter() - window.t0 < seconds:
            update()
        w = window.stop()
    finally:
        torch.set_num_threads(previous)
    name = f"learner alone, {threads} thread{'s' * (threads > 1)}, actor_every {config.actor_every}"
    out = _row(name, w, 0, count - start, 0)
    out["ms_per_update"] = 1000 * w["wall_s"] / (count - start)
    return out


def sil_learner_alone(recipe: dict, seconds: float, threads: int) -> dict[str, Any]:
    """The recipe's self-imitation update, timed on batches of its prior data (no successes yet: the
    whole batch from the prior, the same size and cost as a mixed one), or of kept rows of the
    first observation with uniform actions when it has none."""
    from trainers.checkpoint import build_policy
    from trainers.env_contract import chunk_size
    from trainers.optim import BadUpdateGuard, WeightEMA
    from trainers.run_config import RunConfig
    from trainers.sac.replay import obs_row
    from trainers.sil.algorithm import ChunkRows, SILConfig, sil_update
    from trainers.sil.train import load_prior

    config = SILConfig(**recipe["sil"])
    spec = recipe["run"]
    run = RunConfig(env=spec["env"], env_kwargs=spec.get("env_kwargs", {}), num_envs=1)
    env = run.make_env(1, autoreset="same_step")
    try:
        policy, _ = build_policy(
            spec.get("policy", "auto"), spec.get("policy_kwargs", {}), env.single_observation_space,
            env.single_action_space, init_policy=spec.get("init_policy"),
        )  # fmt: skip
        k = chunk_size(env) or 1
        kept = ChunkRows(4096)
        if config.prior_data:
            prior = load_prior(config.prior_data, policy, env.single_observation_space, k)
        else:
            prior, (obs, _) = None, env.reset(seed=0)
            space, rng = env.single_action_space, np.random.default_rng(0)
            uniform = rng.uniform(space.low, space.high, (4096, *space.shape)).astype(np.float32)
            kept.add([(obs_row(obs, 0), a.reshape(k, -1), np.ones(k, bool), 0) for a in uniform])
    finally:
        env.close()
    optimizer = torch.optim.Adam(policy.parameters(), lr=config.learning_rate)
    ema = WeightEMA(policy, config.ema_decay) if config.ema_decay else None
    rng, guard = np.random.default_rng(0), BadUpdateGuard()
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    policy.train()
    try:
        for _ in range(5):
            sil_update(policy, optimizer, prior, kept, config, rng, guard, ema)
        window, count = Window(), 0
        window.start()
        while time.perf_counter() - window.t0 < seconds:
            sil_update(policy, optimizer, prior, kept, config, rng, guard, ema)
            count += 1
        w = window.stop()
    finally:
        torch.set_num_threads(previous)
    out = _row(f"learner alone, {threads} thread{'s' * (threads > 1)}", w, 0, count, 0)
    out["ms_per_update"] = 1000 * w["wall_s"] / count
    return out


class Meter(Callback):
    """The window from the end of iteration ``skip`` to the last iteration: CPU times and the
    counters (env steps, updates, stored chunks) at both ends."""

    def __init__(self, skip: int) -> None:
        self.skip, self.window, self.first, self.last = skip, Window(), None, None

    def on_iteration_end(self, run: Any, row: dict[str, Any]) -> None:
        stored = row.get("train/buffer_size", row.get("train/success_rows", 0.0))
        point = (run.counters["env_steps"], row.get("train/updates", 0.0), stored)
        if run.counters["iteration"] == self.skip:
            self.window.start()
            self.first = point
        elif self.first is not None:
            self.last, self.result = point, self.window.stop()


def loop(
    recipe: dict,
    mode: str,
    iterations: int,
    skip: int,
    out: Path,
    name: str = "",
    changes: dict | None = None,
) -> dict[str, Any]:
    """The recipe's trainer with ``loop`` ``mode`` for ``skip + iterations`` iterations; ``changes``:
    ``{"run": {...}, "sac" or "sil": {...}}`` settings over the recipe's."""
    changes = changes or {}
    from trainers.run_config import RunConfig

    algo = algo_of(recipe)
    if algo == "sil":
        from trainers.sil.algorithm import SILConfig as Config
        from trainers.sil.train import train

        settings = {**recipe["sil"], **changes.get("sil", {})}
    else:
        from trainers.sac.algorithm import SACConfig as Config
        from trainers.sac.train import train

        settings = {**recipe["sac"], "offline_steps": 0, "steps_per_iteration": 4, **changes.get("sac", {})}

    cb = Meter(skip)
    run = {
        **recipe["run"],
        "loop": mode,
        "total_steps": 10**9,
        "max_iterations": skip + iterations,
        "eval_at_start": False,
        "eval_every": -1,
        "checkpoint_every": 0,
        "video": False,
        "tensorboard": False,
        "progress": False,
        "run_dir": str(out / f"{mode}-loop{len(list(out.iterdir()))}"),
        "overwrite": True,
        **changes.get("run", {}),
    }
    train(RunConfig(**run), Config(**settings), [cb])
    (s0, u0, c0), (s1, u1, c1) = cb.first, cb.last
    return _row(f"{mode} loop{name}", cb.result, s1 - s0, u1 - u0, c1 - c0)


def algo_of(recipe: dict) -> str:
    """``sil`` or ``sac``: the recipe's algorithm settings entry."""
    found = [name for name in ("sac", "sil") if name in recipe]
    if len(found) != 1:
        raise BadInput(f"the recipe must have one of the entries 'sac' or 'sil', got {sorted(recipe)}")
    return found[0]


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(prog=program_name(), description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="configs/libero_spatial_sac.json")
    parser.add_argument("--seconds", type=float, default=60.0, help="measurement per alone-row")
    parser.add_argument(
        "--iterations", type=int, default=10, help="measured iterations (SAC: 4 vector steps each)"
    )
    parser.add_argument("--rows", nargs="+", default=["env", "updates", "sync", "async"],
                        choices=["env", "updates", "sync", "async"])  # fmt: skip
    parser.add_argument("--learner-threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument(
        "--settings",
        "--sac",
        type=json.loads,
        default={},
        help="the algorithm's settings over the recipe's, for every row (JSON)",
    )
    parser.add_argument(
        "--async-variants",
        type=json.loads,
        default={},
        help='more async rows: JSON {"name": {"run": {...}, "sac" or "sil": {...}}} over the recipe\'s '
        'settings, e.g. {"nice 19": {"sac": {"actor_nice": 19}}}',
    )
    parser.add_argument("--out", default="runs/benchmarks/actor_learner")
    args = parser.parse_args(argv)
    import envs  # noqa: F401  (registers the ids)

    recipe = json.loads(Path(args.recipe).read_text())
    algo = algo_of(recipe)
    recipe[algo] = {**recipe[algo], **args.settings}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    if "env" in args.rows:
        rows.append(env_alone(recipe, args.seconds))
    if "updates" in args.rows and algo == "sil":
        for threads in args.learner_threads:
            rows.append(sil_learner_alone(recipe, args.seconds / 2, threads))
    elif "updates" in args.rows:
        g = recipe["sac"].get("gradient_steps", 1)
        for threads in args.learner_threads:
            for every in sorted({recipe["sac"].get("actor_every", 1), g}):
                rows.append(learner_alone(recipe, args.seconds / 2, threads, every))
    # enough vector steps first for the buffer to reach learning_starts (SAC)
    per_step = recipe["run"]["num_envs"]
    skip = 2 if algo == "sil" else -(-recipe["sac"].get("learning_starts", 100) // (per_step * 4)) + 2
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        for mode in ("sync", "async"):
            if mode in args.rows:
                rows.append(loop(recipe, mode, args.iterations, skip, Path(tmp)))
        for name, changes in args.async_variants.items():
            rows.append(loop(recipe, "async", args.iterations, skip, Path(tmp), f", {name}", changes))
    header = ["row", "env steps/s", "updates/s", "ms/update", "updates/chunk", "learner CPU", "env CPU",
              "busy", "wall s"]  # fmt: skip
    print(
        table(
            header,
            [
                [
                    r["row"],
                    r["env_steps_per_s"],
                    r["updates_per_s"],
                    r.get("ms_per_update", ""),
                    r["updates_per_chunk"],
                    f"{r['learner_share']:.0%}",
                    f"{r['env_share']:.0%}",
                    f"{r['busy_share']:.0%}",
                    r["wall_s"],
                ]
                for r in rows
            ],  # fmt: skip
            title=f"{args.recipe}: core-time shares of {os.cpu_count()} cores",
        )
    )
    write_json(out / "actor_learner.json", {"recipe": args.recipe, "rows": rows})
    return rows


if __name__ == "__main__":
    run_cli(main)

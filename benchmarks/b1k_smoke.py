"""Smoke test of the BEHAVIOR-1K env on a real OmniGibson (an RTX GPU with Isaac Sim and the 2025
challenge data; see ``envs/b1k/omnigibson_backend.py`` for the install).

    python -m benchmarks.b1k_smoke [--task turning_on_radio] [--num-envs 2] [--chunks 3] [--instances 0 1]

Builds ``B1K-<Task>-v0``, resets every env to saved instances, runs a few chunks holding the start
pose (the reset state's joint targets, zero base velocity), and prints per phase the time and what
came back: observation shapes and value ranges, rewards, done flags, success and q-score; it also
saves the first head images as PNGs. Every check here passes on the fake backend of the tests; this
script is what tells whether the adapter's OmniGibson calls are right. Without OmniGibson it prints
what is missing and exits 0, so it can run anywhere.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

import envs  # noqa: F401  (registers the ids)
from benchmarks.report import table, write_json
from envs.b1k.layout import ACTION_PARTS, PROPRIO_SLICES
from envs.b1k.omnigibson_backend import B1KUnavailableError
from envs.b1k.tasks import task_env_id
from nets.errors import program_name, run_cli


def hold_actions(state: np.ndarray, num_envs: int, chunk: int) -> np.ndarray:
    """Chunks that keep the robot where it is: joint targets from the 23-D state, base still,
    grippers as they are (state opening 0..0.05 m -> command -1..1)."""
    a = np.zeros((num_envs, chunk, 23), np.float32)
    a[..., ACTION_PARTS["torso"]] = state[:, None, 3:7]
    a[..., ACTION_PARTS["left_arm"]] = state[:, None, 7:14]
    a[..., ACTION_PARTS["right_arm"]] = state[:, None, 14:21]
    a[..., 14] = np.clip(state[:, None, 21] / 0.05 * 2 - 1, -1, 1)
    a[..., 22] = np.clip(state[:, None, 22] / 0.05 * 2 - 1, -1, 1)
    return a


def main(argv: list[str] | None = None, backend=None) -> dict | None:
    """Run the smoke test (``backend``: a stand-in simulator, for the tests of this script)."""
    parser = argparse.ArgumentParser(
        prog=program_name(), description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--task", default="turning_on_radio")
    parser.add_argument("--num-envs", type=int, default=2)
    parser.add_argument("--chunks", type=int, default=3)
    parser.add_argument("--chunk-size", type=int, default=10)
    parser.add_argument("--instances", type=int, nargs="*", default=None)
    parser.add_argument("--out", default="runs/benchmarks/b1k_smoke")
    args = parser.parse_args(argv)
    rows = []
    start = time.perf_counter()
    try:
        env = gym.make_vec(
            task_env_id(args.task),
            num_envs=args.num_envs,
            chunk_size=args.chunk_size,
            instances=args.instances,
            **({"backend": backend} if backend is not None else {}),
        )
    except B1KUnavailableError as e:
        print(f"b1k_smoke: skipped, {e}")
        return None
    rows.append(
        ["build (load scenes)", f"{time.perf_counter() - start:.1f}", f"{args.num_envs} envs of {args.task}"]
    )
    start = time.perf_counter()
    obs, info = env.reset(seed=0, options={"initial_frames": list(range(args.num_envs))})
    frames = env.unwrapped.current_frames()
    rows.append(["reset to instances", f"{time.perf_counter() - start:.1f}",
                 f"instances {[f.meta['instance_id'] for f in frames]}"])  # fmt: skip
    shapes = {k: (v.shape, str(v.dtype)) for k, v in obs.items() if k != "instruction"}
    rows.append(["observation", "", f"{shapes}; instruction {obs['instruction'][0]!r}"])
    rows.append(
        ["proprio (23-D state)", "", np.array2string(obs["proprio"][0], precision=3, max_line_width=200)]
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import imageio.v3 as iio

    for i, frame in enumerate(frames):
        iio.imwrite(out / f"head_{i}.png", frame.image)
    for c in range(args.chunks):
        start = time.perf_counter()
        obs, reward, terminated, truncated, info = env.step(
            hold_actions(obs["proprio"], args.num_envs, args.chunk_size)
        )
        elapsed = time.perf_counter() - start
        episode = info.get("episode", {})
        detail = f"reward {reward.round(3).tolist()}, terminated {terminated.tolist()}"
        detail += f", truncated {truncated.tolist()}"
        if "q_score" in episode:
            detail += f", q_score {episode['q_score'].tolist()}"
        rows.append([f"chunk {c} ({args.chunk_size} steps)", f"{elapsed:.2f}", detail])
    env.close()
    print(table(["phase", "seconds", "what came back"], rows, title=f"B1K smoke: {args.task}"))
    print(f"head images: {out}/head_*.png; proprio slices used: {sorted(PROPRIO_SLICES)}")
    result = {"task": args.task, "rows": rows, "last_proprio": obs["proprio"].tolist()}
    write_json(out / "b1k_smoke.json", result)
    return result


if __name__ == "__main__":
    run_cli(main)

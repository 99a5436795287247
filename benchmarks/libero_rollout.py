"""The main job, for now: roll out a policy on several LIBERO-Spatial tasks, print a table, write an mp4.

Each env of the vector env runs a different task from its first init state, one episode each, with
a random policy (smoothed uniform noise). A later issue replaces this job with RL training.

    python -m benchmarks.libero_rollout [--tasks 0 1 2 3] [--num-envs 2] [--video runs/rollout.mp4]
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def run(
    tasks: list[int], num_envs: int, chunk_size: int, image_size: int, video: str | None, seed: int
) -> list:
    from envs.core.video import tile, write_mp4
    from envs.libero.env import LiberoVectorEnv

    env = LiberoVectorEnv(
        "spatial", num_envs, chunk_size=chunk_size, image_size=image_size, autoreset_mode="Disabled"
    )
    env.record_frames = video is not None
    rng = np.random.default_rng(seed)
    rows, videos = [], []
    try:
        for start in range(0, len(tasks), num_envs):
            batch = tasks[start : start + num_envs]
            batch = batch + [batch[-1]] * (num_envs - len(batch))  # pad the last batch
            obs, _ = env.reset(seed=seed, options={"initial_frames": [t * 50 for t in batch]})
            done = np.zeros(num_envs, bool)
            steps = np.zeros(num_envs, int)
            success = np.zeros(num_envs, bool)
            frames: list[list[np.ndarray]] = [[obs["image"][i]] for i in range(num_envs)]
            action = np.zeros(env.action_space.shape, np.float32)
            t0 = time.perf_counter()
            while not done.all():
                noise = rng.uniform(-1, 1, env.action_space.shape).astype(np.float32)
                action = np.clip(0.8 * action + 0.2 * noise, -1, 1)
                obs, _, term, trunc, info = env.step(action)
                for i in np.flatnonzero(info["_episode"]) if "_episode" in info else []:
                    steps[i], success[i] = info["episode"]["length"][i], info["episode"]["success"][i]
                for i in np.flatnonzero(~done):
                    frames[i].extend(info["frames"][i] if env.record_frames else [obs["image"][i]])
                done |= term | trunc
            wall = time.perf_counter() - t0
            for i, task in enumerate(tasks[start : start + num_envs]):
                frame = env.initial_frames[task * 50]
                rows.append((task, frame.instruction, int(steps[i]), bool(success[i]), steps.sum() / wall))
            videos.append(frames)
    finally:
        env.close()
    if video:
        clips = [clip for batch in videos for clip in batch][: len(tasks)]
        length = max(len(c) for c in clips)
        grid = [tile([c[min(t, len(c) - 1)] for c in clips]) for t in range(length)]
        print(f"video: {write_mp4(video, grid)} ({length} frames)")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--num-envs", type=int, default=2)
    parser.add_argument("--chunk-size", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--video", default="runs/libero_rollout.mp4", help="mp4 path ('' for none)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rows = run(args.tasks, args.num_envs, args.chunk_size, args.image_size, args.video or None, args.seed)
    print("\nsteps/s counts the steps of all envs of a batch")
    print(f"{'task':>4}  {'steps':>5}  {'success':>7}  {'steps/s':>7}  instruction")
    for task, text, steps, success, sps in rows:
        print(f"{task:>4}  {steps:>5}  {str(success):>7}  {sps:>7.1f}  {text}")
    print(f"success rate: {np.mean([r[3] for r in rows]):.2f} over {len(rows)} episodes (random policy)")


if __name__ == "__main__":
    main()

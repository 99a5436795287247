"""The same policy from the same initial frames in the LIBERO simulator and in a world-model env:
success side by side, per-frame PSNR / SSIM between imagined and simulated frames, steps/s of each.

    python -m benchmarks.wm_vs_sim                                       # tiny random Cosmos bundle
    python -m benchmarks.wm_vs_sim --wm OpenSoraWM-LiberoSpatial-v0 --model-dir /data/opensora \\
        --checkpoint runs/my-image-policy --episodes 50 --device cuda
    python -m benchmarks.wm_vs_sim --wm OpenSoraWM-LiberoSpatial-v0 --model-dir runs/wm/bundle \\
        --wm-env-kwargs '{"image_size": [64, 64]}' --expert-noise 1.0 --episodes 20  # reward model agreement

Initial frames are exported from the simulator (``current_frames()`` after a reset to
``--episodes`` (task, init state) pairs spread over the suite) and the world model starts from
them. Three runs, ``num_envs = --episodes``:

* ``sim``: the policy closed-loop in LIBERO (``sim_env_kwargs()``: the world model's observation
  keys, frame size and chunk), every sub-step frame recorded;
* ``wm``: the policy closed-loop in the world model (its own success: the reward model);
* ``wm open-loop``: the sim run's actions replayed in the world model, frame for frame, which is
  what PSNR / SSIM compare (a closed-loop run diverges as soon as the two differ).

All three run through the trainers' ``Collector`` (one rollout loop, as training and evaluation).

**Agreement**: for the same action sequences, does the world model's success (its reward model on the
imagined frames) say what the simulator's says? Per episode, ``sim`` against ``wm open-loop``: both,
simulator only, world model only, neither, and the share that agree with a 95% Wilson interval. A
world-model success counts only within the simulator episode's chunks (the replay pads with zero
actions after them). ``--expert-noise X`` drives the simulator with the scripted expert instead
(``task_state`` added to the simulator's observations; chunks of one action, the expert's own rate, at
which its demos were recorded: it holds one action for a whole chunk; the world model replays them in its
own chunks; translation noise of std X, so that some episodes fail) and skips the closed-loop world-model
run, which the expert cannot drive.

The policy is ``--checkpoint`` (a run or policy file whose observation keys the world model has:
image and instruction) or a fresh seeded Gaussian policy: with random weights, tiny or real, the
table measures the loop and the imagination fidelity, not a success rate worth reading. Writes
``wm_vs_sim.json`` and ``wm_vs_sim.png`` (PSNR and SSIM against frame index) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.report import plot_lines, table, write_json
from nets.errors import program_name, run_cli
from policies.base import ActionChunk
from trainers.rollout import Collector


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """Peak signal-to-noise ratio of two uint8 images, in dB (inf when identical)."""
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def ssim(a: np.ndarray, b: np.ndarray, window: int = 11, sigma: float = 1.5) -> float:
    """Structural similarity of two HxWx3 uint8 images (Wang et al. 2004: Gaussian window, K1 0.01,
    K2 0.03, mean over pixels and channels; the window shrinks for images smaller than it)."""
    x = torch.as_tensor(a, dtype=torch.float64).permute(2, 0, 1)[None]
    y = torch.as_tensor(b, dtype=torch.float64).permute(2, 0, 1)[None]
    size = min(window, x.shape[-1], x.shape[-2])
    size -= 1 - size % 2  # odd
    grid = torch.arange(size, dtype=torch.float64) - size // 2
    g = torch.exp(-(grid**2) / (2 * sigma**2))
    kernel = (g[:, None] * g[None, :] / g.sum() ** 2).expand(3, 1, size, size)

    def blur(t: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.conv2d(t, kernel, groups=3)

    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    mx, my = blur(x), blur(y)
    vx, vy, cxy = blur(x * x) - mx**2, blur(y * y) - my**2, blur(x * y) - mx * my
    s = ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx**2 + my**2 + c1) * (vx + vy + c2))
    return float(s.mean())


class Replay:
    """Plays recorded actions, ``actions[i]`` ``[T, D]`` (one per sub-step) for env i, cut into the
    env's chunks (``shape`` ``(N, K, D)``), then zeros: the open-loop run's stand-in for a policy."""

    def __init__(self, actions: list[np.ndarray], shape: tuple[int, ...]) -> None:
        self.actions, self.shape, self.t = actions, shape, 0

    def act(self, obs: Any, deterministic: bool = True) -> ActionChunk:
        chunk = np.zeros(self.shape, np.float32)
        k = self.shape[1]
        for i, recorded in enumerate(self.actions):
            part = recorded[self.t * k : (self.t + 1) * k]
            chunk[i, : len(part)] = part
        self.t += 1
        return ActionChunk(torch.as_tensor(chunk))


def run_episodes(
    env: Any, policy: Any, starts: list, max_steps: int = 100_000, deterministic: bool = True
) -> dict:
    """One episode per env from ``starts`` (frame ids or InitialFrames) with the trainers'
    ``Collector`` (finished envs wait), every sub-step frame recorded."""
    n = env.num_envs
    env.unwrapped.record_frames = True
    collector = Collector(env, policy, bootstrap="none", reset_finished=False, clip_actions=False)
    obs = collector.reset(seed=0, options={"initial_frames": starts})
    frames: list[list[np.ndarray]] = [[obs["image"][i]] for i in range(n)]

    def grab(info: dict[str, Any]) -> None:
        for i in np.flatnonzero(info["_frames"]):  # envs that ran sub-steps this step
            frames[i].extend(info["frames"][i])

    t0 = time.perf_counter()
    rollout = collector.collect(max_steps, deterministic=deterministic, until_all_done=True, on_step=grab)
    wall = time.perf_counter() - t0
    done = (rollout.terminated | rollout.truncated).numpy()
    ends = [int(np.flatnonzero(done[:, i])[0]) for i in range(n)]  # the step each episode ended
    return {
        "frames": frames,
        "actions": [  # one per sub-step, whatever the chunk
            rollout.actions[: end + 1, i].reshape(-1, rollout.actions.shape[-1]).numpy()
            for i, end in enumerate(ends)
        ],
        "success": np.array([bool(rollout.terminated[end, i]) for i, end in enumerate(ends)]),
        "ends": np.array(ends),  # the chunk (policy step) each episode ended at
        "steps_per_s": float(rollout.valid.sum()) / wall,
        "wall_s": wall,
    }


def agreement(sim: np.ndarray, wm: np.ndarray) -> dict[str, Any]:
    """Per-episode success of the simulator against the world model's, for the same actions."""
    from trainers.metrics import wilson_interval

    sim, wm = np.asarray(sim, bool), np.asarray(wm, bool)
    agree = int((sim == wm).sum())
    return {
        "both": int((sim & wm).sum()),
        "sim_only": int((sim & ~wm).sum()),
        "wm_only": int((~sim & wm).sum()),
        "neither": int((~sim & ~wm).sum()),
        "agree": agree,
        "episodes": len(sim),
        "agree_ci95": list(wilson_interval(agree, len(sim))) if len(sim) else [0.0, 1.0],
    }


def make_policy(checkpoint: str | None, env: Any, seed: int) -> Any:
    from policies.gaussian import GaussianPolicy
    from trainers.checkpoint import load_policy

    obs_space, act_space = env.single_observation_space, env.single_action_space
    if checkpoint:
        policy = load_policy(checkpoint, obs_space, act_space)
    else:
        torch.manual_seed(seed)
        policy = GaussianPolicy(obs_space, act_space, squash=True, torso_kwargs={"image_features": 64})
    policy.seed(seed)
    return policy.eval()


def main(argv: list[str] | None = None) -> dict:
    import gymnasium as gym

    import envs  # noqa: F401  (registers the ids)

    parser = argparse.ArgumentParser(prog=program_name(), description=__doc__.splitlines()[0])
    parser.add_argument("--wm", default="CosmosWM-LiberoSpatial-v0")
    parser.add_argument("--model-dir", default=None, help="default: a tiny random bundle (32x48 / 32x32)")
    parser.add_argument("--checkpoint", default=None, help="a policy for the world model's observations")
    parser.add_argument(
        "--expert-noise",
        type=float,
        default=None,
        help="drive the simulator with the scripted expert, translation noise of this std, and replay its "
        "actions in the world model (no closed-loop world-model run)",
    )
    parser.add_argument("--episodes", type=int, default=4)
    parser.add_argument("--max-episode-steps", type=int, default=64, help="sub-steps, in both envs")
    parser.add_argument(
        "--wm-env-kwargs",
        type=json.loads,
        default={},
        help='JSON object: more world-model env settings, e.g. {"image_size": [64, 64]} for a 64 px bundle',
    )
    parser.add_argument(
        "--sim-env-kwargs",
        type=json.loads,
        default={},
        help='JSON object: more simulator env settings, e.g. {"envs_per_worker": 4} for many episodes',
    )
    parser.add_argument("--device", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/benchmarks/wm_vs_sim")
    args = parser.parse_args(argv)
    if not isinstance(args.sim_env_kwargs, dict) or not isinstance(args.wm_env_kwargs, dict):
        parser.error("--sim-env-kwargs and --wm-env-kwargs take a JSON object")
    if args.expert_noise is not None and (args.checkpoint or not 0 <= args.expert_noise < float("inf")):
        parser.error("--expert-noise takes a finite std >= 0, and no --checkpoint (the expert is the policy)")
    wm_kwargs: dict[str, Any] = {"max_episode_steps": args.max_episode_steps}
    what = "real weights"
    if args.device:
        wm_kwargs["device"] = args.device
    if args.model_dir:
        wm_kwargs["model_dir"] = args.model_dir
    else:
        from envs.world_models.tiny import write_tiny_bundle

        backend = "cosmos" if args.wm.startswith("Cosmos") else "opensora"
        wm_kwargs["model_dir"] = write_tiny_bundle(backend, tempfile.mkdtemp(prefix="vla_gym_wm_"))
        wm_kwargs["image_size"] = (32, 48) if backend == "cosmos" else (32, 32)
        wm_kwargs["model_options"] = {"num_steps": 2}
        what = "tiny random weights"
    n = args.episodes
    wm = gym.make_vec(args.wm, num_envs=n, autoreset_mode="Disabled", **{**wm_kwargs, **args.wm_env_kwargs})
    expert = args.expert_noise is not None
    sim_kwargs = {
        **wm.unwrapped.sim_env_kwargs(),
        **({"task_state": True, "chunk_size": 1} if expert else {}),
        **args.sim_env_kwargs,
    }
    sim = gym.make_vec(
        wm.unwrapped.sim_env_id,
        num_envs=n,
        autoreset_mode="Disabled",
        max_episode_steps=args.max_episode_steps,
        **sim_kwargs,
    )
    try:
        ids = np.linspace(0, len(sim.unwrapped.initial_frames) - 1, n).round().astype(int).tolist()
        sim.reset(seed=args.seed, options={"initial_frames": ids})
        starts = sim.unwrapped.current_frames()
        if expert:
            from policies.libero_expert import LiberoExpert

            driver = LiberoExpert(
                sim.single_observation_space, sim.single_action_space, action_noise=args.expert_noise
            )
            driver.seed(args.seed)
            runs = {"sim": run_episodes(sim, driver, ids, deterministic=args.expert_noise == 0)}
            what += f", the scripted expert (noise {args.expert_noise:g}) in the simulator"
        else:
            policy = make_policy(args.checkpoint, wm, args.seed)
            runs = {"sim": run_episodes(sim, policy, ids), "wm": run_episodes(wm, policy, starts)}
        replay = Replay(runs["sim"]["actions"], wm.action_space.shape)
        runs["wm open-loop"] = run_episodes(wm, replay, starts)
    finally:
        wm.close()
        sim.close()

    # frame t of the sim episode against frame t of the replay, averaged over episodes
    by_index: dict[int, list[tuple[float, float]]] = {}
    for real, imagined in zip(runs["sim"]["frames"], runs["wm open-loop"]["frames"]):
        for t in range(min(len(real), len(imagined))):
            by_index.setdefault(t, []).append((psnr(real[t], imagined[t]), ssim(real[t], imagined[t])))
    index = sorted(by_index)
    sim_run, replay_run = runs["sim"], runs["wm open-loop"]
    k = wm.action_space.shape[1]  # a world-model success counts within the simulator episode's chunks
    last_chunk = np.array([-(-len(a) // k) - 1 for a in sim_run["actions"]])
    agreed = agreement(sim_run["success"], replay_run["success"] & (replay_run["ends"] <= last_chunk))
    mean_psnr = [float(np.mean([p for p, _ in by_index[t] if np.isfinite(p)] or [np.inf])) for t in index]
    mean_ssim = [float(np.mean([s for _, s in by_index[t]])) for t in index]
    later = [t for t in index if t > 0]  # frame 0 is the shared start
    rows = []
    for name, r in runs.items():
        k = int(r["success"].sum())
        rows.append([name, f"{k}/{n}", float(r["steps_per_s"]), float(r["wall_s"])])
    title = f"{args.wm} ({what}) vs {wm.unwrapped.sim_env_id}, {n} initial frames"
    text = table(["run", "success", "steps/s", "wall s"], rows, title)
    if later:
        p, s = np.mean([mean_psnr[t] for t in later]), np.mean([mean_ssim[t] for t in later])
        text += f"\nimagined vs simulated frames 1-{later[-1]} (open loop): PSNR {p:.2f} dB, SSIM {s:.3f}"
    lo, hi = agreed["agree_ci95"]
    text += (
        "\nsuccess, the same actions, simulator vs world model (its reward model): "
        f"agree {agreed['agree']}/{n} [{lo:.2f}, {hi:.2f}]; both {agreed['both']}, simulator only "
        f"{agreed['sim_only']}, world model only {agreed['wm_only']}, neither {agreed['neither']}"
    )
    print(text)
    out = Path(args.out)
    result = {
        "runs": {
            k: {"success": v["success"].tolist(), "steps_per_s": v["steps_per_s"]} for k, v in runs.items()
        },
        "agreement": agreed,
        "frame_index": index,
        "psnr": mean_psnr,
        "ssim": mean_ssim,
        "args": {**vars(args), "what": what},
        "table": text,
    }
    write_json(out / "wm_vs_sim.json", result)
    plot_lines(
        out / "wm_vs_sim.png",
        {"PSNR (dB)": (index, mean_psnr), "SSIM x 40": (index, [40 * s for s in mean_ssim])},
        xlabel="frame (sub-step)",
        ylabel="imagined vs simulated",
        title=title,
    )
    return result


if __name__ == "__main__":
    run_cli(main)

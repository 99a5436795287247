"""Labelled frames from simulator rollouts: what a reward model is trained on.

Each policy spec runs its episodes in the env (``trainers.demos.collect_episodes``, the same loop
demonstrations are recorded with); every frame of an episode is labelled with the simulator's own
success signal at that frame:

* our envs report ``info["chunk_success"]`` after every executed sub-step (LIBERO: its success
  check); a plain gymnasium env may report ``info["success"]`` or ``info["is_success"]`` per step;
  an env with none of them cannot be used (there is nothing honest to label with);
* the frames are the observations the policy saw (``image`` by default) plus the one after the last
  step; with ``sub_steps`` every sub-step's frame (``info["frames"]`` of an env with
  ``record_frames``). The first frame of an episode (after the reset) counts as unsolved;
* LIBERO episodes end at the success, so the env is made with ``steps_after_success=N``: the policy
  keeps acting N sub-steps past the success and those frames carry the success check of their own
  sub-step (positive while the task stays solved).

Policy specs are ``NAME[,key=value...]``: NAME is a policy name of ``policies.registry`` (e.g.
``libero_expert``), ``module:Class``, ``checkpoint:<run dir or file>`` (a trained policy, e.g. a
behaviour clone) or ``random`` (uniform actions); keys ``episodes`` (how many), ``noise`` (std of
Gaussian noise added to every action, in action units, then clipped to the bounds: a noisy expert
fails some episodes) and ``deterministic``; any other key is a policy keyword argument (JSON value).

The frames go to an HDF5 file (``write_frames``; written to ``<path>.tmp`` and renamed when
complete), which training reads back with ``read_frames``:

    /            attrs: format "vla-gym-rm-frames", version, env, env_kwargs (JSON), policies (JSON),
                 seed, collect_s, frame_size
    frames       uint8 [M, H, W, 3]
    labels       bool [M]: the simulator's success at that frame
    episode      int32 [M]: index into the episode table
    step         int32 [M]: frame index inside its episode (0: after the reset)
    episodes/    one array per column, one row per episode: policy (index into policies),
                 initial_frame (-1: none), task, success (at the last frame), success_once, length
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from nets.errors import BadInput
from nets.files import atomic_path
from policies.base import ActionChunk, ActionChunkPolicy, PolicyEval
from trainers.datasets.demos import Episode, check_format
from trainers.demos import collect_episodes

FORMAT, VERSION = "vla-gym-rm-frames", 1
SUCCESS_KEYS = ("success", "is_success")  # per-step success of plain gymnasium envs
EPISODE_COLUMNS = ("policy", "initial_frame", "task", "success", "success_once", "length")


# ---------------------------------------------------------------------------- policy specs
@dataclass(frozen=True)
class PolicySpec:
    """One entry of the policy mix: which policy, how many episodes, how much action noise."""

    name: str
    episodes: int
    noise: float = 0.0
    deterministic: bool = True
    kwargs: dict[str, Any] = field(default_factory=dict)
    text: str = ""  # as written on the command line

    def describe(self) -> str:
        return self.text or self.name


def parse_policy_spec(text: str) -> PolicySpec:
    """``"libero_expert,episodes=40,noise=0.5"`` -> ``PolicySpec`` (see the module docstring)."""
    if not isinstance(text, str) or not text.strip():
        raise BadInput(f"policy spec: expected 'NAME[,key=value...]', got {text!r}")
    name, *items = (part.strip() for part in text.split(","))
    values: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise BadInput(f"policy spec {text!r}: expected key=value after the name, got {item!r}")
        try:
            values[key] = json.loads(raw)
        except json.JSONDecodeError:
            values[key] = raw  # a bare string
    episodes = values.pop("episodes", None)
    if isinstance(episodes, bool) or not isinstance(episodes, int) or episodes < 1:
        raise BadInput(f"policy spec {text!r}: expected episodes=<int >= 1>, got {episodes!r}")
    noise = values.pop("noise", 0.0)
    if isinstance(noise, bool) or not isinstance(noise, int | float) or not 0 <= noise < math.inf:
        raise BadInput(f"policy spec {text!r}: expected noise=<float >= 0> (action std), got {noise!r}")
    deterministic = values.pop("deterministic", True)
    if not isinstance(deterministic, bool):
        raise BadInput(f"policy spec {text!r}: expected deterministic=true|false, got {deterministic!r}")
    return PolicySpec(name, episodes, float(noise), deterministic, values, text)


def check_policy_name(spec: PolicySpec) -> None:
    """An unknown policy name is an error before any env is built."""
    from policies.registry import resolve_policy

    if spec.name == "random" or spec.name.startswith("checkpoint:"):
        return
    try:
        resolve_policy(spec.name, gym.spaces.Box(-1, 1, (1,)))
    except ValueError as e:
        raise BadInput(f"policy spec {spec.describe()!r}: {e}, 'random' or 'checkpoint:<path>'") from None


class RandomActions(ActionChunkPolicy):
    """Uniform random actions inside the ``Box`` bounds (failures that look nothing like a solve)."""

    def __init__(self, action_space: gym.spaces.Box) -> None:
        super().__init__()
        if not isinstance(action_space, gym.spaces.Box):
            raise BadInput(f"the 'random' policy needs a Box action space, got {action_space}")
        shape = action_space.shape if len(action_space.shape) == 2 else (1, *action_space.shape)
        self.chunk_size, self.action_dim = int(shape[0]), int(np.prod(shape[1:]))
        self.log_prob_dim = self.action_dim
        self.register_buffer(
            "low", torch.tensor(np.broadcast_to(action_space.low, shape), dtype=torch.float32)
        )
        self.register_buffer(
            "high", torch.tensor(np.broadcast_to(action_space.high, shape), dtype=torch.float32)
        )

    def act(self, obs: Any, deterministic: bool = False) -> ActionChunk:
        n = _batch_size(obs)
        u = torch.rand((n, *self.low.shape), generator=self._rng(self.low.device), device=self.low.device)
        return ActionChunk(self.low + u * (self.high - self.low))

    def evaluate(self, replay: dict[str, torch.Tensor]) -> PolicyEval:
        raise NotImplementedError("random actions have nothing to train")


class NoisyActions(ActionChunkPolicy):
    """Another policy's actions plus Gaussian noise of std ``noise`` (action units), clipped to the
    bounds of ``action_space``."""

    def __init__(self, policy: ActionChunkPolicy, noise: float, action_space: gym.spaces.Box) -> None:
        super().__init__()
        self.policy, self.noise = policy, float(noise)
        self.chunk_size, self.action_dim = policy.chunk_size, policy.action_dim
        self.log_prob_dim = getattr(policy, "log_prob_dim", self.action_dim)
        self.register_buffer(
            "low", torch.as_tensor(action_space.low, dtype=torch.float32).reshape(-1)[: self.action_dim]
        )
        self.register_buffer(
            "high", torch.as_tensor(action_space.high, dtype=torch.float32).reshape(-1)[: self.action_dim]
        )

    def act(self, obs: Any, deterministic: bool = False) -> ActionChunk:
        actions = self.policy.act(obs, deterministic=deterministic).actions.float()
        noise = torch.randn(actions.shape, generator=self._rng(actions.device), device=actions.device)
        return ActionChunk(torch.clamp(actions + self.noise * noise, self.low, self.high))

    def evaluate(self, replay: dict[str, torch.Tensor]) -> PolicyEval:
        raise NotImplementedError("a noisy data-collection policy has nothing to train")


def make_spec_policy(
    spec: PolicySpec, observation_space: gym.spaces.Space, action_space: gym.spaces.Space, seed: int
) -> ActionChunkPolicy:
    """The policy of ``spec`` for an env's single spaces, seeded, in eval mode."""
    from policies.registry import make_policy
    from trainers.checkpoint import load_policy

    if spec.name == "random":
        policy: ActionChunkPolicy = RandomActions(action_space)
    elif spec.name.startswith("checkpoint:"):
        policy = load_policy(spec.name.partition(":")[2], observation_space, action_space)
    else:
        policy = make_policy(spec.name, observation_space, action_space, **spec.kwargs)
    if spec.noise > 0:
        if not isinstance(action_space, gym.spaces.Box):
            raise BadInput(
                f"policy spec {spec.describe()!r}: noise needs a Box action space, got {action_space}"
            )
        policy.seed(int(np.random.SeedSequence([seed, 1]).generate_state(1)[0]))  # not the noise's stream
        policy = NoisyActions(policy, spec.noise, action_space)
    policy.eval()
    policy.seed(seed)
    return policy


def _batch_size(obs: Any) -> int:
    if isinstance(obs, dict):
        obs = next(v for v in obs.values() if not isinstance(v, tuple | list | str))
    return int(np.shape(obs)[0])


# ---------------------------------------------------------------------------- labelled frames
@dataclass
class FrameSet:
    """Labelled frames: ``frames`` uint8 ``[M, H, W, 3]``, ``labels`` bool ``[M]``, ``episode`` and
    ``step`` int ``[M]``; ``episodes`` the per-episode table (``EPISODE_COLUMNS``); ``meta`` how
    they were collected (env, kwargs, policy specs, seed, wall time)."""

    frames: np.ndarray
    labels: np.ndarray
    episode: np.ndarray
    step: np.ndarray
    episodes: dict[str, np.ndarray]
    meta: dict[str, Any]

    @property
    def num_episodes(self) -> int:
        return len(self.episodes["initial_frame"])


def episode_frames(
    ep: Episode, image_key: str, sub_steps: bool, env_name: str
) -> tuple[np.ndarray, np.ndarray]:
    """One episode's frames ``[F, H, W, 3]`` and their labels ``[F]`` (see the module docstring)."""
    if image_key not in ep.obs:
        raise BadInput(
            f"env {env_name}: no image observation {image_key!r} (observation keys {sorted(ep.obs)}); "
            "make the env render one (LIBERO: cameras=['agentview']) or name it with image_key"
        )
    frames, labels = [ep.obs[image_key][0]], [False]  # the reset frame: the task starts unsolved
    for t in range(len(ep.actions)):
        valid = ep.valid[t]
        success = _sub_step_success(ep, t, valid, env_name)
        if sub_steps:
            shots = ep.info.get("frames", [None] * len(ep.actions))[t]
            if shots is None or len(shots) != int(valid.sum()):
                raise BadInput(
                    f"env {env_name}: sub_steps needs info['frames'] with one frame per executed sub-step "
                    "(this project's envs with record_frames = True)"
                )
            if len(success) != len(shots):  # a plain env: one success per step, not per sub-step
                raise BadInput(f"env {env_name}: sub_steps needs info['chunk_success'] per sub-step")
            frames += list(shots)
            labels += success.tolist()
        else:  # the frame after step t: the next observation, or the final one
            after = (
                ep.obs[image_key][t + 1] if t + 1 < len(ep.actions) else _final_image(ep, image_key, env_name)
            )
            frames.append(after)
            labels.append(bool(success[-1]) if len(success) else labels[-1])
    stacked = np.stack([np.asarray(f) for f in frames])
    if stacked.dtype != np.uint8 or stacked.ndim != 4 or stacked.shape[-1] != 3:
        raise BadInput(
            f"env {env_name}: frames {image_key!r} must be uint8 RGB [H, W, 3], "
            f"got {stacked.dtype} {stacked.shape[1:]}"
        )
    return stacked, np.asarray(labels, bool)


def _sub_step_success(ep: Episode, t: int, valid: np.ndarray, env_name: str) -> np.ndarray:
    """The env's success after each executed sub-step of step ``t`` (one entry per step for plain envs)."""
    chunk = ep.info.get("chunk_success", [None] * (t + 1))[t]
    if chunk is not None:
        return np.asarray(chunk, bool)[valid]
    for source in (ep.info.get("final_info", [None] * (t + 1))[t], *(_step_entries(ep, t))):
        if isinstance(source, dict):  # SAME_STEP autoreset: the last step's info is final_info
            for key in SUCCESS_KEYS:
                if source.get(key) is not None:
                    return np.array([bool(np.asarray(source[key]))])
    raise BadInput(
        f"env {env_name} reports no success signal: a reward model is labelled with the env's own "
        f"success, from info['chunk_success'] [N, K] (this project's envs) or info['success'] / "
        f"info['is_success'] per step; none was in step {t}'s info"
    )


def _step_entries(ep: Episode, t: int) -> list[dict[str, Any]]:
    entry = {key: ep.info[key][t] for key in SUCCESS_KEYS if key in ep.info and ep.info[key][t] is not None}
    return [entry] if entry else []


def _final_image(ep: Episode, image_key: str, env_name: str) -> np.ndarray:
    if ep.final_obs is None or image_key not in ep.final_obs:
        raise BadInput(f"env {env_name}: the episode's final observation has no {image_key!r}")
    return ep.final_obs[image_key]


def collect_frames(
    env: gym.vector.VectorEnv,
    specs: Sequence[PolicySpec],
    *,
    seed: int = 0,
    image_key: str = "image",
    sub_steps: bool = False,
    progress: bool = True,
) -> Iterator[tuple[int, Episode, np.ndarray, np.ndarray]]:
    """Run every spec's episodes; yield ``(spec index, episode, frames, labels)`` per episode."""
    from tqdm import tqdm

    from trainers.rollout import env_name

    name = env_name(env)
    if sub_steps:
        target = getattr(env, "unwrapped", env)
        if not hasattr(target, "record_frames"):
            raise BadInput(f"env {name}: sub_steps needs an env with record_frames (this project's envs)")
        target.record_frames = True
    keys = ["chunk_success", "final_info", *SUCCESS_KEYS, *(["frames"] if sub_steps else [])]
    total = sum(s.episodes for s in specs)
    bar = tqdm(total=total, unit="ep", desc="collect", disable=not progress, dynamic_ncols=True)
    frames_seen = positives = 0
    try:
        for j, spec in enumerate(specs):
            policy = make_spec_policy(spec, env.single_observation_space, env.single_action_space, seed + j)
            run_seed = seed + 1000 * j  # each spec walks its own permutation of the start frames
            for ep in collect_episodes(
                env, policy, spec.episodes, seed=run_seed, deterministic=spec.deterministic, info_keys=keys
            ):
                frames, labels = episode_frames(ep, image_key, sub_steps, name)
                frames_seen, positives = frames_seen + len(labels), positives + int(labels.sum())
                bar.set_postfix(frames=frames_seen, positive=positives, refresh=False)
                bar.update(1)
                yield j, ep, frames, labels
    finally:
        bar.close()


# ---------------------------------------------------------------------------- HDF5 file
def write_frames(
    path: str | Path,
    episodes: Iterator[tuple[int, Episode, np.ndarray, np.ndarray]],
    meta: dict[str, Any],
) -> FrameSet:
    """Stream ``collect_frames`` into ``path`` (via ``<path>.tmp``, renamed once complete and
    checked: both labels present). On any error nothing is left behind. Returns the frames."""
    import h5py

    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")  # nets.files.atomic_path: fsynced, renamed (removed on errors)
    table: dict[str, list[Any]] = {c: [] for c in EPISODE_COLUMNS}
    labels, episode, step = [], [], []
    start = time.perf_counter()
    made_dir = not path.parent.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path, temp=tmp) as tmp, h5py.File(tmp, "w") as f:
            data = None
            for j, ep, frames, lab in episodes:
                if data is None:
                    h, w = frames.shape[1:3]
                    data = f.create_dataset(
                        "frames",
                        (0, h, w, 3),
                        np.uint8,
                        maxshape=(None, h, w, 3),
                        chunks=(1, h, w, 3),
                        compression="lzf",
                    )
                if frames.shape[1:3] != data.shape[1:3]:
                    raise BadInput(
                        f"frames change size between episodes: {data.shape[1:3]} then {frames.shape[1:3]}"
                    )
                m = data.shape[0]
                data.resize(m + len(frames), axis=0)
                data[m:] = frames
                k = len(table["policy"])
                labels.append(lab)
                episode.append(np.full(len(lab), k, np.int32))
                step.append(np.arange(len(lab), dtype=np.int32))
                for column, value in zip(
                    EPISODE_COLUMNS, (j, ep.initial_frame, ep.task, ep.success, bool(lab.any()), ep.length)
                ):
                    table[column].append(value)
            if data is None:
                raise BadInput("no episodes were collected (every policy spec needs episodes >= 1)")
            all_labels = np.concatenate(labels)
            check_labels(all_labels, len(table["policy"]), meta)
            meta = {**meta, "collect_s": time.perf_counter() - start, "frame_size": list(data.shape[1:3])}
            f.create_dataset("labels", data=all_labels)
            f.create_dataset("episode", data=np.concatenate(episode))
            f.create_dataset("step", data=np.concatenate(step))
            for column, values in table.items():
                array = np.array(values, dtype=h5py.string_dtype() if column == "task" else None)
                f.create_dataset(f"episodes/{column}", data=array)
            f.attrs["format"], f.attrs["version"] = FORMAT, VERSION
            for key, value in meta.items():
                f.attrs[key] = json.dumps(value)
    except BaseException:
        if made_dir and not any(path.parent.iterdir()):
            path.parent.rmdir()
        raise
    return read_frames(path)


def check_labels(labels: np.ndarray, episodes: int, meta: dict[str, Any]) -> None:
    """Both classes are needed to train a classifier: say which is missing and what to change."""
    positives = int(labels.sum())
    policies = ", ".join(meta.get("policies", [])) or "?"
    if positives == 0:
        raise BadInput(
            f"no positive frames: none of the {episodes} episodes ({len(labels)} frames, policies "
            f"{policies}) reached the env's success; add episodes of a policy that succeeds (e.g. "
            "libero_expert, and steps_after_success in the env kwargs to record solved frames)"
        )
    if positives == len(labels):
        raise BadInput(
            f"no negative frames: all {len(labels)} frames of {episodes} episodes are labelled success; "
            "the env must report success only once the task is solved"
        )


def read_frames(path: str | Path) -> FrameSet:
    """A file written by ``write_frames``, all in memory."""
    from trainers.safe_hdf5 import SafeHDF5

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no frame file at {path} (written by python -m trainers.reward_model)")
    with SafeHDF5(path) as h:  # nothing outside the file, no dataset larger than the file can hold
        f, read = h.file, h.read
        check_format(f, path, FORMAT, VERSION)
        meta = {k: json.loads(v) for k, v in f.attrs.items() if k not in ("format", "version")}
        table = {c: read(f[f"episodes/{c}"]) for c in EPISODE_COLUMNS}
        table["task"] = np.array([t.decode() if isinstance(t, bytes) else str(t) for t in table["task"]])
        return FrameSet(
            frames=read(f["frames"]),
            labels=read(f["labels"]).astype(bool),
            episode=read(f["episode"]),
            step=read(f["step"]),
            episodes=table,
            meta=meta,
        )

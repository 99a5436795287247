"""The vla-gym demonstration file: episodes of a policy in a vector env, kept in HDF5 (written by
``write_demos``; ``python -m trainers.demos`` collects them), read back for behaviour cloning and as
prior data of the off-policy trainers.

File format (HDF5, written with ``h5py``; the file appears once complete, a writer killed or stopped by
an error leaves the episodes written so far in ``<out>.<pid>.tmp``, its own temporary file, readable):

    /                   attrs: format "vla-gym-demos", version 1, env, env_kwargs (JSON), policy,
                        policy_kwargs, chunk_size K, action_dim D, seed, episodes_run,
                        episodes_successful
    /episodes/000000/   attrs: instruction, task, initial_frame (-1: none), success, return, length
        obs/<key>       [C, ...] every array observation key at chunk boundaries: the observation
                        each chunk was chosen from
        actions         float32 [C, K, D], env units, as sent to the env
        valid           bool [C, K]: sub-steps executed (the last chunk stops where the episode ends)
        rewards         float32 [C, K]
        sim_states      float64 [C, S], optional: the simulator state each chunk was chosen from
                        (LIBERO: flattened MuJoCo state; present in demos read from LIBERO's files)

Every dataset is written gzip-compressed with the shuffle filter, as one chunk (the whole episode),
in a file of HDF5 1.10's format (``libver="v110"``: a single-chunk dataset then needs no B-tree, which
in the older format cost more than the data of a short episode). Readers take files written either
way (files of earlier versions of this code are uncompressed, in the earliest format).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nets.errors import BadInput
from nets.files import atomic_path, regular_file

FORMAT, VERSION = "vla-gym-demos", 1
LIBVER = "v110"  # the oldest HDF5 file format with single-chunk datasets (readable by HDF5 >= 1.10)
# HDF5 refuses chunks of 4 GiB or more: a dataset is one chunk up to this size
MAX_CHUNK_BYTES = 1 << 30


def _h5py() -> Any:
    try:
        import h5py
    except ImportError as e:  # pragma: no cover - h5py is a core dependency
        raise ImportError("demonstration files need h5py: pip install h5py") from e
    return h5py


@dataclass
class Episode:
    """One demonstration: ``obs[key]`` ``[C, ...]``, ``actions`` ``[C, K, D]``, ``valid`` and
    ``rewards`` ``[C, K]``, optionally ``sim_states`` ``[C, S]``, and its attributes.

    From ``collect_episodes`` only (not stored in demonstration files): ``final_obs``, the
    observation after the last step (array keys), and ``info[key]``, the env's ``info[key]`` entry
    for this env at each of the C steps (None where the env gave none).
    """

    obs: dict[str, np.ndarray]
    actions: np.ndarray
    valid: np.ndarray
    rewards: np.ndarray
    instruction: str = ""
    task: str = ""
    initial_frame: int = -1
    success: bool = False
    sim_states: np.ndarray | None = None
    final_obs: dict[str, np.ndarray] | None = None
    info: dict[str, list[Any]] = field(default_factory=dict)

    @property
    def length(self) -> int:
        return int(self.valid.sum())


def check_numbers(array: np.ndarray, where: str) -> None:
    """Refuse an array that is not real numbers (complex, object, strings) or holds NaN or inf,
    naming ``where`` and the first bad step."""
    if array.dtype.kind not in "biuf":
        raise BadInput(f"{where} must be real numbers, got dtype {array.dtype}")
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        step = int(np.argwhere(~np.isfinite(array))[0][0])
        raise BadInput(f"{where} hold NaN or infinite values (step {step})")


def text(value: Any, where: str) -> str:
    """A string attribute read from a file: bytes (HDF5 and parquet may store them) decoded as UTF-8,
    a one-element array unwrapped; anything else (or bytes that are not UTF-8) is a ``ValueError``
    naming ``where``."""
    if isinstance(value, np.ndarray) and value.size == 1:
        value = value.reshape(()).item()
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as e:
            raise BadInput(f"{where}: bytes that are not UTF-8 text ({e})") from None
    if not isinstance(value, str):
        raise BadInput(f"{where}: expected a string, got {type(value).__name__} {value!r:.100}")
    try:  # h5py hands back undecodable bytes as lone surrogates ("surrogateescape")
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise BadInput(f"{where}: bytes that are not UTF-8 text ({e})") from None
    return value


@dataclass
class Demos:
    """A demonstration file in memory: its attributes and episodes."""

    meta: dict[str, Any]
    episodes: list[Episode] = field(default_factory=list)

    def __post_init__(self) -> None:
        """Every episode's actions ``[C, K, D]`` of one shape and finite (a reader never hands on a
        NaN action, or 7-D and 8-D actions mixed, for BC or RL to train on)."""
        shape = None
        for i, ep in enumerate(self.episodes):
            actions = np.asarray(ep.actions)
            if actions.ndim != 3 or (shape is not None and actions.shape[1:] != shape):
                expected = "[steps, K, D]" if shape is None else f"[steps, {shape[0]}, {shape[1]}] as before"
                raise BadInput(f"demo episode {i}: actions must be {expected}, got shape {actions.shape}")
            shape = actions.shape[1:]
            check_numbers(actions, f"demo episode {i}: actions")
            check_numbers(np.asarray(ep.rewards), f"demo episode {i}: rewards")
            for key, value in ep.obs.items():
                value = np.asarray(value)
                if value.ndim == 4 and value.dtype != np.uint8:  # [C, H, W, channels]: an image
                    raise BadInput(
                        f"demo episode {i}: obs {key!r} is a {value.dtype} image; images are read as uint8 "
                        "(a 16-bit depth image would wrap around): convert it, or store it as a float feature"
                    )
                if value.dtype.kind in "fc" or value.dtype.kind == "O":
                    check_numbers(value, f"demo episode {i}: obs {key!r}")
            for name in ("instruction", "task"):
                value = getattr(ep, name)
                if not isinstance(value, str):
                    raise BadInput(f"demo episode {i}: {name} must be a string, got {value!r:.100}")

    def chunks(self, obs_keys: Sequence[str], chunk_size: int | None = None) -> dict[str, Any]:
        """Every recorded step of every episode as one training set: ``obs`` (``{key: [M, ...]}``;
        the key ``instruction`` gives a list of M strings), ``actions`` ``[M, K, D]``, ``valid``
        ``[M, K]``.

        Demonstrations recorded one action per step (K = 1) can be cut into chunks of any
        ``chunk_size``: the sample at step t is the observation at t and the actions of steps
        t .. t + K - 1, masked after the episode's end (the action chunking of ACT / OpenVLA-OFT).
        """
        if not self.episodes:
            raise BadInput("no episodes to train on")
        stored = self.episodes[0].actions.shape[1]
        k = stored if chunk_size is None else int(chunk_size)
        if k != stored and stored != 1:
            raise BadInput(
                f"the demonstrations have chunks of {stored} actions; they can only be used with "
                f"chunk_size {stored} (recorded with chunk_size 1 they can be cut into any size), got {k}"
            )
        obs: dict[str, Any] = {}
        for key in obs_keys:
            if key == "instruction":
                obs[key] = [ep.instruction for ep in self.episodes for _ in range(len(ep.actions))]
            elif key in self.episodes[0].obs:
                obs[key] = np.concatenate([ep.obs[key] for ep in self.episodes])
            else:
                raise KeyError(
                    f"observation key {key!r} is not in the demonstrations ({list(self.episodes[0].obs)})"
                )
        actions, valid = [], []
        for ep in self.episodes:
            if k == stored:
                actions.append(ep.actions)
                valid.append(ep.valid)
                continue
            t = len(ep.actions)
            steps = np.arange(t)[:, None] + np.arange(k)[None, :]  # [T, K] step indices
            inside = steps < t
            steps = np.minimum(steps, t - 1)
            actions.append(np.where(inside[..., None], ep.actions[steps, 0], 0.0))
            valid.append(inside & ep.valid[steps, 0])
        return {
            "obs": obs,
            "actions": np.concatenate(actions).astype(np.float32),
            "valid": np.concatenate(valid).astype(bool),
        }

    def future(self, chunk_size: int | None, gamma: float) -> dict[str, Any]:
        """What follows each sample of ``chunks(keys, chunk_size)``, row for row: ``next_row``
        ``[M]``, the row of ``chunks`` whose observation comes after the sample's chunk, and
        ``returns`` ``[M]``, the discounted Monte Carlo return from there (``sum_j gamma^(j - u) r_j``
        over the sub-steps j >= u after the chunk, clipped to [0, 1]): the value target V(s') of
        world-model / value training, e.g. Cosmos Policy's. Where the episode ends inside the chunk,
        both are taken at its last step, so the last chunk of a success has its final reward's value.
        """
        if not 0.0 < gamma <= 1.0:
            raise BadInput(f"gamma must be in (0, 1], got {gamma}")
        stored = self.episodes[0].actions.shape[1] if self.episodes else 1
        k = stored if chunk_size is None else int(chunk_size)
        rows, returns = [], []
        offset = 0
        for ep in self.episodes:
            t = len(ep.actions)
            rewards = ep.rewards[ep.valid].astype(np.float64)  # executed sub-steps, in order
            n = len(rewards)
            # sub-step index at which each recorded step starts
            starts = np.concatenate([[0], np.cumsum(ep.valid.sum(1))])[:t]
            nxt = np.minimum(np.arange(t) + (1 if k == stored else k), t - 1)  # recorded step after
            after = np.minimum(np.where(np.arange(t) + (1 if k == stored else k) < t, starts[nxt], n), n - 1)
            # discounted reward-to-go from every sub-step (backwards recursion)
            to_go = np.zeros(n + 1)
            for j in range(n - 1, -1, -1):
                to_go[j] = rewards[j] + gamma * to_go[j + 1]
            rows.append(offset + nxt)
            returns.append(np.clip(to_go[np.maximum(after, 0)], 0.0, 1.0))
            offset += t
        return {"next_row": np.concatenate(rows), "returns": np.concatenate(returns).astype(np.float32)}


def write_demos(path: str | Path, episodes: Iterable[Episode], meta: dict[str, Any]) -> Path:
    """Write ``episodes`` to ``path`` through ``<path>.<pid>.tmp`` (one per process: two writers of one
    path never share it), renamed once complete. ``meta`` is written first and again with every
    episode (a caller may update totals such as ``episodes_run`` meanwhile).

    The temporary file is closed while the next episode is produced, and reopened only to append it:
    a writer killed or stopped by an error leaves a readable partial file of the episodes written
    before, whose ``meta`` is as of the last one. Only a kill inside the milliseconds an append takes
    can leave it unreadable (HDF5 marks a file open for writing until it is closed)."""
    h5py = _h5py()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # nets.files.atomic_path: fsynced and renamed once complete; kept on an error (the partial file)
    temp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with atomic_path(path, temp=temp, keep_on_error=True) as tmp:
        with h5py.File(tmp, "w", libver=LIBVER) as f:
            _set_attrs(f, {"format": FORMAT, "version": VERSION, **meta})
            f.create_group("episodes")
        for n, ep in enumerate(episodes):
            with h5py.File(tmp, "a", libver=LIBVER) as f:
                _write_episode(f["episodes"].create_group(f"{n:06d}"), ep)
                _set_attrs(f, meta)
        with h5py.File(tmp, "a", libver=LIBVER) as f:
            _set_attrs(f, meta)
    return path


def _set_attrs(f: Any, values: dict[str, Any]) -> None:
    for key, value in values.items():
        f.attrs[key] = json.dumps(value) if isinstance(value, dict | list | tuple) else value


def _write_episode(g: Any, ep: Episode) -> None:
    g.attrs.update(
        {
            "instruction": ep.instruction,
            "task": ep.task,
            "initial_frame": int(ep.initial_frame),
            "success": bool(ep.success),
            "return": float(ep.rewards[ep.valid].sum()),
            "length": ep.length,
        }
    )
    for key, value in ep.obs.items():
        _dataset(g, f"obs/{key}", np.asarray(value))
    _dataset(g, "actions", ep.actions.astype(np.float32))
    _dataset(g, "valid", ep.valid.astype(bool))
    _dataset(g, "rewards", ep.rewards.astype(np.float32))
    if ep.sim_states is not None:
        _dataset(g, "sim_states", np.asarray(ep.sim_states, np.float64))


def _dataset(g: Any, name: str, data: np.ndarray) -> None:
    """``data`` as dataset ``name`` of ``g``: gzip + shuffle in one chunk (the whole episode; rows
    split over several chunks only past ``MAX_CHUNK_BYTES``). Empty and 0-d arrays, which HDF5
    cannot chunk, are stored as they are."""
    if data.ndim == 0 or data.size == 0:
        g.create_dataset(name, data=data)
        return
    rows = max(1, min(len(data), MAX_CHUNK_BYTES // max(data[0].nbytes, 1)))
    g.create_dataset(name, data=data, chunks=(rows, *data.shape[1:]), compression="gzip", shuffle=True)


def check_format(f: Any, path: Path, fmt: str, version: int) -> None:
    """Refuse an open HDF5 file whose ``format`` attribute is not ``fmt`` or whose ``version`` is newer."""
    if f.attrs.get("format") != fmt:
        raise BadInput(f"{path} is not a {fmt} file (format attribute {f.attrs.get('format')!r})")
    if int(f.attrs["version"]) > version:
        raise BadInput(f"{path} has format version {f.attrs['version']}; this code reads <= {version}")


def is_demos_file(path: Path) -> bool:
    """Whether ``path`` is a vla-gym demos file (its ``format`` attribute): the only file
    ``--overwrite`` may replace."""
    try:
        with _h5py().File(regular_file(path), "r") as f:
            return f.attrs.get("format") == FORMAT
    except (OSError, ValueError):
        return False


def read_demos(path: str | Path) -> Demos:
    """Load a file written by ``write_demos`` (through ``trainers.safe_hdf5``: nothing outside the
    file is followed, no dataset declaring more than the file holds is read)."""
    from trainers.safe_hdf5 import SafeHDF5

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no demonstration file at {path}")
    with SafeHDF5(path) as h:
        f, read = h.file, h.read
        check_format(f, path, FORMAT, VERSION)
        meta = {}
        for key, value in f.attrs.items():
            value = value.item() if isinstance(value, np.generic) else value
            meta[key] = json.loads(value) if key in ("env_kwargs", "policy_kwargs") else value
        episodes = []
        for name in sorted(f["episodes"]):
            g = f["episodes"][name]
            episodes.append(
                Episode(
                    obs={k: read(g["obs"][k]) for k in g["obs"]},
                    actions=read(g["actions"]),
                    valid=read(g["valid"]),
                    rewards=read(g["rewards"]),
                    instruction=text(g.attrs["instruction"], f"{path}: episode {name} instruction"),
                    task=text(g.attrs["task"], f"{path}: episode {name} task"),
                    initial_frame=int(g.attrs["initial_frame"]),
                    success=bool(g.attrs["success"]),
                    sim_states=read(g["sim_states"]) if "sim_states" in g else None,
                )
            )
    return Demos(meta, episodes)

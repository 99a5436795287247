"""Observation encoders ("torsos"): batched gymnasium observations -> features ``[B, F]``.

Observations come straight from a gymnasium vector env: an array ``[B, ...]`` (numpy or torch), or
a dict with ``image`` / ``wrist_image`` (uint8 ``[B, H, W, 3]``), ``proprio`` (float32 ``[B, S]``)
and ``instruction`` (B strings). A torso works in two stages:

* ``prepare(obs)`` turns the raw batch into a ``dict[str, Tensor]`` on the torso's device (images
  stay uint8, instructions become hashed token ids ``[B, max_tokens]``). It depends only on the
  observation space, is idempotent, and its output is what policies keep in their replay record.
* ``forward(obs)`` encodes (prepared or raw) observations into features ``[B, out_dim]``.
"""

from __future__ import annotations

import functools
import math
import string
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from nets.errors import BadInput

ACTIVATIONS: dict[str, type[nn.Module]] = {
    "tanh": nn.Tanh,
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "silu": nn.SiLU,
    "elu": nn.ELU,
}
OBS_PREFIX = "obs/"  # replay keys of the prepared observation
SQRT2 = math.sqrt(2.0)  # SB3 gain of hidden layers


def mlp(sizes: Sequence[int], activation: str = "tanh", last_activation: bool = True) -> nn.Sequential:
    """``Linear`` layers between consecutive ``sizes``, each followed by ``activation`` (the last one
    only if ``last_activation``)."""
    layers: list[nn.Module] = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(n_in, n_out))
        if last_activation or i < len(sizes) - 2:
            layers.append(ACTIVATIONS[activation]())
    return nn.Sequential(*layers)


def orthogonal_init(module: nn.Module, gain: float) -> None:
    """SB3-style init of every Linear / Conv2d in ``module``: orthogonal weights, zero biases."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            nn.init.orthogonal_(m.weight, gain=gain)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


# ---------------------------------------------------------------------------------- encoders
OBS_NORM_MODES = ("off", "running", "fixed")
OBS_NORM_CLIP = 10.0  # normalised features are clipped to +-this (SB3's VecNormalize clip_obs)
FOLD_MIN_STD = 0.01  # Torso.fold_standardisation's floor on each feature's std


class VectorEncoder(nn.Module):
    """Flattens a float Box observation; with ``obs_norm`` also standardises it per feature,
    ``clip((x - mean) / sqrt(var + 1e-8), -10, 10)``, with statistics kept as buffers (saved with
    the policy). They start as mean 0, var 1 (identity) and change only through ``update_stats``.
    """

    def __init__(self, shape: Sequence[int], obs_norm: bool = False):
        super().__init__()
        self.out_dim = int(np.prod(shape))
        self.obs_norm = obs_norm
        if obs_norm:
            self.register_buffer("norm_mean", torch.zeros(self.out_dim, dtype=torch.float64))
            self.register_buffer("norm_var", torch.ones(self.out_dim, dtype=torch.float64))
            self.register_buffer("norm_count", torch.zeros((), dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(x.shape[0], -1).float()
        if not self.obs_norm:
            return x
        std = torch.sqrt(self.norm_var.float() + 1e-8)
        return ((x - self.norm_mean.float()) / std).clamp(-OBS_NORM_CLIP, OBS_NORM_CLIP)

    @torch.no_grad()
    def update_stats(self, x: torch.Tensor) -> None:
        """Merge a batch ``[B, ...]`` into the running mean and (population) variance (Chan et al.'s
        parallel update, in float64); every row counts once, the first batch replaces the identity."""
        if not self.obs_norm or x.shape[0] == 0:
            return
        x = x.reshape(x.shape[0], -1).to(self.norm_mean)
        if not torch.isfinite(x).all():
            raise BadInput("observation statistics: the batch holds NaN or infinite values")
        n, mean, var = float(x.shape[0]), x.mean(0), x.var(0, unbiased=False)
        total = self.norm_count + n
        delta = mean - self.norm_mean
        m2 = self.norm_var * self.norm_count + var * n + delta**2 * self.norm_count * n / total
        self.norm_mean += delta * n / total
        self.norm_var.copy_(m2 / total)
        self.norm_count.copy_(total)


class OneHotEncoder(nn.Module):
    """One-hot encoding of a Discrete observation (as SB3 does)."""

    def __init__(self, n: int, start: int = 0):
        super().__init__()
        self.n, self.start, self.out_dim = n, start, n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.one_hot(x.reshape(-1).long() - self.start, self.n).float()


class ImageEncoder(nn.Module):
    """Small CNN for uint8 images: scale to [0, 1], ``len(channels)`` 5x5 stride-2 convs with ReLU,
    adaptive average pooling to ``pool x pool``, then ``Linear -> ReLU`` to ``out_dim``. Any image of
    at least 8x8 pixels works (64x64, 128x128, 224x224 ...)."""

    def __init__(
        self,
        in_channels: int,
        channels: Sequence[int] = (16, 32, 32),
        out_dim: int = 128,
        pool: int = 4,
        channels_last: bool = True,
    ):
        super().__init__()
        self.channels_last = channels_last
        layers: list[nn.Module] = []
        c_in = in_channels
        for c in channels:
            layers += [nn.Conv2d(c_in, c, kernel_size=5, stride=2, padding=2), nn.ReLU()]
            c_in = c
        self.convs = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(pool), nn.Flatten())
        self.proj = nn.Sequential(nn.Linear(c_in * pool * pool, out_dim), nn.ReLU())
        self.out_dim = out_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float() / 255.0 if x.dtype == torch.uint8 else x.float()
        if self.channels_last:
            x = x.permute(0, 3, 1, 2)
        return self.proj(self.convs(x))


def instruction_tokens(text: str, num_buckets: int, max_tokens: int) -> list[int]:
    """Hashed token ids of one instruction: lowercase, split on whitespace, strip surrounding
    punctuation, ``1 + crc32(token) % (num_buckets - 1)`` (0 is padding); at most ``max_tokens``.
    crc32 is stable across processes and machines, unlike Python's ``hash``."""
    ids = []
    for word in text.lower().split():
        word = word.strip(string.punctuation)
        if word:
            ids.append(1 + zlib.crc32(word.encode("utf-8")) % (num_buckets - 1))
    return ids[:max_tokens]


@functools.lru_cache(maxsize=4096)
def _token_row(text: str, num_buckets: int, max_tokens: int) -> torch.Tensor:
    """``instruction_tokens`` padded with 0 to ``max_tokens`` (cached: an env has few instructions,
    and every replay batch repeats them)."""
    row = torch.zeros(max_tokens, dtype=torch.long)
    ids = instruction_tokens(text, num_buckets, max_tokens)
    row[: len(ids)] = torch.tensor(ids, dtype=torch.long)
    return row


class InstructionEmbedding(nn.Module):
    """Bag of hashed words: mean of ``nn.EmbeddingBag(num_buckets, dim)`` vectors over the tokens of
    the instruction (padding id 0 is excluded from the mean; an empty instruction gives zeros)."""

    def __init__(self, num_buckets: int = 4096, dim: int = 32, max_tokens: int = 32):
        super().__init__()
        self.num_buckets, self.max_tokens, self.out_dim = num_buckets, max_tokens, dim
        self.bag = nn.EmbeddingBag(num_buckets, dim, mode="mean", padding_idx=0)

    def tokenize(self, texts: Any, device: torch.device | str = "cpu") -> torch.Tensor:
        """B strings (tuple, list or numpy array; a lone string counts as B=1) -> int64 ids
        ``[B, max_tokens]`` padded with 0."""
        if isinstance(texts, str):
            texts = [texts]
        unique: dict[str, int] = {}  # a batch repeats a few instructions: tokenize each once
        rows = [unique.setdefault(str(text), len(unique)) for text in texts]
        table = torch.stack([_token_row(text, self.num_buckets, self.max_tokens) for text in unique])
        return table[torch.tensor(rows, dtype=torch.long)].to(device)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.bag(ids)


# ---------------------------------------------------------------------------------- the torso
def is_image_space(space: spaces.Space) -> bool:
    """uint8 Box of rank 3 with 1, 3 or 4 channels first or last."""
    return (
        isinstance(space, spaces.Box)
        and space.dtype == np.uint8
        and len(space.shape) == 3
        and (space.shape[-1] in (1, 3, 4) or space.shape[0] in (1, 3, 4))
    )


class Prepared(dict):
    """What ``Torso.prepare`` returns: a dict of tensors that ``forward`` takes without re-preparing."""


class Torso(nn.Module):
    """Encodes each part of the observation, concatenates, and runs a trunk MLP.

    Args:
        encoders: one encoder (with ``.out_dim``) per observation key; key ``"obs"`` for a
            non-Dict observation space.
        kinds: per key, ``"vector"``, ``"image"``, ``"discrete"`` or ``"text"`` (how to prepare it).
        hidden_sizes: trunk MLP sizes after the concatenation (empty: no trunk).
        activation: trunk activation name (``tanh``, ``relu``, ``gelu``, ``silu``, ``elu``).
        is_dict: whether observations are dicts.
    """

    def __init__(
        self,
        encoders: Mapping[str, nn.Module],
        kinds: Mapping[str, str],
        hidden_sizes: Sequence[int] = (64, 64),
        activation: str = "tanh",
        is_dict: bool = True,
    ):
        super().__init__()
        self.encoders = nn.ModuleDict(dict(encoders))
        self.kinds = dict(kinds)
        self.is_dict = is_dict
        in_dim = sum(int(e.out_dim) for e in self.encoders.values())
        self.trunk = mlp([in_dim, *hidden_sizes], activation) if hidden_sizes else nn.Identity()
        self.out_dim = int(hidden_sizes[-1]) if hidden_sizes else in_dim
        self.register_buffer("_device_probe", torch.empty(0), persistent=False)
        self.obs_norm = "off"  # make_torso's mode: "off", "running" or "fixed"

    @property
    def device(self) -> torch.device:
        return self._device_probe.device

    def obs_stats_count(self) -> int:
        """Observations merged into the normalisation statistics so far (0 without ``obs_norm``)."""
        counts = [int(e.norm_count) for e in self.encoders.values() if getattr(e, "obs_norm", False)]
        return max(counts, default=0)

    def prepare(self, obs: Any) -> dict[str, torch.Tensor]:
        """Raw batch (numpy / torch / dict of those, instructions as strings) -> dict of tensors on
        this torso's device. Idempotent: already prepared input passes through."""
        if isinstance(obs, Prepared):
            return obs
        if not self.is_dict and not isinstance(obs, Mapping):
            obs = {"obs": obs}
        out = Prepared()
        for key, kind in self.kinds.items():
            x = obs[key]
            if kind == "text":
                if not isinstance(x, torch.Tensor):
                    x = self.encoders[key].tokenize(x)
                out[key] = x.to(self.device, torch.long)
            elif kind == "image":
                x = torch.as_tensor(x, device=self.device)
                out[key] = x if x.dtype == torch.uint8 else x.float()
            elif kind == "discrete":
                out[key] = torch.as_tensor(x, device=self.device).long()
            else:
                out[key] = torch.as_tensor(x, device=self.device, dtype=torch.float32)
        return out

    def forward(self, obs: Any) -> torch.Tensor:
        prepared = self.prepare(obs)
        parts = [self.encoders[k](prepared[k]) for k in self.kinds]
        return self.trunk(torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0])

    @torch.no_grad()
    def fold_standardisation(self, obs: Any, min_std: float = FOLD_MIN_STD) -> None:
        """Switch a torso fed raw vectors (``obs_norm`` ``"off"``) to ``"fixed"`` standardisation by
        the statistics of ``obs`` (a batch), computing the same function: the trunk's first Linear
        absorbs them, ``W x + b = (W s) (x - m) / s + (b + W m)``. Standardised, every input feature
        moves on the same scale under an optimizer's steps (a clone trained on raw inputs can then be
        fine-tuned as if it had been trained standardised). Each feature's std is floored at
        ``min_std`` so that nearly constant features are not clipped at +-10 when they do move."""
        if self.obs_norm != "off":
            raise BadInput(f"fold_standardisation needs a torso with obs_norm 'off', got {self.obs_norm!r}")
        first = self.trunk[0] if isinstance(self.trunk, nn.Sequential) and len(self.trunk) else None
        if not isinstance(first, nn.Linear):
            raise BadInput("fold_standardisation needs a trunk with hidden layers (its first Linear)")
        if not self.is_dict and not isinstance(obs, Mapping):
            obs = {"obs": obs}
        offset = 0
        for key, kind in self.kinds.items():  # forward concatenates the encoders in this order
            width = int(self.encoders[key].out_dim)
            if kind == "vector":
                if key not in obs:
                    raise BadInput(f"fold_standardisation: no {key!r} in the observations given")
                new = VectorEncoder((width,), obs_norm=True).to(self.device)
                new.update_stats(torch.as_tensor(obs[key], dtype=torch.float32, device=self.device))
                new.norm_var.clamp_(min=min_std**2)
                mean, std = new.norm_mean.float(), torch.sqrt(new.norm_var.float() + 1e-8)
                cols = first.weight[:, offset : offset + width]
                first.bias += cols @ mean
                cols *= std
                self.encoders[key] = new
            offset += width
        self.obs_norm = "fixed"

    def update_obs_stats(self, obs: Any) -> None:
        """Merge a batch of observations (raw or prepared; only the vector parts are read, keys
        absent are skipped) into the normalisation statistics (a no-op without ``obs_norm``)."""
        if not self.is_dict and not isinstance(obs, Mapping):
            obs = {"obs": obs}
        for key, kind in self.kinds.items():
            if kind == "vector" and key in obs:
                x = torch.as_tensor(obs[key], dtype=torch.float32, device=self.device)
                self.encoders[key].update_stats(x)


def _encoder_for(
    space: spaces.Space,
    image_channels: Sequence[int],
    image_features: int,
    instruction_dim: int,
    num_buckets: int,
    max_tokens: int,
    obs_norm: bool,
) -> tuple[nn.Module, str]:
    if isinstance(space, spaces.Text):
        return InstructionEmbedding(num_buckets, instruction_dim, max_tokens), "text"
    if is_image_space(space):
        channels_last = space.shape[-1] in (1, 3, 4)
        c = space.shape[-1] if channels_last else space.shape[0]
        return ImageEncoder(c, image_channels, image_features, channels_last=channels_last), "image"
    if isinstance(space, spaces.Discrete):
        return OneHotEncoder(int(space.n), int(space.start)), "discrete"
    if isinstance(space, (spaces.Box, spaces.MultiBinary)):
        return VectorEncoder(space.shape, obs_norm), "vector"
    raise TypeError(f"no torso for observation space {space}")


def make_torso(
    observation_space: spaces.Space,
    hidden_sizes: Sequence[int] = (64, 64),
    activation: str = "tanh",
    image_channels: Sequence[int] = (16, 32, 32),
    image_features: int = 128,
    instruction_dim: int = 32,
    num_buckets: int = 4096,
    max_tokens: int = 32,
    obs_norm: str = "off",
) -> Torso:
    """Build the torso for a single-env observation space: a Box vector (MLP), a uint8 Box image
    (CNN + MLP), a Discrete (one-hot + MLP), a Text (hashed embedding + MLP), or a Dict of those
    (each part encoded, concatenated, then the MLP). One CNN per image key (``image``,
    ``wrist_image`` ...).

    ``obs_norm``: standardise the vector parts (``VectorEncoder``): ``"fixed"`` with statistics set
    once (``trainers.bc`` and SAC's prior data compute them from the demonstrations), ``"running"``
    also updated by the RL trainers after each update; ``"off"`` (default) feeds them raw."""
    if obs_norm not in OBS_NORM_MODES:
        raise BadInput(f"obs_norm must be one of {OBS_NORM_MODES}, got {obs_norm!r}")
    args = (image_channels, image_features, instruction_dim, num_buckets, max_tokens, obs_norm != "off")
    if isinstance(observation_space, spaces.Dict):
        encoders, kinds = {}, {}
        for key, sub in observation_space.spaces.items():
            encoders[key], kinds[key] = _encoder_for(sub, *args)
        torso = Torso(encoders, kinds, hidden_sizes, activation, is_dict=True)
        torso.obs_norm = obs_norm
        return torso
    encoder, kind = _encoder_for(observation_space, *args)
    torso = Torso({"obs": encoder}, {"obs": kind}, hidden_sizes, activation, is_dict=False)
    torso.obs_norm = obs_norm
    return torso


# ---------------------------------------------------------------------------------- replay helpers
def obs_to_replay(prepared: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Prepared observation -> replay entries ``obs/<key>``."""
    return {OBS_PREFIX + k: v for k, v in prepared.items()}


def obs_from_replay(replay: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Inverse of ``obs_to_replay`` (other replay keys are ignored)."""
    n = len(OBS_PREFIX)
    return {k[n:]: v for k, v in replay.items() if k.startswith(OBS_PREFIX)}

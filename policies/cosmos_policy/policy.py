"""Cosmos Policy (a Cosmos-Predict2 video DiT post-trained into a policy) as an ``ActionChunkPolicy``.

``act``: build the 33-frame video (``layout.build_video``), encode it with the Wan VAE, write the
normalized proprio into latent frame 1, and denoise frames 4-8 with frames 0-3 clean: the Cosmos
sampler (rectified-flow preconditioning, Karras sigmas from 80 to 4, the 2AB solver; N steps =
N network calls; clean frames fed unscaled with timestep 0 and written back after every call).
Actions are read from frame 4 (mean over their tiled copies), min/max un-normalized, the first K
of 16 executed; the value V(s') from frame 8 (``(v + 1) / 2`` clamped to [0, 1]).

Planning (``num_proposals`` > 1, deterministic calls): N proposals from different noise; each is
scored by the value of its own pass (``planning="parallel"``) or, ``"autoregressive"``, by a
world-model pass (frames 0-4 clean, ``num_future_samples`` futures) and a value pass per future
(frames 0-7 clean, ``num_value_samples`` values), averaged; the highest value wins.

RL: one denoising step k (uniform over the solver steps) is a Gaussian transition on the action
frame, ``x_{k+1} = mean_k + noise_level * sigma_{k+1} * eps`` (mean_k the deterministic 2AB update);
the element log-prob of action (t, d) sums the Gaussian log-densities of its tiled copies. The
replay keeps x_k, the previous x0 estimate (the 2AB step's memory) and the sampled action frame, so
``evaluate`` recomputes mean_k under the current weights, as for pi0.5's ``flow_sde``.

Critic (``use_critic``, for PPO): the model's own value frame. The value of a stochastic call is read
from the x0 estimate of the stochastic step (which ``evaluate`` recomputes, so the value loss trains
the DiT's value frame); ``value(obs)`` runs a deterministic pass and reads its final x0. The last
call's V(s') is also kept in ``predicted_value`` ``[B]``.

SFT (``imitation_loss``): the recipe's denoising loss over the injected frames, with its split of
samples between policy (frames 0-3 clean), world model (0-4) and value function (0-7) and its noise
levels (``sft.py``), through the sampler's own denoiser so training and sampling agree.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from nets.cosmos_sampler import SIGMA_MAX, karras_sigmas, rf_x0, step_2ab
from nets.errors import BadInput

from ..base import ActionChunk, PolicyEval
from ..images import resize_images
from ..options import build_options
from ..pretrained import PretrainedVLAPolicy, resolve_dtype
from . import layout, sft
from .checkpoint import load_stats, load_text_embeddings, locate, read_stats, stats_from_data
from .options import COSMOS_RECIPE, CosmosPolicyOptions

SIGMA_MIN = 4.0  # Cosmos Policy's inference sigma range: 80 -> 4
CHUNK, ACTION_DIM, PROPRIO_DIM = 16, 7, 9
# observation entries of latents encoded once (``CosmosPolicy.cache_inputs``): without / with the future
LATENTS, LATENTS_FUTURE = "cosmos_latents", "cosmos_latents_future"


def policy_sigmas(num_steps: int) -> list[float]:
    """The sampler's noise levels: one network call per level (the last is the final x0 read)."""
    if num_steps < 1:
        raise BadInput(f"num_steps must be >= 1, got {num_steps}")
    if num_steps == 1:
        return [SIGMA_MAX]
    return [float(s) for s in karras_sigmas(num_steps - 1, sigma_min=SIGMA_MIN, sigma_max=SIGMA_MAX)]


def axis_angle_to_quat_xyzw(axis_angle: torch.Tensor) -> torch.Tensor:
    """Axis-angle ``[..., 3]`` -> quaternion ``[..., 4]`` (x, y, z, w), the inverse of the LIBERO env's
    proprio conversion (robosuite's ``quat2axisangle``)."""
    angle = axis_angle.norm(dim=-1, keepdim=True)
    axis = axis_angle / angle.clamp_min(1e-12)
    return torch.cat([axis * torch.sin(angle / 2), torch.cos(angle / 2)], dim=-1)


class CosmosPolicy(PretrainedVLAPolicy):
    """Cosmos Policy on LIBERO (see the module docstring); E = D.

    Args:
        observation_space: Dict with ``instruction``, the uint8 images ``image_keys`` (wrist, primary)
            and ``proprio_key``.
        action_space: Box ``(K, 7)`` with K <= 16.
        options: ``CosmosPolicyOptions`` (``options.py``: ``model_path``, ``num_steps``, ``noise_level``,
            the planning and SFT settings, ... each with its default and meaning), as keywords or as
            ``options=``, an instance or a dict of some of them; an unknown keyword is an
            ``OptionsError`` naming the accepted ones.
    """

    checkpoint_name = "Cosmos Policy checkpoint"
    checkpoint_files = ("libero_dataset_statistics.json|dataset_statistics.json",)
    requires, extras = ("diffusers",), "vla,wm"
    options_type = CosmosPolicyOptions
    fine_tune_recipe = COSMOS_RECIPE  # trainers.bc's defaults (the options module cites the source)

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Box,
        *,
        options: CosmosPolicyOptions | Mapping[str, Any] | None = None,
        **kwargs: Any,
    ):
        o = build_options(CosmosPolicyOptions, options, kwargs, type(self).__name__)
        super().__init__(observation_space, action_space, o.image_keys)
        from nets.cosmos_checkpoint import load_cosmos_dit
        from nets.wan_vae import WanVAE

        self.options = o
        self.use_critic = bool(o.use_critic)
        if self.chunk_size > CHUNK or self.action_dim != ACTION_DIM:
            raise BadInput(f"action space {action_space.shape}: expected (K, {ACTION_DIM}) with K <= {CHUNK}")
        self.image_keys, self.proprio_key = tuple(o.image_keys), o.proprio_key
        self._image_shapes = {k: tuple(observation_space.spaces[k].shape) for k in self.image_keys}
        self.sft_split, self.sft_loss_weighting = sft.check_split(o.sft_split), o.sft_loss_weighting
        self._warned_targets: set[str] = set()
        if o.proprio_key not in observation_space.spaces:
            raise BadInput(f"observations lack the proprio key {o.proprio_key!r}")
        self.image_size, self.flip_lr, self.center_crop = int(o.image_size), o.flip_lr, o.center_crop
        self.proprio_format = o.proprio_format
        self._proprio_fields = _proprio_field_slices(
            observation_space.spaces[o.proprio_key], o.proprio_format
        )
        self.num_steps, self.noise_level = int(o.num_steps), float(o.noise_level)
        self.num_proposals, self.planning = int(o.num_proposals), o.planning
        self.num_future_samples, self.num_value_samples = int(o.num_future_samples), int(o.num_value_samples)
        self.future_state_steps, self.value_steps = int(o.future_state_steps), int(o.value_steps)
        self.sigmas = policy_sigmas(self.num_steps)

        folder = self.find_folder(o.model_path, o.download)
        files = locate(folder, o.vae_path)
        source = files.stats if o.norm_stats is None else "norm_stats"
        stats = load_stats(files.stats) if o.norm_stats is None else read_stats(o.norm_stats, source)
        if len(stats["actions"].low) != ACTION_DIM or len(stats["proprio"].low) != PROPRIO_DIM:
            raise BadInput(
                f"{source}: expected {ACTION_DIM}-D actions and {PROPRIO_DIM}-D proprio statistics"
            )
        for key in ("actions", "proprio"):
            self.register_buffer(f"{key}_low", stats[key].low)
            self.register_buffer(f"{key}_high", stats[key].high)
        self.texts = load_text_embeddings(files.text, o.trust_pickle)
        self._text_ids = {text: i for i, text in enumerate(self.texts)}
        width = max(e.shape[0] for e in self.texts.values())
        table = torch.zeros(len(self.texts), width, next(iter(self.texts.values())).shape[1])
        for i, emb in enumerate(self.texts.values()):
            table[i, : emb.shape[0]] = emb  # zero-padded like the T5 encoder's output
        self.register_buffer("text_table", table)
        weight_dtype = resolve_dtype(o.dtype)
        self.dit = load_cosmos_dit(files.dit, prefix="net.", dtype=weight_dtype, trust_pickle=o.trust_pickle)
        self.dit.requires_grad_(True)
        if self.dit.config.action_dim is not None:
            raise BadInput(f"{files.dit} is an action-conditioned world-model DiT, not a Cosmos Policy")
        proj = self.dit.config.crossattn_proj_in_channels  # Predict2.5: Reason1 embeddings, projected
        expected = proj if proj is not None else self.dit.config.crossattn_emb_channels
        if table.shape[-1] != expected:
            raise BadInput(
                f"{files.text.name}: the text embeddings are {table.shape[-1]}-D, the DiT takes {expected}-D "
                + ("Reason1 embeddings through its crossattn_proj (Predict2.5)" if proj is not None
                   else "T5 embeddings as its context (Predict2)")
            )  # fmt: skip
        self.vae = WanVAE.from_tokenizer(files.vae, dtype=weight_dtype, trust_pickle=o.trust_pickle)
        # a Predict2.5 backbone (Reason1 text projection) trains with its logit-normal times, Predict2
        # with the hybrid log-normal / uniform sigmas
        backbone = "predict2.5" if self.dit.config.crossattn_proj_in_channels is not None else "predict2"
        self.sft_noise = backbone if o.sft_noise == "auto" else o.sft_noise

    @classmethod
    def norm_stats_from_demos(
        cls,
        actions: np.ndarray,
        obs: dict[str, np.ndarray],
        num_episodes: int,
        kwargs: dict[str, Any],
        observation_space: spaces.Space | None = None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Statistics of demonstrations for fine-tuning (``trainers.bc``): Cosmos Policy's dataset
        statistics (``checkpoint.stats_from_data``: min/max of the demonstrated ``actions`` ``[N, 7]``
        and of the model's 9-D proprio, converted from ``obs[proprio_key]`` as acting converts it, so
        with the proprio space's ``fields``) as the ``norm_stats`` policy kwarg, and the same as
        ``dataset_statistics.json`` beside the checkpoint."""
        key = kwargs.get("proprio_key", CosmosPolicyOptions.proprio_key)  # the options' defaults
        if key not in obs:
            raise BadInput(f"Cosmos Policy statistics: the demos have no {key!r} observation ({list(obs)})")
        proprio_format = kwargs.get("proprio_format", CosmosPolicyOptions.proprio_format)
        space = getattr(observation_space, "spaces", {}).get(key)
        if proprio_format != "raw" and space is None:
            raise BadInput(f"Cosmos Policy statistics: the env's observations have no {key!r} space")
        fields = _proprio_field_slices(space, proprio_format)
        proprio = model_proprio(torch.as_tensor(obs[key], dtype=torch.float32), fields).numpy()
        stats = stats_from_data(np.asarray(actions, np.float64), proprio)
        return {"norm_stats": stats}, {"dataset_statistics.json": stats}

    def required_observation_keys(self) -> tuple[str, ...]:
        """The observation keys this policy reads (demonstrations for it must have them)."""
        return (*self.image_keys, self.proprio_key, "instruction")

    # ------------------------------------------------------------------ inputs
    def _images(self, obs: Any) -> list[torch.Tensor]:
        """The (wrist, primary) images, flipped, cropped and resized to the model's size."""
        images = [torch.as_tensor(np.asarray(obs[k])) for k in self.image_keys]
        if self.flip_lr:
            images = [img.flip(-2) for img in images]
        device = self.text_table.device
        return [
            resize_images(img[:, None], self.image_size, self.center_crop)[:, 0].to(device) for img in images
        ]

    def _normalized_proprio(self, obs: Any) -> torch.Tensor:
        """The model's 9-D proprio ``[B, 9]``, min/max normalized to [-1, 1]."""
        proprio = torch.as_tensor(
            np.asarray(obs[self.proprio_key]), dtype=torch.float32, device=self.text_table.device
        )
        proprio = model_proprio(proprio, self._proprio_fields)
        return layout.minmax_normalize(proprio, self.proprio_low, self.proprio_high)

    @torch.no_grad()
    def _encode(self, obs: Any, next_obs: Any = None) -> torch.Tensor:
        """All 9 latent frames ``[B, 16, 9, h, w]`` (float32): the encoded video with the proprio
        written into frame 1; with ``next_obs``, the future images are the next observation's and its
        proprio is written into frame 5 (the frames 0-3 do not depend on it: the VAE is causal)."""
        future = self._images(next_obs) if next_obs is not None else [None, None]
        latents = self.vae.encode(layout.build_video(*self._images(obs), *future)).float()
        latents = layout.write_vector(latents, layout.INDEX["proprio"], self._normalized_proprio(obs))
        if next_obs is not None:
            normed = self._normalized_proprio(next_obs)
            latents = layout.write_vector(latents, layout.INDEX["future_proprio"], normed)
        return latents

    def cache_inputs(
        self, obs: Any, next_obs: Any = None, batch_size: int = 16, progress: bool = True
    ) -> dict[str, torch.Tensor]:
        """The latents ``imitation_loss`` would encode for these demonstrations (the frozen VAE's
        encoding of the video, with the proprio written in; with ``next_obs`` the future frames too),
        computed once, ``batch_size`` samples at a time, as observation entries (``LATENTS`` or
        ``LATENTS_FUTURE`` ``[N, 16, 9, h, w]``) that ``imitation_loss`` reads instead of encoding: the
        same numbers, without encoding every frame again at every step. Only for images that stay the
        same from epoch to epoch (no augmentation)."""
        from tqdm import tqdm

        n = len(obs["instruction"])
        key = LATENTS if next_obs is None else LATENTS_FUTURE
        chunks = []
        bar = tqdm(total=n, desc=f"Cosmos Policy: encoding {n} demo samples once", disable=not progress)
        for start in range(0, n, batch_size):
            idx = np.arange(start, min(start + batch_size, n))
            rows, future = (
                None
                if o is None
                else {k: [v[i] for i in idx] if isinstance(v, list) else v[idx] for k, v in o.items()}
                for o in (obs, next_obs)
            )
            chunks.append(self._encode(rows, future).cpu())
            bar.update(len(idx))
        bar.close()
        return {key: torch.cat(chunks)}

    def _prepare(self, obs: Any) -> dict[str, torch.Tensor]:
        """Clean latents of frames 0-3 ``[B, 16, 4, h, w]`` and the instructions' T5 table ids."""
        latents = self._encode(obs)
        return {"cond": latents[:, :, : layout.POLICY_CONDITION_FRAMES], "text": self._text_ids_of(obs)}

    def _text_ids_of(self, obs: Any) -> torch.Tensor:
        """The instructions' rows ``[B]`` in the T5 table."""
        device = self.text_table.device
        ids = []
        for text in obs["instruction"]:
            if str(text) not in self._text_ids:
                known = sorted(self._text_ids)[:5]
                raise KeyError(
                    f"no T5 embedding for instruction {str(text)!r} in the checkpoint (e.g. {known})"
                )
            ids.append(self._text_ids[str(text)])
        return torch.tensor(ids, dtype=torch.long, device=device)

    def text_context(self, text: torch.Tensor) -> torch.Tensor:
        """The DiT's cross-attention context of the table rows ``text`` ``[B]``: the T5 embeddings
        themselves (Predict2), or the Reason1 embeddings through ``crossattn_proj`` (Predict2.5)."""
        embeddings = self.text_table[text]
        return embeddings if self.dit.crossattn_proj is None else self.dit.project_context(embeddings)

    def _x0_fn(self, x0_cond: torch.Tensor, num_cond: int, text: torch.Tensor):
        """The denoiser ``x0(x, sigma)`` with the first ``num_cond`` latent frames clean."""
        b, t = x0_cond.shape[0], x0_cond.shape[2]
        cond_mask = torch.zeros(b, t, device=x0_cond.device)
        cond_mask[:, :num_cond] = 1.0
        context = self.text_context(text)

        def x0_fn(x: torch.Tensor, sigma: float) -> torch.Tensor:
            return rf_x0(self.dit, x, sigma, x0_cond, cond_mask, None, context, sigma_conditional=0.0)

        return x0_fn

    def _full_cond(self, cond: torch.Tensor) -> torch.Tensor:
        b, c, n, h, w = cond.shape
        return torch.cat([cond, cond.new_zeros(b, c, layout.NUM_LATENT_FRAMES - n, h, w)], dim=2)

    def _sample(self, x0_fn, shape, sigmas: list[float], stochastic_step: int = -1):
        """Run the sampler; with ``stochastic_step`` k >= 0 step k is the Gaussian transition on the
        action frame. Returns the final x0 and, for k >= 0, the record and log-density terms."""
        rng = self._rng(self.text_table.device)
        x = torch.randn(shape, generator=rng, device=self.text_table.device) * sigmas[0]
        x0_prev, record = None, None
        a = layout.INDEX["action"]
        for i in range(len(sigmas) - 1):
            x0 = x0_fn(x, sigmas[i])
            mean = step_2ab(x, x0, x0_prev, sigmas, i)
            if i == stochastic_step:
                std = self.noise_level * sigmas[i + 1]
                nxt = mean[:, :, a] + std * torch.randn(mean[:, :, a].shape, generator=rng, device=x.device)
                record = {"x_k": x, "x0_prev": x0_prev if x0_prev is not None else torch.zeros_like(x),
                          "next_action": nxt, "mean": mean[:, :, a], "std": std, "x0": x0}  # fmt: skip
                mean = mean.clone()
                mean[:, :, a] = nxt
            x0_prev, x = x0, mean
        return x0_fn(x, sigmas[-1]), record

    def _read(self, x0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Env actions ``[B, K, D]`` and values ``[B]`` from a final x0."""
        flat = layout.read_vector(x0, layout.INDEX["action"], CHUNK * ACTION_DIM).reshape(
            -1, CHUNK, ACTION_DIM
        )
        actions = layout.minmax_unnormalize(flat, self.actions_low, self.actions_high)
        return actions[:, : self.chunk_size, : self.action_dim], self._value_of(x0)

    @staticmethod
    def _value_of(x0: torch.Tensor) -> torch.Tensor:
        """V(s') ``[B]`` in [0, 1] from the value frame of an x0 estimate."""
        return ((layout.read_vector(x0, layout.INDEX["value"], 1)[:, 0] + 1) / 2).clamp(0, 1)

    def _action_log_prob(self, sample: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
        """Element log-probs ``[B, K, D]``: Gaussian log-densities of the action frame, summed per
        action element over its tiled copies."""
        std = std.reshape(-1, *([1] * (sample.ndim - 1)))
        dens = -0.5 * ((sample - mean) / std) ** 2 - torch.log(std) - 0.5 * math.log(2 * math.pi)
        per_element = layout.group_sum(dens.flatten(1), CHUNK * ACTION_DIM).reshape(-1, CHUNK, ACTION_DIM)
        return per_element[:, : self.chunk_size, : self.action_dim]

    # ------------------------------------------------------------------ the policy contract
    @torch.no_grad()
    def act(self, obs: Any, deterministic: bool = False) -> ActionChunk:
        prepared = self._prepare(obs)
        cond, text = prepared["cond"], prepared["text"]
        b = cond.shape[0]
        if not deterministic:
            if self.num_proposals > 1:
                raise BadInput("best-of-N planning is for deterministic (evaluation) calls only")
            if len(self.sigmas) < 2:
                raise BadInput("RL needs num_steps >= 2 (a denoising step to make stochastic)")
        if deterministic and self.num_proposals > 1:
            return self._plan(cond, text)
        shape = (b, cond.shape[1], layout.NUM_LATENT_FRAMES, *cond.shape[3:])
        k = -1
        if not deterministic:
            k = int(
                torch.randint(
                    0, len(self.sigmas) - 1, (1,), generator=self._rng(cond.device), device=cond.device
                )
            )
        x0_fn = self._x0_fn(self._full_cond(cond), layout.POLICY_CONDITION_FRAMES, text)
        x0, record = self._sample(x0_fn, shape, self.sigmas, k)
        actions, value = self._read(x0)
        replay = {**prepared, "step": torch.full((b,), k, dtype=torch.long, device=cond.device),
                  "noise_level": torch.full((b,), self.noise_level, device=cond.device)}  # fmt: skip
        log_probs, critic = None, value
        if record is not None:
            std = torch.full((b,), record["std"], device=cond.device)
            log_probs = self._action_log_prob(record["next_action"], record["mean"], std)
            replay.update(x_k=record["x_k"], x0_prev=record["x0_prev"], next_action=record["next_action"])
            critic = self._value_of(record["x0"])
        self.predicted_value = value  # V(s') of the last call, [B]
        critic = critic[:, None].float() if self.use_critic else None
        return ActionChunk(actions.float(), log_probs, critic, replay)

    def evaluate(self, replay: dict[str, torch.Tensor]) -> PolicyEval:
        """Log-probs of the stored stochastic action-frame step under the current weights."""
        steps = replay["step"].long()
        if bool((steps < 0).any()):
            raise BadInput("replay comes from a deterministic act() call: no stochastic step to score")
        cond, text, x_k, x0_prev = replay["cond"], replay["text"], replay["x_k"], replay["x0_prev"]
        log_probs = torch.zeros(len(steps), self.chunk_size, self.action_dim, device=cond.device)
        values = torch.zeros(len(steps), device=cond.device)
        a = layout.INDEX["action"]
        for k in steps.unique().tolist():
            rows = (steps == k).nonzero()[:, 0]
            x0_fn = self._x0_fn(self._full_cond(cond[rows]), layout.POLICY_CONDITION_FRAMES, text[rows])
            x0 = x0_fn(x_k[rows], self.sigmas[k])
            mean = step_2ab(x_k[rows], x0, x0_prev[rows] if k > 0 else None, self.sigmas, k)[:, :, a]
            std = replay["noise_level"][rows] * self.sigmas[k + 1]
            log_probs = log_probs.index_put(
                (rows,), self._action_log_prob(replay["next_action"][rows], mean, std)
            )
            values = values.index_put((rows,), self._value_of(x0))
        return PolicyEval(log_probs, None, values[:, None] if self.use_critic else None)

    def value(self, obs: Any) -> torch.Tensor:
        """V(s') ``[B, 1]`` of a deterministic pass (the PPO bootstrap of truncated episodes)."""
        if not self.use_critic:
            raise RuntimeError("CosmosPolicy was built with use_critic=False")
        self.act(obs, deterministic=True)
        return self.predicted_value[:, None].float()

    # ------------------------------------------------------------------ supervised fine-tuning
    def imitation_loss(
        self,
        obs: Any,
        actions: torch.Tensor,
        mask: torch.Tensor | None = None,
        *,
        next_obs: Any = None,
        returns: torch.Tensor | np.ndarray | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Cosmos Policy's denoising loss over the injected latent frames (its SFT recipe).

        The clean latent sequence ``x0`` holds the current state (frames 1-3), the demonstrated chunk
        (frame 4, min/max normalized, tiled), and with ``next_obs`` the future state (frames 5-7) and
        with ``returns`` the value (frame 8, ``2 V - 1``). Each sample is one of three conditional
        distributions, drawn with ``sft_split`` (50/25/25): the policy (frames 0-3 clean, 4-8
        denoised), the world model (0-4 clean, 5-8 denoised) or the value function (0-7 clean, 8
        denoised). It gets one noise level ``sigma`` (``sft_noise``: Predict2's 70% log-normal / 30%
        uniform [1, 85], or Predict2.5's logit-normal times with shift 5; ``sft.py``) and the loss is
        ``w(sigma) (D(x0 + sigma eps, sigma) - x0)^2`` with ``D`` the sampler's own denoiser
        (``nets.cosmos_sampler.rf_x0``: rectified-flow preconditioning, clean frames replaced and at
        timestep 0) and ``w = (1 + sigma)^2 / sigma^2`` (``sft_loss_weighting``). Only denoised frames
        with a known target are charged; the sum is divided by the number of latent values in the batch
        (the recipe's mean). Action entries of sub-steps where ``mask`` ``[B, K]`` is False, and of the
        model's steps beyond the K given, are not charged; their slots repeat the last executed action.

        Args:
            obs: observations (the policy's keys), batch B.
            actions: demonstrated chunks ``[B, K, 7]`` in env units, K the policy's chunk size or 16.
            mask: executed sub-steps ``[B, K]`` (None: all).
            next_obs: the observation after the chunk (same keys), for the future-state targets and
                the world-model and value samples.
            returns: V(s') ``[B]`` in [0, 1], the (discounted) return from ``next_obs`` on: the value
                target. Value-function samples need both ``next_obs`` and ``returns``.
            generator: draws modes, noise levels and noise (default: the policy's ``seed`` generator,
                else torch's global one).

        Without ``next_obs`` (or ``returns``) the modes that need them are dropped (the split
        renormalised over the rest; without ``next_obs`` all samples are policy samples) and the frames
        without targets are not charged; a warning says so once per policy.
        """
        device = self.text_table.device
        actions = torch.as_tensor(actions, dtype=torch.float32, device=device)
        b = self._check_sft_batch(obs, actions, mask, next_obs, returns)
        k = actions.shape[1]
        rng = generator if generator is not None else self._rng(device)
        have_future, have_value = next_obs is not None, returns is not None
        self._warn_missing_targets(have_future, have_value)

        cached = LATENTS if next_obs is None else LATENTS_FUTURE  # cache_inputs' latents, if given
        x0 = torch.as_tensor(obs[cached]).to(device) if cached in obs else self._encode(obs, next_obs)
        if mask is not None:  # a masked sub-step repeats the last executed action (its target is unknown)
            valid = torch.as_tensor(mask, device=device).bool()
            index = torch.arange(k, device=device).expand(b, -1)
            last = torch.where(valid, index, torch.full_like(index, -1)).cummax(1).values
            last = torch.where(last < 0, index, last)
            actions = actions.gather(1, last[:, :, None].expand(-1, -1, actions.shape[2]))
        steps = torch.cat([actions, actions[:, -1:].expand(-1, CHUNK - k, -1)], dim=1)  # pad to 16 steps
        normed = layout.minmax_normalize(steps, self.actions_low, self.actions_high)
        x0 = layout.write_vector(x0, layout.INDEX["action"], normed.flatten(1))
        if have_value:
            value = torch.as_tensor(returns, dtype=torch.float32, device=device).reshape(b, 1)
            x0 = layout.write_vector(x0, layout.INDEX["value"], 2 * value - 1)

        available = (True, have_future, have_future and have_value)
        modes = sft.sample_modes(b, self.sft_split, available, rng, device)
        num_cond = torch.tensor([layout.CONDITION_FRAMES[m] for m in sft.MODES], device=device)[modes]
        frames = torch.arange(layout.NUM_LATENT_FRAMES, device=device)
        cond_mask = (frames[None] < num_cond[:, None]).float()  # [B, T]
        known = torch.ones(layout.NUM_LATENT_FRAMES, dtype=torch.bool, device=device)
        known[[layout.INDEX[f] for f in ("future_proprio", "future_wrist", "future_primary")]] = have_future
        known[layout.INDEX["value"]] = have_value
        charged = (cond_mask == 0) & known[None]  # [B, T]

        sigma = sft.sample_sigma(self.sft_noise, b, rng, device)
        eps = torch.randn(x0.shape, generator=rng, device=device)
        x_sigma = x0 + sigma.reshape(-1, 1, 1, 1, 1) * eps
        context = self.text_context(self._text_ids_of(obs))
        denoised = rf_x0(self.dit, x_sigma, sigma, x0, cond_mask, None, context, sigma_conditional=0.0)
        error = (denoised - x0) ** 2  # [B, C, T, H, W]
        weight = charged.float()[:, None, :, None, None].expand_as(error).clone()
        step_valid = torch.zeros(b, CHUNK, dtype=torch.bool, device=device)
        step_valid[:, :k] = True if mask is None else torch.as_tensor(mask, device=device).bool()
        per_value = step_valid[:, :, None].expand(-1, -1, ACTION_DIM).reshape(b, -1)  # [B, 112]
        c, _, h, w = x0.shape[1:]
        tiled = per_value[:, torch.arange(c * h * w, device=device) % (CHUNK * ACTION_DIM)]
        weight[:, :, layout.INDEX["action"]] *= tiled.reshape(b, c, h, w).float()
        weight = weight * sft.loss_weight(sigma, self.sft_loss_weighting).reshape(-1, 1, 1, 1, 1)
        self.last_sft_batch = {"mode": modes, "sigma": sigma, "charged": charged}  # for logging and tests
        return (weight * error).sum() / error.numel()

    def _check_sft_batch(
        self, obs: Any, actions: torch.Tensor, mask: Any, next_obs: Any, returns: Any
    ) -> int:
        """Clear errors for demonstrations that do not fit the model; returns the batch size."""
        if (
            actions.ndim != 3
            or actions.shape[1] not in (self.chunk_size, CHUNK)
            or actions.shape[2] != self.action_dim
        ):
            raise BadInput(
                f"demonstrated actions have shape {tuple(actions.shape)}; the Cosmos Policy wants "
                f"[B, {self.chunk_size}, {self.action_dim}] (its env chunk x action dim) or "
                f"[B, {CHUNK}, {self.action_dim}] (the model's whole chunk)"
            )
        b = actions.shape[0]
        for name, batch in (("obs", obs), ("next_obs", next_obs)):
            if batch is None:
                continue
            if name == "obs" and len(batch["instruction"]) != b:
                raise BadInput(
                    f"obs has {len(batch['instruction'])} instructions for {b} demonstrated chunks"
                )
            for key, expected in self._image_shapes.items():
                got = tuple(np.shape(batch[key]))
                if got != (b, *expected):
                    raise BadInput(
                        f"{name}[{key!r}] has shape {got}; the policy was built for images {expected} "
                        f"(batch of {b} chunks: [{b}, {', '.join(map(str, expected))}])"
                    )
        if mask is not None and tuple(np.shape(mask)) != tuple(actions.shape[:2]):
            raise BadInput(f"mask has shape {tuple(np.shape(mask))}, the actions {tuple(actions.shape[:2])}")
        if returns is not None:
            values = torch.as_tensor(returns, dtype=torch.float32).reshape(-1)
            if values.numel() != b:
                raise BadInput(f"returns has {values.numel()} entries for {b} demonstrated chunks")
            if not bool(((values >= 0) & (values <= 1)).all()):
                raise BadInput(
                    f"returns must be values V(s') in [0, 1] (the value frame holds 2 V - 1), got "
                    f"min {float(values.min()):.3g} / max {float(values.max()):.3g}"
                )
        return b

    def _warn_missing_targets(self, have_future: bool, have_value: bool) -> None:
        missing = [what for what, ok in (("next_obs", have_future), ("returns", have_value)) if not ok]
        key = ",".join(missing)
        if not missing or key in self._warned_targets:
            return
        self._warned_targets.add(key)
        dropped = "world-model and value" if not have_future else "value"
        warnings.warn(
            f"CosmosPolicy.imitation_loss without {' and '.join(missing)}: the {dropped} samples of the "
            f"recipe's 50/25/25 split are dropped and the frames without targets are not charged"
            + (" (policy-only target: the action chunk)" if not have_future else ""),
            stacklevel=3,
        )

    # ------------------------------------------------------------------ planning
    def _plan(self, cond: torch.Tensor, text: torch.Tensor) -> ActionChunk:
        """Best-of-N: N proposals per env, each scored by its (ensemble) value; the best is returned."""
        b, n = cond.shape[0], self.num_proposals
        cond_n, text_n = cond.repeat_interleave(n, 0), text.repeat_interleave(n, 0)
        shape = (b * n, cond.shape[1], layout.NUM_LATENT_FRAMES, *cond.shape[3:])
        x0, _ = self._sample(self._x0_fn(self._full_cond(cond_n), layout.POLICY_CONDITION_FRAMES, text_n),
                             shape, self.sigmas)  # fmt: skip
        actions, value = self._read(x0)
        if self.planning == "autoregressive":
            value = self._planned_value(x0, text_n, shape)
        best = value.reshape(b, n).argmax(1)
        rows = torch.arange(b, device=cond.device) * n + best
        self.predicted_value = value[rows]
        self.proposal_values = value.reshape(b, n)
        steps = torch.full((b,), -1, dtype=torch.long, device=cond.device)
        replay = {
            "cond": cond,
            "text": text,
            "step": steps,
            "noise_level": torch.zeros(b, device=cond.device),
        }
        critic = self.predicted_value[:, None].float() if self.use_critic else None
        return ActionChunk(actions[rows].float(), None, critic, replay)

    def _planned_value(self, x0: torch.Tensor, text: torch.Tensor, shape) -> torch.Tensor:
        """Mean over futures (world-model passes, frames 0-4 clean) of the mean over value passes
        (frames 0-7 clean) of each proposal's value."""
        values = []
        for _ in range(self.num_future_samples):
            future = self._sample(self._x0_fn(x0, 5, text), shape, policy_sigmas(self.future_state_steps))[0]
            for _ in range(self.num_value_samples):
                scored = self._sample(self._x0_fn(future, 8, text), shape, policy_sigmas(self.value_steps))[0]
                values.append(self._read(scored)[1])
        return torch.stack(values).mean(0)


LIBERO_PROPRIO_FIELDS = {"eef_pos": 3, "eef_axis_angle": 3, "gripper_qpos": 2}  # what the conversion reads


def model_proprio(proprio: torch.Tensor, fields: dict[str, slice] | None) -> torch.Tensor:
    """The model's 9-D proprio ``[B, 9]`` (gripper qpos 2, eef pos 3, quaternion xyzw 4) from the env's
    ``[B, P]``, read by field (``_proprio_field_slices``; None: already the model's 9-D)."""
    if fields is not None:
        field = {name: proprio[:, where] for name, where in fields.items()}
        quat = axis_angle_to_quat_xyzw(field["eef_axis_angle"])
        proprio = torch.cat([field["gripper_qpos"], field["eef_pos"], quat], dim=-1)
    if proprio.shape[-1] != PROPRIO_DIM:
        raise BadInput(f"expected {PROPRIO_DIM}-D proprio, got {tuple(proprio.shape)}")
    return proprio


def _proprio_field_slices(space: spaces.Space, proprio_format: str) -> dict[str, slice] | None:
    """Where each field ``libero_axis_angle`` reads sits in the proprio vector, from the space's
    named ``fields`` (None for ``"raw"``)."""
    if proprio_format == "raw":
        return None
    fields = tuple(getattr(space, "fields", ()))
    sizes = dict(fields)
    if any(sizes.get(name) != size for name, size in LIBERO_PROPRIO_FIELDS.items()):
        raise BadInput(
            f"proprio_format 'libero_axis_angle' reads the proprio fields {LIBERO_PROPRIO_FIELDS} by name; "
            f"the proprio space has fields {sizes or 'none'} (give a FieldBox naming them, as LIBERO's env "
            "does, or proprio_format='raw' with the model's 9-D proprio)"
        )
    starts = np.cumsum([0, *(size for _, size in fields)])
    where = {name: slice(int(start), int(start) + size) for (name, size), start in zip(fields, starts)}
    return {name: where[name] for name in LIBERO_PROPRIO_FIELDS}

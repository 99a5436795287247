"""pi0.5 as an ``ActionChunkPolicy``: flow-matching denoising with RL's stochastic steps.

Inputs follow openpi's LIBERO / B1K pipelines: images resized with padding to 224 and scaled to
[-1, 1] (cameras in ``cameras`` order; openpi's empty third LIBERO slot is masked out, so it is left
out here, which computes the same); the prompt ``BOS + clean(instruction) + "\\n"`` or, with
``discrete_state_input``, ``BOS + "Task: {clean}, State: {256-bin state};\\nAction: "``; the state
quantile-normalized. The denoising chain runs in the model's normalized 32-D action space on the
grid of ``policies.flow`` (N steps from t = 1 to 0) with the same samplers and log-prob math as
``FlowPolicy`` (flow_ode / flow_sde / flow_cps / flow_noise, one random stochastic step or
``joint_logprob``). Actions: un-normalized with the action quantiles, then the first K steps and D
dims; log-probs are sliced the same way (``[B, K, D]``, E = D). The tokenizing and (un)normalizing
live in ``processor.py`` (``Pi05Processor``), the network in ``modeling.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from nets.errors import BadInput

from ..base import ActionChunk, PolicyEval, masked_chunk_mean
from ..flow import FlowSampling, denoise_indices, flow_mean_std, sample_chain, score_chain, squashed_std
from ..heads import ValueHead
from ..options import build_options
from ..pretrained import (
    PretrainedVLAPolicy,
    add_lora,
    empty_model,
    load_strict,
    read_state_dict,
    resolve_dtype,
)
from ..torsos import mlp
from .config import Pi05Config, norm_stats_from_data
from .modeling import Pi05Model, PrefixCache, from_checkpoint_keys
from .options import PI05_RECIPE, Pi05Options
from .processor import Pi05Processor, PromptTokenizer, resolve_norm_stats, tokenizer_file

REQUIRED_FILES = ("config.json", "model.safetensors.index.json|model.safetensors")


class Pi05Policy(PretrainedVLAPolicy):
    """pi0.5 loaded from an openpi / lerobot PyTorch checkpoint folder or hub id; E = D.

    Args:
        observation_space: Dict with ``instruction``, the uint8 ``[H, W, 3]`` images named in
            ``cameras`` and (if used) the state ``state_key``.
        action_space: Box ``(K, D)``: K <= the model's horizon, D <= its action dims and statistics.
        options: ``Pi05Options`` (``options.py``: ``model_path``, ``asset_id``, ``cameras``,
            ``sampling``, ``lora_rank``, ... each with its default and meaning), as keywords or as
            ``options=``, an instance or a dict of some of them; ``FlowSampling``'s fields (the RL
            sampler, as in ``FlowPolicy``; ``num_steps`` default 10 here) are keywords too, or given
            together as ``sampling=``. An unknown keyword is an ``OptionsError`` naming the accepted ones.

    Replay: ``images`` uint8 ``[B, n, S, S, 3]``, ``tokens`` / ``token_mask`` ``[B, max_token_len]``,
    ``chains`` float32 ``[B, N+1, H, A]`` (normalized model actions), ``denoise_inds`` ``[B, N]``,
    ``noise_level`` ``[B]``.
    """

    checkpoint_name, checkpoint_files = "pi0.5 checkpoint", REQUIRED_FILES
    options_type = Pi05Options
    fine_tune_recipe = PI05_RECIPE  # trainers.bc's defaults (the options module cites the source)

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Box,
        *,
        options: Pi05Options | Mapping[str, Any] | None = None,
        **kwargs: Any,
    ):
        o = build_options(Pi05Options, options, kwargs, type(self).__name__)
        sampling = o.sampling
        assert isinstance(sampling, FlowSampling)  # Pi05Options.__post_init__ makes it one
        super().__init__(observation_space, action_space, o.cameras)
        self.options = o
        self.cameras, self.state_key, self.value_vlm_mode = tuple(o.cameras), o.state_key, o.value_vlm_mode

        folder = self.find_folder(o.model_path, o.download)
        config = Pi05Config.from_folder(folder)
        self.horizon, self.model_action_dim = config.action_horizon, config.action_dim
        if self.chunk_size > self.horizon or self.action_dim > self.model_action_dim:
            raise BadInput(
                f"action space {action_space.shape} exceeds the model's horizon {self.horizon} x "
                f"{self.model_action_dim} action dims"
            )
        discrete = config.discrete_state_input if o.discrete_state_input is None else o.discrete_state_input
        self.discrete_state_input = bool(discrete)
        stats = resolve_norm_stats(folder, o.asset_id, o.norm_stats, self.discrete_state_input)
        if len(stats["actions"].q01) < self.action_dim:
            raise BadInput(
                f"action statistics are {len(stats['actions'].q01)}-D, the env's actions {self.action_dim}-D"
            )
        if self.discrete_state_input and o.state_key not in observation_space.spaces:
            raise BadInput(f"discrete_state_input needs the state {o.state_key!r} in the observations")
        tokenizer = PromptTokenizer(
            tokenizer_file(folder, o.tokenizer_path), o.max_token_len, self.discrete_state_input
        )
        self.processor = Pi05Processor(
            tokenizer,
            stats.get("state"),
            stats["actions"],
            self.cameras,
            o.state_key,
            config.vision().image_size,
        )

        self.model = load_model(folder, config, resolve_dtype(o.dtype))
        self.image_size = self.processor.image_size
        sampling.attach(self)
        width = config.expert().width
        self.noise_head = None
        if self.noise_method == "flow_noise":  # RLinf's ExploreNoiseNet on the expert output
            self.noise_head = mlp([width, 128, 64, self.model_action_dim], "tanh", last_activation=False)
            sampling.attach_noise_bounds(self)
        pali_width = config.paligemma().width
        self.value_head = (
            ValueHead(pali_width, (1024, 512, 256), 1, "relu", bias_last=True) if o.use_critic else None
        )
        if o.train_expert_only:
            self.model.paligemma_with_expert.paligemma.requires_grad_(False)
        if o.lora_rank > 0:
            both = self.model.paligemma_with_expert
            adapted = both.gemma_expert if o.train_expert_only else both
            add_lora(adapted, o.lora_rank, tuple(o.lora_targets), "pi0.5")

    @classmethod
    def norm_stats_from_demos(
        cls,
        actions: np.ndarray,
        obs: dict[str, np.ndarray],
        num_episodes: int,
        kwargs: dict[str, Any],
        observation_space: Any = None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Statistics of demonstrations for fine-tuning (``trainers.bc``): the ``policy_kwargs`` to add
        (``norm_stats``: openpi's ``norm_stats.json`` content over the demonstrated ``actions``
        ``[N, D]``, env units, and the state ``obs[state_key]`` when the demos have it) and the files
        to save beside the checkpoint (``{"norm_stats.json": content}``)."""
        state = obs.get(kwargs.get("state_key", "proprio"))
        stats = norm_stats_from_data(actions, state)
        return {"norm_stats": stats}, {"norm_stats.json": stats}

    # the processor's parts, under the names they had before it was split out
    tokenizer = property(lambda self: self.processor.tokenizer)
    state_stats = property(lambda self: self.processor.state_stats)
    action_stats = property(lambda self: self.processor.action_stats)

    def required_observation_keys(self) -> tuple[str, ...]:
        """The observation keys this policy reads (demonstrations for it must have them)."""
        return (*self.cameras, *((self.state_key,) if self.discrete_state_input else ()), "instruction")

    # ------------------------------------------------------------------ inputs
    def _prepare(self, obs: Any) -> dict[str, torch.Tensor]:
        return self.processor(obs, self.timesteps.device)

    def _prefix(self, prepared: dict[str, torch.Tensor]) -> PrefixCache:
        pixels = prepared["images"].permute(0, 1, 4, 2, 3).float() / 255.0 * 2 - 1
        embeds, valid = self.model.embed_prefix(pixels, prepared["tokens"], prepared["token_mask"])
        return self.model.prefix_cache(embeds, valid)

    def _trained_prefix(self, prepared: dict[str, torch.Tensor]) -> PrefixCache:
        """The prefix for a loss: without gradients when PaliGemma is frozen (``train_expert_only``)."""
        frozen = not any(p.requires_grad for p in self.model.paligemma_with_expert.paligemma.parameters())
        with torch.set_grad_enabled(torch.is_grad_enabled() and not frozen):
            return self._prefix(prepared)

    def _value(self, cache: PrefixCache) -> torch.Tensor | None:
        if self.value_head is None:
            return None
        if self.value_vlm_mode == "mean_token":
            w = cache.valid[..., None].to(cache.hidden.dtype)
            feature = (cache.hidden * w).sum(1) / w.sum(1)
        else:
            last = cache.valid.long().cumsum(1).argmax(1)  # index of the last real token
            feature = cache.hidden[torch.arange(len(last)), last]
        return self.value_head(feature)

    def _transition(self, cache: PrefixCache, noise_level: torch.Tensor):
        """``transition(x, step, method)`` of the denoising chain for ``sample_chain`` / ``score_chain``."""

        def transition(
            x: torch.Tensor, idx: int | torch.Tensor, method: str
        ) -> tuple[torch.Tensor, torch.Tensor]:
            idx = torch.as_tensor(idx, device=x.device).expand(x.shape[0])
            t, t_next = self.timesteps[idx], self.timesteps[idx + 1]
            v, hidden = self.model.velocity(cache, x, t)
            col = (slice(None), None, None)
            learned = None
            if method == "flow_noise":
                raw = self.noise_head(hidden.float())
                learned = squashed_std(raw, self.logvar_min, self.logvar_max)
            sigma = noise_level[col] * self.sigma_ratios[idx][col]
            return flow_mean_std(x, v, t[col], (t - t_next)[col], method, noise_level[col], sigma, learned)

        return transition

    def _to_env(self, x: torch.Tensor) -> torch.Tensor:
        """Normalized model actions ``[B, H, A]`` -> env actions ``[B, K, D]``."""
        return self.processor.to_env(x, self.chunk_size, self.action_dim)

    # ------------------------------------------------------------------ the policy contract
    @torch.no_grad()
    def act(self, obs: Any, deterministic: bool = False) -> ActionChunk:
        prepared = self._prepare(obs)
        cache = self._prefix(prepared)
        b, device = cache.valid.shape[0], cache.valid.device
        rng = self._rng(device)
        x = torch.randn((b, self.horizon, self.model_action_dim), generator=rng, device=device)
        inds = denoise_indices(
            self.num_steps, deterministic, self.joint_logprob, self.ignore_last, rng, device
        )
        noise_level = torch.full((b,), self.noise_level, device=device)
        transition = self._transition(cache, noise_level)
        chains, log_probs = sample_chain(x, inds, transition, self.noise_method, self.joint_logprob, rng)
        if log_probs is not None:
            log_probs = log_probs[:, : self.chunk_size, : self.action_dim]
        replay = {
            **prepared,
            "chains": chains,
            "denoise_inds": inds.to(device).expand(b, self.num_steps).clone(),
            "noise_level": noise_level,
        }
        return ActionChunk(self._to_env(chains[:, -1]), log_probs, self._value(cache), replay)

    @property
    def noise_shape(self) -> tuple[int, int]:
        """The shape of one sample's initial noise: ``(horizon, model action dims)``."""
        return (self.horizon, self.model_action_dim)

    @torch.no_grad()
    def denoise(self, obs: Any, noise: torch.Tensor) -> torch.Tensor:
        """Env actions ``[B, K, D]`` of the deterministic (ODE) chain from the initial noise
        ``[B, horizon, model action dims]``: what ``act(deterministic=True)`` does after drawing its
        noise. DSRL (``policies/dsrl.py``) steers the frozen policy through this noise."""
        cache = self._prefix(self._prepare(obs))
        x = noise.to(cache.hidden.device, torch.float32)
        transition = self._transition(cache, torch.full((x.shape[0],), self.noise_level, device=x.device))
        for i in range(self.num_steps):
            x, _ = transition(x, i, "flow_ode")
        return self._to_env(x)

    def evaluate(self, replay: dict[str, torch.Tensor]) -> PolicyEval:
        """Log-probs of the stored chain's stochastic steps under the current weights (the prefix is
        recomputed; without gradients when PaliGemma is frozen)."""
        cache = self._trained_prefix({k: replay[k] for k in ("images", "tokens", "token_mask")})
        transition = self._transition(cache, replay["noise_level"])
        inds = replay["denoise_inds"].long()
        log_probs, entropy = score_chain(
            replay["chains"], inds, transition, self.noise_method, self.joint_logprob
        )
        k, d = self.chunk_size, self.action_dim
        entropy = entropy[:, :k, :d] if self.noise_method == "flow_noise" else None
        return PolicyEval(log_probs[:, :k, :d], entropy, self._value(cache))

    def imitation_loss(
        self, obs: Any, actions: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """openpi's flow-matching SFT loss: the demonstrated chunk normalised with the norm stats and
        zero-padded to ``[horizon, model action dims]`` is ``a``; ``t = 0.001 + 0.999 Beta(1.5, 1)``,
        ``x_t = t noise + (1 - t) a``, and the expert's velocity is regressed on ``noise - a``.
        The squared error counts the chunk's K steps and D env dims (the padding is not data),
        summed over D and averaged over the executed sub-steps (``mask``). With
        ``train_expert_only`` the PaliGemma prefix runs without gradients."""
        cache = self._trained_prefix(self._prepare(obs))
        device, k, d = cache.hidden.device, self.chunk_size, self.action_dim
        b = actions.shape[0]
        a = torch.zeros((b, self.horizon, self.model_action_dim), device=device)
        a[:, :k, :d] = self.processor.normalize_actions(actions.to(device, torch.float32))
        rng = self._rng(device)
        noise = torch.randn(a.shape, generator=rng, device=device)
        u = torch.rand(b, generator=rng, device=device)
        t = 0.001 + 0.999 * u ** (1 / 1.5)  # Beta(1.5, 1) by its inverse CDF (openpi's time distribution)
        x_t = t[:, None, None] * noise + (1 - t[:, None, None]) * a
        v, _ = self.model.velocity(cache, x_t, t)
        error = (v.float() - (noise - a))[:, :k, :d] ** 2
        return masked_chunk_mean(error.sum(-1), mask)

    def value(self, obs: Any) -> torch.Tensor:
        if self.value_head is None:
            raise RuntimeError("Pi05Policy was built with use_critic=False")
        return self._value(self._prefix(self._prepare(obs)))


def load_model(folder: Path, config: Pi05Config, dtype: torch.dtype) -> Pi05Model:
    """Build pi0.5 without allocating random weights and load the folder's weights strictly."""
    model = empty_model(lambda: Pi05Model(config), f"pi0.5 model of {folder}")
    state, _unused = from_checkpoint_keys(read_state_dict(folder, dtype))
    load_strict(model, state, f"pi0.5 checkpoint {folder}")
    return model.eval()

"""DSRL (Wagenmaker et al. 2025, "Steering your diffusion policy with latent space RL"): a frozen
flow policy whose initial denoising noise is chosen by a small squashed-Gaussian actor.

The env executes ``base.denoise(obs, w)``, the base's deterministic chain from the noise ``w``; SAC
trains the noise actor and a critic on (observation, ``w``), so the base's behaviour is never
changed, only which of its outputs is picked. ``w`` lies in ``[-max_noise, max_noise]`` (a noise
actor that wanders far outside the base's N(0, I) training noise leaves its training data). With
``start_at_base`` (the default) the actor's mean head starts at zero: its deterministic noise is
exactly 0, so before any update DSRL acts as the base does from zero noise (a flow policy with
``deterministic_init="zeros"``: the clone as evaluated), and explores around it.
``sac_action_space`` tells the trainer that the critic's action is the noise (``replay["sac_action"]``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from nets.errors import BadInput

from .base import ActionChunk, ActionChunkPolicy, PolicyEval
from .gaussian import SAC_ACTOR, GaussianPolicy
from .registry import make_policy
from .torso_policy import box_chunk_shape


class NoiseSteeredPolicy(ActionChunkPolicy):
    """A frozen flow ``base`` steered by a noise actor.

    Args:
        observation_space, action_space: single-env spaces (the base is built on the same).
        base: the base policy spec ``{"name": ..., "kwargs": {...}}``: a policy with
            ``denoise(obs, noise)`` and ``noise_shape`` (``flow``, ``pi05``); the trainers fill it
            from ``--init-policy`` (or name it directly, e.g. a pi0.5 ``model_path``).
        max_noise: the noise actor's bound.
        start_at_base: zero the noise actor's mean head (weights and bias), so that its
            deterministic noise is 0 until the first update (False: PyTorch's default init, a
            small observation-dependent noise).
        use_critic: must be False (the trainers pass it).
        **actor_options: ``GaussianPolicy`` options of the noise actor over ``SAC_ACTOR``'s
            (SB3's SAC actor), e.g. ``hidden_sizes``.

    Replay: the noise actor's (``obs/<key>``, ``raw_action``) plus ``sac_action``, the noise
    ``[B, *base.noise_shape]``; log-probs are the noise actor's ``[B, *noise_shape]``.
    """

    squash = True

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Box,
        *,
        base: Mapping[str, Any],
        max_noise: float = 2.0,
        start_at_base: bool = True,
        use_critic: bool = False,
        **actor_options: Any,
    ) -> None:
        super().__init__()
        if use_critic:
            raise BadInput("DSRL's noise actor has no value head (SAC's critics score the noise)")
        if not isinstance(base, Mapping) or "name" not in base:
            raise BadInput(
                f"base must be a policy spec {{'name': ..., 'kwargs': {{...}}}}, got {base!r:.200}"
            )
        base_policy = make_policy(
            base["name"], observation_space, action_space, **dict(base.get("kwargs", {}))
        )
        if not callable(getattr(base_policy, "denoise", None)) or not hasattr(base_policy, "noise_shape"):
            raise TypeError(
                f"DSRL steers a flow policy (one with denoise(obs, noise)); got {type(base_policy).__name__}"
            )
        if not max_noise > 0:
            raise BadInput(f"max_noise must be > 0, got {max_noise}")
        self.base = base_policy.requires_grad_(False).eval()
        self.chunk_size, self.action_dim = box_chunk_shape(action_space)
        shape = tuple(base_policy.noise_shape)  # flow: the chunk; pi0.5: horizon x model action dims
        self.sac_action_space = spaces.Box(-float(max_noise), float(max_noise), shape, np.float32)
        options = {**SAC_ACTOR, **actor_options, "use_critic": False}
        self.actor = GaussianPolicy(observation_space, self.sac_action_space, **options)
        if start_at_base:
            with torch.no_grad():
                self.actor.mean_head.weight.zero_()
                self.actor.mean_head.bias.zero_()
        self.log_prob_dim = self.actor.log_prob_dim

    def seed(self, seed: int) -> None:
        super().seed(seed)
        self.actor.generator = self.generator  # one stream, checkpointed as the policy's

    def train(self, mode: bool = True) -> NoiseSteeredPolicy:
        super().train(mode)
        self.base.eval()  # frozen: never in training mode
        return self

    @property
    def obs_norm(self) -> str:
        """The noise actor's observation standardisation (``torso_kwargs={"obs_norm": ...}``)."""
        return self.actor.obs_norm

    def update_obs_stats(self, obs: Any) -> None:
        """Merge observations into the noise actor's statistics (the frozen base keeps its own)."""
        self.actor.update_obs_stats(obs)

    def decode(self, obs: Any, noise: torch.Tensor) -> torch.Tensor:
        """The env actions the base makes of ``noise``."""
        return self.base.denoise(obs, noise)

    @torch.no_grad()
    def act(self, obs: Any, deterministic: bool = False) -> ActionChunk:
        out = self.actor.act(obs, deterministic)
        return ActionChunk(
            self.decode(obs, out.actions), out.log_probs, None, {**out.replay, "sac_action": out.actions}
        )

    def rsample(self, obs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparametrised noise sample and its log-probs (``GaussianPolicy.rsample``)."""
        return self.actor.rsample(obs)

    def evaluate(self, replay: dict[str, torch.Tensor]) -> PolicyEval:
        return self.actor.evaluate(replay)

    def imitation_loss(
        self, obs: Any, actions: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        raise NotImplementedError(
            "DSRL trains the noise fed to a frozen policy: demonstrated env actions say nothing about "
            "that noise (clone the flow base with trainers.bc instead)"
        )

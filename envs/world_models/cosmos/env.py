"""``CosmosWM-LiberoSpatial-v0``: the action-conditioned Cosmos Predict 2.5 world model as an env."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

from envs.core.errors import bad_input, check_image_size
from envs.world_models.bundles import COSMOS_LIBERO_SPATIAL
from envs.world_models.env import (
    WorldModelVectorEnv,
    bundle_parts,
    check_env_options,
    chunk_options,
    default_device,
    locate_bundle,
    parse_dtype,
)

BUNDLES = {"spatial": COSMOS_LIBERO_SPATIAL}
SIM_IDS = {"spatial": "Libero-Spatial-v0"}


class CosmosWorldModelEnv(WorldModelVectorEnv):
    """Cosmos (DiT + Wan 2.1 VAE, 2AB sampler) imagining LIBERO, with RLinf's reward model.

    Weights come from ``model_dir``, ``$VLA_GYM_COSMOS_LIBERO_SPATIAL`` or the Hugging Face cache
    (``envs.world_models.bundles``); ``envs.world_models.tiny.write_tiny_bundle("cosmos", dir)``
    writes a tiny random bundle in the same layout for CPU runs.

    Args:
        suite: the LIBERO suite the checkpoint imagines ("spatial").
        num_envs: envs run as one batch (RLinf: 16 per GPU).
        chunk_size: actions per step, as for LIBERO (RLinf: 8); the model imagines one frame per
            action. None: a plain (7,) action space, one action and one frame per step.
        model_dir, download, revision: where the bundle is (see ``find_bundle``; downloads are off
            unless ``download=True`` with a pinned ``revision``).
        trust_pickle: load the bundle's pickle-based files (``resnet_rm.pth``, ``dataset/*.npy``,
            and Cosmos' ``.pt`` and ``tokenizer.pth``) with a full unpickler. Off by default: they
            are read as plain data (tensors, numpy arrays, containers) and anything else is refused.
        reward_model: a ``resnet_rm.pth`` to score frames with instead of the bundle's (any width,
            e.g. one trained for a new task by ``python -m trainers.reward_model``); the bundle then
            needs no ``resnet_rm.pth``.
        device, dtype: defaults are CUDA + bf16 when available, else CPU + fp32 (dtype may be a name).
        image_size: frame (H, W); RLinf: 256x320 (dataset frames are stretched to it).
        prefix: checkpoint weights to use, ``"net."`` (RLinf) or ``"net_ema."``.
        model_options: ``CosmosWorldModel`` options (``num_steps``, ``guidance``, ``action_scaler``,
            ``batch_size``, ``faithful`` and the four shortcut switches, ``text_context``, ...).
        **env_options: ``WorldModelVectorEnv`` options (``max_episode_steps``, ``reward_coef``, ...);
            any other keyword is a ``ValueError`` listing the accepted ones, before any weights load.
    """

    def __init__(
        self,
        suite: str = "spatial",
        num_envs: int = 1,
        *,
        chunk_size: int | None = 8,
        model_dir: str | os.PathLike | None = None,
        download: bool = False,
        revision: str | None = None,
        trust_pickle: bool = False,
        reward_model: str | os.PathLike | None = None,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        image_size: Sequence[int] = (256, 320),
        prefix: str = "net.",
        model_options: dict[str, Any] | None = None,
        env_id: str = "CosmosWM-LiberoSpatial-v0",
        **env_options: Any,
    ) -> None:
        from envs.world_models.cosmos.model import MODEL_ACTIONS, CosmosWorldModel

        check_env_options(env_id, CosmosWorldModelEnv, env_options)  # all before any weights are loaded
        image_size = check_image_size(env_id, image_size)
        model_options = chunk_options(env_id, chunk_size, model_options)
        most = model_options.get("model_actions", MODEL_ACTIONS)  # the action rows the DiT takes
        if isinstance(most, int) and model_options["frames_per_step"] > most:
            expected = f"an int in [1, {most}] (model_actions: the actions the Cosmos DiT takes) or None"
            raise bad_input(env_id, "chunk_size", expected, chunk_size)
        root, reward_path = locate_bundle(env_id, BUNDLES, suite, reward_model, model_dir, download, revision)
        device = default_device(device)
        model = CosmosWorldModel.from_files(
            root / "libero-spatial-2b-19k.pt",
            root / "tokenizer" / "tokenizer.pth",
            prefix=prefix,
            device=device,
            dtype=parse_dtype(dtype),
            image_size=tuple(image_size),
            trust_pickle=trust_pickle,
            **model_options,
        )
        super().__init__(
            model,
            *bundle_parts(root, trust_pickle, reward_path),
            env_id=env_id,
            num_envs=num_envs,
            chunk_size=chunk_size,
            sim_env_id=SIM_IDS[suite],
            **env_options,
        )
        self.model_dir = root

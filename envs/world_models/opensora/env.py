"""``OpenSoraWM-Libero{Spatial,Object}-v0``: the action-conditioned OpenSora STDiT3 world model."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

from envs.core.errors import check_image_size
from envs.world_models.bundles import OPENSORA_LIBERO_OBJECT, OPENSORA_LIBERO_SPATIAL
from envs.world_models.env import (
    WorldModelVectorEnv,
    bundle_parts,
    check_env_options,
    chunk_options,
    default_device,
    locate_bundle,
    parse_dtype,
)

BUNDLES = {"spatial": OPENSORA_LIBERO_SPATIAL, "object": OPENSORA_LIBERO_OBJECT}
SIM_IDS = {"spatial": "Libero-Spatial-v0", "object": "Libero-Object-v0"}


class OpenSoraWorldModelEnv(WorldModelVectorEnv):
    """OpenSora STDiT3 (SDXL VAE, rectified-flow Euler) imagining LIBERO, with RLinf's reward model.

    Weights come from ``model_dir``, ``$VLA_GYM_OPENSORA_LIBERO_{SPATIAL,OBJECT}`` or the Hugging
    Face cache (``envs.world_models.bundles``); ``envs.world_models.tiny.write_tiny_bundle("opensora",
    dir)`` writes a tiny random bundle in the same layout for CPU runs.

    Args:
        suite: the LIBERO suite the checkpoint imagines ("spatial" or "object").
        num_envs: envs run as one batch (RLinf: 16 per GPU).
        chunk_size: actions per step, as for LIBERO (RLinf: 8); the model imagines one frame per
            action. None: a plain (7,) action space, one action and one frame per step.
        model_dir, download, revision: where the bundle is (see ``find_bundle``; downloads are off
            unless ``download=True`` with a pinned ``revision``).
        trust_pickle: load the bundle's pickle-based files (``resnet_rm.pth``, ``dataset/*.npy``; the
            video model and VAE are safetensors) with a full unpickler. Off by default: they are
            read as plain data (tensors, numpy arrays, containers) and anything else is refused.
        reward_model: a ``resnet_rm.pth`` to score frames with instead of the bundle's (any width,
            e.g. one trained for a new task by ``python -m trainers.reward_model``); the bundle then
            needs no ``resnet_rm.pth``.
        device, dtype: defaults are CUDA + bf16 when available, else CPU + fp32 (dtype may be a name).
        image_size: frame (H, W); RLinf: 256x256.
        model_options: ``OpenSoraWorldModel`` options (``num_steps``, ``condition_frames``,
            ``batch_size``, ...).
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
        image_size: Sequence[int] = (256, 256),
        model_options: dict[str, Any] | None = None,
        env_id: str | None = None,
        **env_options: Any,
    ) -> None:
        from envs.world_models.opensora.model import OpenSoraWorldModel

        env_id = env_id or f"OpenSoraWM-Libero{suite.capitalize()}-v0"
        check_env_options(env_id, OpenSoraWorldModelEnv, env_options)  # all before any weights are loaded
        image_size = check_image_size(env_id, image_size)
        model_options = chunk_options(env_id, chunk_size, model_options)
        root, reward_path = locate_bundle(env_id, BUNDLES, suite, reward_model, model_dir, download, revision)
        device = default_device(device)
        model = OpenSoraWorldModel.from_files(
            root,
            root / "vae",
            root / "dataset_statistics.json",
            device=device,
            dtype=parse_dtype(dtype),
            image_size=tuple(image_size),
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

"""Every registered id that runs here passes gymnasium's and Stable-Baselines3's env checkers
through its one-env view (``gym.make``; the LIBERO suites other than Spatial: gymnasium's only);
SB3's checker needs the instruction text dropped."""

from __future__ import annotations

import warnings

import gymnasium as gym
import pytest
from conftest import requires_libero
from gymnasium.utils.env_checker import check_env

import envs  # noqa: F401
from envs.libero import SUITE_IDS
from envs.world_models import WORLD_MODEL_IDS
from envs.world_models.tiny import write_tiny_bundle

sb3_env_checker = pytest.importorskip("stable_baselines3.common.env_checker")
LIBERO_KWARGS = {"image_size": 48, "max_episode_steps": 24, "task_ids": [0]}  # 48 px: SB3 needs >= 36


def check_both(make, sb3: bool = True) -> None:
    env = make(include_instruction=True)
    check_env(env.unwrapped)
    env.close()
    if not sb3:
        return
    env = make(include_instruction=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # SB3 reports problems as warnings: make them failures
        sb3_env_checker.check_env(env.unwrapped, warn=True)
    env.close()


@pytest.mark.slow
@requires_libero
@pytest.mark.parametrize("env_id", list(SUITE_IDS))
def test_libero_ids_pass_the_env_checkers(env_id):
    """Gymnasium's checker on every suite; SB3's (which checks the space types, the same class and
    spaces for every suite) on LIBERO-Spatial only: each extra env build costs about 12 s."""
    check_both(lambda **kw: gym.make(env_id, **LIBERO_KWARGS, **kw), sb3=env_id == "Libero-Spatial-v0")


@pytest.mark.slow
@pytest.mark.parametrize("env_id", list(WORLD_MODEL_IDS))
def test_world_model_ids_pass_both_checkers(env_id, tmp_path):
    backend = "cosmos" if env_id.startswith("Cosmos") else "opensora"
    bundle = write_tiny_bundle(backend, tmp_path / backend)
    kwargs = {"model_dir": bundle, "image_size": (48, 48), "model_options": {"num_steps": 2}}
    check_both(lambda **kw: gym.make(env_id, **kwargs, **kw))

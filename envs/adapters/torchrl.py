"""TorchRL view of a gymnasium 1.x vector env (ours or any other): TorchRL's own ``GymWrapper``.

What TorchRL 0.14.1 does with a gymnasium vector env, measured (``tests/test_adapter_torchrl.py``):

* ``DISABLED`` autoreset: right. ``("next", obs)`` holds the true last observation of an episode
  and TorchRL's partial reset becomes ``reset(options={"reset_mask": done})``.
* ``SAME_STEP``: wrong for ``Dict`` observations (the last ``next`` observation is replaced by the
  reset one), and our envs fail with a ``KeyError`` because some info keys only appear when an
  episode ends.
* ``NEXT_STEP``: refused by TorchRL.
* ``Text`` observations (``instruction``) cannot be stacked into tensors.

So ``make_torchrl_env`` accepts ``DISABLED`` envs only, drops (or encodes) ``Text`` keys with
``TextObservations`` and returns ``GymWrapper(venv)``. Bad actions reach our env's own checks.
TorchRL does not read ``info`` in this mode; ``env.auto_register_info_dict()`` adds the info arrays
(``chunk_rewards``, ``chunk_valid``...) to the rollouts (it runs a short dummy rollout to find them).

Requires the ``torchrl`` extra (``pip install "vla-gym[torchrl]"``).
"""

from __future__ import annotations

from typing import Any

from gymnasium.vector import AutoresetMode, VectorEnv

from envs.adapters.text import TEXT_MODES, TextObservations, text_keys
from nets.errors import BadInput

try:
    from torchrl.envs import GymWrapper
except ImportError as e:  # pragma: no cover - depends on the installed extras
    raise ImportError('envs.adapters.torchrl needs TorchRL: pip install "vla-gym[torchrl]"') from e


def make_torchrl_env(
    venv: VectorEnv, *, instruction: str = "drop", instruction_length: int = 128, **wrapper_kwargs: Any
) -> GymWrapper:
    """A TorchRL env with batch size ``[num_envs]`` over ``venv``.

    Args:
        venv: a vector env in ``DISABLED`` autoreset mode, e.g.
            ``gym.make_vec("Libero-Spatial-v0", 8, autoreset_mode="Disabled")`` or
            ``gym.make_vec("CartPole-v1", 8, vectorization_mode="sync",
            vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.DISABLED})``.
        instruction: what to do with ``Text`` observation keys: ``"drop"`` or ``"encode"``.
        instruction_length: bytes kept when encoding.
        wrapper_kwargs: passed to ``torchrl.envs.GymWrapper`` (``device``, ``categorical_action_encoding``).
    """
    mode = getattr(venv, "autoreset_mode", None) or venv.metadata.get("autoreset_mode")
    if mode != AutoresetMode.DISABLED:
        raise BadInput(
            f"make_torchrl_env: expected a vector env with autoreset_mode DISABLED, got {mode}; "
            "TorchRL 0.14 returns the reset observation in place of the last one in SAME_STEP mode. "
            "Make it with autoreset_mode='Disabled' (ours) or vector_kwargs={'autoreset_mode': "
            "gym.vector.AutoresetMode.DISABLED}"
        )
    if instruction not in TEXT_MODES:
        raise BadInput(f"make_torchrl_env: instruction must be one of {TEXT_MODES}, got {instruction!r}")
    if text_keys(venv.single_observation_space):
        venv = TextObservations(venv, instruction, instruction_length)
    elif getattr(venv, "autoreset_mode", None) is None:
        venv.autoreset_mode = AutoresetMode(mode)  # TorchRL reads the attribute, not the metadata
    return GymWrapper(venv, **wrapper_kwargs)

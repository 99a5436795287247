"""The CleanRL-style example trains on a real LIBERO vector env made with plain gym.make_vec."""

from __future__ import annotations

import math

import pytest
from conftest import requires_libero

from examples import cleanrl_ppo


@pytest.mark.slow
@requires_libero
def test_cleanrl_ppo_runs_on_libero():
    args = cleanrl_ppo.Args(
        total_steps=48,
        num_envs=2,
        num_steps=12,
        num_minibatches=2,
        update_epochs=2,
        env_kwargs={"chunk_size": 2, "image_size": 40, "cameras": ["agentview"], "max_episode_steps": 10},
    )
    history = cleanrl_ppo.main(args)
    assert [h["iteration"] for h in history] == [1, 2]
    assert history[-1]["env_steps"] == 48
    # episodes of 5 chunk steps (10 actions) end during each 12-step rollout, through SameStep autoreset
    assert all(h["episodes"] >= 2 for h in history)
    assert all(math.isfinite(h[k]) for h in history for k in ("return", "pg_loss", "v_loss", "approx_kl"))
    assert all(h["approx_kl"] > 0 for h in history)  # the policy moved during the update

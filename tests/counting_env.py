"""A tiny pure-numpy backend of the chunked env contract, for testing envs/core on its own.

Each env walks along a line: a sub-step moves it one cell forward when action[0] > 0. The episode
succeeds (and terminates) when the position reaches the frame's goal; the step limit is 10. With
``restart_frames_in_info`` every step reports ``info["restart_frame"]``: frames that restart an env at
its position with what its episode had left of the step limit (``meta["resume_pos"]``,
``meta["resume_length"]``; ``meta["from_restart"]``: its episode began at one), as LIBERO's.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from envs.core import ChunkedVectorEnv, ChunkResult, InitialFrame
from envs.core.spaces import observation_space
from policies.base import ActionChunk, ActionChunkPolicy

LIMIT = 10


def counting_frames(goals=(3, 4, 5, 6, 20)) -> list[InitialFrame]:
    return [InitialFrame(instruction=f"walk {g} cells", task=f"walk/{g}", meta={"goal": g}) for g in goals]


class CountingVectorEnv(ChunkedVectorEnv):
    def __init__(
        self, num_envs=3, chunk_size=4, autoreset_mode="NextStep", frames=None, restart_frames_in_info=False
    ):
        super().__init__(
            env_id="Counting-v0",
            num_envs=num_envs,
            single_observation_space=observation_space(
                image_size=(2, 2), wrist=False, proprio_dim=2, instruction=True, proprio_bound=100.0
            ),
            action_low=-np.ones(2),
            action_high=np.ones(2),
            chunk_size=chunk_size,
            initial_frames=frames or counting_frames(),
            autoreset_mode=autoreset_mode,
        )
        self.pos = np.zeros(num_envs, np.int64)
        self.goal = np.zeros(num_envs, np.int64)
        self.steps_run = np.zeros(num_envs, np.int64)  # every executed sub-step, for tests
        self.restart_frames_in_info = restart_frames_in_info

    def _check_frame(self, frame):
        return None if "goal" in frame.meta else "a frame with meta['goal']"

    def _max_episode_steps(self, frame):
        return LIMIT - frame.meta.get("resume_length", 0)

    def _obs_for(self, ids):
        image = np.broadcast_to(self.pos[ids, None, None, None], (len(ids), 2, 2, 3)).astype(np.uint8)
        return {"image": image, "proprio": np.stack([self.pos[ids], self.goal[ids]], 1).astype(np.float32)}

    def _reset_envs(self, env_ids, frames):
        self.pos[env_ids] = [f.meta.get("resume_pos", 0) for f in frames]
        self.goal[env_ids] = [f.meta["goal"] for f in frames]
        return self._obs_for(env_ids)

    def _step_envs(self, env_ids, actions, max_steps):
        n, k = actions.shape[:2]
        rewards, valid, success = np.zeros((n, k), np.float32), np.zeros((n, k), bool), np.zeros((n, k), bool)
        for p, i in enumerate(env_ids):
            for s in range(min(k, max_steps[p])):
                self.pos[i] += actions[p, s, 0] > 0
                self.steps_run[i] += 1
                valid[p, s] = True
                success[p, s] = self.pos[i] >= self.goal[i]
                rewards[p, s] = float(success[p, s])
                if success[p, s]:
                    break
        info = {}
        if self.restart_frames_in_info:
            info["restart_frame"] = np.empty(len(env_ids), dtype=object)
            info["restart_frame"][:] = [
                self._restart_frame(i, self._length[i] + v.sum()) for i, v in zip(env_ids, valid)
            ]
        return ChunkResult(self._obs_for(env_ids), rewards, valid, success, success.any(1), info)

    def _restart_frame(self, i, length):
        start = self._frames[i]
        meta = {
            "goal": start.meta["goal"],
            "resume_pos": int(self.pos[i]),
            "resume_length": int(length),
            "from_restart": "resume_pos" in start.meta,
        }
        return InitialFrame(start.instruction, task=start.task, meta=meta)


class ConstantPolicy(ActionChunkPolicy):
    """Every sub-step's action is ``value`` (> 0 walks forward, so every episode succeeds; <= 0
    stands still, so none does); a policy name for specs: ``counting_env:ConstantPolicy``."""

    def __init__(self, observation_space, action_space, value: float = 1.0):
        super().__init__()
        self.chunk_size, self.action_dim = action_space.shape
        self.log_prob_dim = self.action_dim
        self.value = float(value)

    def act(self, obs, deterministic=False):
        n = len(obs["image"])
        return ActionChunk(torch.full((n, self.chunk_size, self.action_dim), self.value))


# importing this module registers the env, so that "counting_env:SacCounting-v0" also makes it in a
# spawned actor process
if "SacCounting-v0" not in gym.registry:
    gym.register("SacCounting-v0", vector_entry_point="counting_env:CountingVectorEnv")

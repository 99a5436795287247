"""Small deterministic envs for the SAC tests, registered when this module is imported, so that the
async loop's actor process (a fresh interpreter) makes them by name: ``sac_envs:SacReach-v0``."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class Reach(gym.Env):
    """A point on a line from 0 toward 1 in 10 steps; reward -|x - 1|. Resets ignore the seed, so a
    run whose iterations end with its episodes is reproduced exactly by a resumed one."""

    observation_space = spaces.Box(-5.0, 5.0, (2,), np.float32)
    action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x, self.t = 0.0, 0
        return self._obs(), {}

    def _obs(self):
        return np.array([self.x, self.t / 10], np.float32)

    def step(self, action):
        self.x += 0.2 * float(np.clip(action[0], -1, 1))
        self.t += 1
        return self._obs(), -abs(self.x - 1.0), False, self.t >= 10, {}


class Clock(gym.Env):
    """What happens does not depend on the action: the observation is the time, the episode
    terminates after 6 steps with reward 1. Two runs with different policies store the same
    observations, rewards and discounts; only their actions differ."""

    observation_space = spaces.Box(0.0, 1.0, (2,), np.float32)
    action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def _obs(self):
        return np.array([self.t / 6, 1.0], np.float32)

    def step(self, action):
        self.t += 1
        done = self.t >= 6
        return self._obs(), float(done), done, False, {}


for _id, _entry in (("SacReach-v0", Reach), ("SacClock-v0", Clock)):
    if _id not in gym.registry:
        gym.register(_id, entry_point=_entry)

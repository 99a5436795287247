"""PPO in one file, CleanRL style, on our envs through plain ``gymnasium.make_vec`` (no adapter).

    .venv/bin/python examples/cleanrl_ppo.py --total-steps 20000 --num-envs 4

Everything is in this file, top to bottom: the network, the rollout, GAE and the clipped update.
Written for gymnasium 1.x: the env runs in ``SameStep`` autoreset mode, so when an episode ends
``next_obs`` already holds the next episode's first observation and ``info["final_obs"]`` the last
one; a time-limit truncation bootstraps from that last observation (``reward += gamma * V``).
Our envs report ``info["episode"]`` (``return``, ``success``, ``length``) when an episode ends.
Observations: the ``image`` (uint8 HWC) and ``proprio`` keys; the ``instruction`` text is ignored.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
from torch.distributions.normal import Normal

import envs  # noqa: F401  (registers our ids)


@dataclass
class Args:
    env_id: str = "Libero-Spatial-v0"
    env_kwargs: dict = field(
        default_factory=lambda: {"chunk_size": None, "image_size": 64, "cameras": ["agentview"]}
    )
    seed: int = 0
    total_steps: int = 20_000  # vector steps x num_envs
    num_envs: int = 4
    num_steps: int = 64  # steps per env per rollout
    learning_rate: float = 3e-4
    gamma: float = 0.99
    gae_lambda: float = 0.95
    num_minibatches: int = 4
    update_epochs: int = 4
    clip_coef: float = 0.2
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias: float = 0.0) -> nn.Module:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


class Agent(nn.Module):
    """A small CNN on the camera image plus the proprio vector, a Gaussian actor and a critic."""

    def __init__(self, obs_space: gym.spaces.Dict, action_dim: int):
        super().__init__()
        h, w, _ = obs_space["image"].shape
        self.cnn = nn.Sequential(
            layer_init(nn.Conv2d(3, 16, 8, stride=4)),
            nn.ReLU(),
            layer_init(nn.Conv2d(16, 32, 4, stride=2)),
            nn.ReLU(),
            nn.Flatten(),
        )
        cnn_out = self.cnn(torch.zeros(1, 3, h, w)).shape[1]
        proprio_dim = obs_space["proprio"].shape[0] if "proprio" in obs_space.spaces else 0
        self.trunk = nn.Sequential(layer_init(nn.Linear(cnn_out + proprio_dim, 256)), nn.Tanh())
        self.critic = layer_init(nn.Linear(256, 1), std=1.0)
        self.actor_mean = layer_init(nn.Linear(256, action_dim), std=0.01)
        self.actor_logstd = nn.Parameter(torch.zeros(1, action_dim))

    def features(self, image: torch.Tensor, proprio: torch.Tensor) -> torch.Tensor:
        x = self.cnn(image.permute(0, 3, 1, 2).float() / 255.0)  # uint8 NHWC -> float NCHW
        return self.trunk(torch.cat([x, proprio], 1))

    def get_value(self, image: torch.Tensor, proprio: torch.Tensor) -> torch.Tensor:
        return self.critic(self.features(image, proprio))

    def get_action_and_value(self, image, proprio, action=None):
        z = self.features(image, proprio)
        mean = self.actor_mean(z)
        dist = Normal(mean, self.actor_logstd.expand_as(mean).exp())
        if action is None:
            action = dist.sample()
        return action, dist.log_prob(action).sum(1), dist.entropy().sum(1), self.critic(z)


def to_tensors(obs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Batched observation dict -> (image uint8 [N,H,W,3], proprio float32 [N,P])."""
    image = torch.as_tensor(np.asarray(obs["image"]))
    proprio = torch.as_tensor(np.asarray(obs.get("proprio", np.zeros((len(image), 0)))), dtype=torch.float32)
    return image, proprio


def main(args: Args) -> list[dict]:
    """Train; return one dict of statistics per iteration."""
    torch.manual_seed(args.seed)
    vec = gym.make_vec(args.env_id, num_envs=args.num_envs, autoreset_mode="SameStep", **args.env_kwargs)
    action_shape = vec.single_action_space.shape
    action_dim = int(np.prod(action_shape))
    agent = Agent(vec.single_observation_space, action_dim)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    n, t_len = args.num_envs, args.num_steps
    space = vec.single_observation_space
    h, w, _ = space["image"].shape
    p = space["proprio"].shape[0] if "proprio" in space.spaces else 0
    images = torch.zeros((t_len, n, h, w, 3), dtype=torch.uint8)
    proprios = torch.zeros((t_len, n, p))
    actions = torch.zeros((t_len, n, action_dim))
    logprobs, rewards, dones, values = (torch.zeros((t_len, n)) for _ in range(4))

    history: list[dict] = []
    obs, _ = vec.reset(seed=args.seed)
    next_image, next_proprio = to_tensors(obs)
    next_done = torch.zeros(n)
    num_iterations = max(1, args.total_steps // (n * t_len))
    start = time.perf_counter()
    for iteration in range(1, num_iterations + 1):
        optimizer.param_groups[0]["lr"] = args.learning_rate * (1.0 - (iteration - 1.0) / num_iterations)
        episode_returns, episode_success = [], []

        # ---- rollout
        for step in range(t_len):
            images[step], proprios[step], dones[step] = next_image, next_proprio, next_done
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_image, next_proprio)
            values[step], actions[step], logprobs[step] = value.flatten(), action, logprob
            obs, reward, terminated, truncated, info = vec.step(action.reshape(n, *action_shape).numpy())
            reward = torch.as_tensor(reward, dtype=torch.float32)
            # a time limit is not a real end: bootstrap from the episode's last observation
            for i in np.flatnonzero(truncated & ~terminated):
                last_image, last_proprio = to_tensors({k: [v] for k, v in info["final_obs"][i].items()})
                with torch.no_grad():
                    reward[i] += args.gamma * agent.get_value(last_image, last_proprio).item()
            rewards[step] = reward
            next_image, next_proprio = to_tensors(obs)
            next_done = torch.as_tensor(terminated | truncated, dtype=torch.float32)
            if "episode" in info:
                ended = info["_episode"]
                episode_returns += info["episode"]["return"][ended].tolist()
                episode_success += info["episode"]["success"][ended].tolist()

        # ---- generalized advantage estimation
        with torch.no_grad():
            next_value = agent.get_value(next_image, next_proprio).flatten()
            advantages = torch.zeros_like(rewards)
            last_gae = 0.0
            for t in reversed(range(t_len)):
                not_done = 1.0 - (next_done if t == t_len - 1 else dones[t + 1])
                value_next = next_value if t == t_len - 1 else values[t + 1]
                delta = rewards[t] + args.gamma * value_next * not_done - values[t]
                advantages[t] = last_gae = delta + args.gamma * args.gae_lambda * not_done * last_gae
            returns = advantages + values

        # ---- PPO update on the flattened batch
        b_images, b_proprios = images.reshape(-1, h, w, 3), proprios.reshape(-1, p)
        b_actions, b_logprobs = actions.reshape(-1, action_dim), logprobs.reshape(-1)
        b_adv, b_returns = advantages.reshape(-1), returns.reshape(-1)
        batch_size = n * t_len
        minibatch_size = max(1, batch_size // args.num_minibatches)
        clip_fracs, approx_kl = [], torch.tensor(0.0)
        for _ in range(args.update_epochs):
            order = torch.randperm(batch_size)
            for begin in range(0, batch_size, minibatch_size):
                mb = order[begin : begin + minibatch_size]
                _, new_logprob, entropy, new_value = agent.get_action_and_value(
                    b_images[mb], b_proprios[mb], b_actions[mb]
                )
                log_ratio = new_logprob - b_logprobs[mb]
                ratio = log_ratio.exp()
                with torch.no_grad():
                    approx_kl = ((ratio - 1) - log_ratio).mean()
                    clip_fracs.append(((ratio - 1.0).abs() > args.clip_coef).float().mean().item())
                adv = b_adv[mb]
                adv = (adv - adv.mean()) / (adv.std() + 1e-8) if len(mb) > 1 else adv
                pg_loss = torch.max(
                    -adv * ratio, -adv * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
                ).mean()
                v_loss = 0.5 * ((new_value.flatten() - b_returns[mb]) ** 2).mean()
                loss = pg_loss - args.ent_coef * entropy.mean() + args.vf_coef * v_loss
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()

        stats = {
            "iteration": iteration,
            "env_steps": iteration * batch_size,
            "sps": round(iteration * batch_size / (time.perf_counter() - start), 1),
            "episodes": len(episode_returns),
            "return": float(np.mean(episode_returns)) if episode_returns else float("nan"),
            "success": float(np.mean(episode_success)) if episode_success else float("nan"),
            "pg_loss": pg_loss.item(),
            "v_loss": v_loss.item(),
            "approx_kl": approx_kl.item(),
            "clip_frac": float(np.mean(clip_fracs)),
        }
        history.append(stats)
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in stats.items()))
    vec.close()
    return history


def parse_args(argv: list[str] | None = None) -> Args:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in vars(Args()).items():
        kind = json.loads if isinstance(default, dict) else type(default)
        parser.add_argument("--" + name.replace("_", "-"), type=kind, default=default)
    return Args(**vars(parser.parse_args(argv)))


if __name__ == "__main__":  # the LIBERO simulators run in worker processes: scripts need the guard
    main(parse_args())

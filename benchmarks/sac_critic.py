"""What a SAC run's critic has learned about actions, and which term of the actor's loss drives it.

    python -m benchmarks.sac_critic runs/sac-Libero-Spatial-v0-s0-...        # newest checkpoint
    python -m benchmarks.sac_critic RUN --checkpoint RUN/checkpoints/iter_000020.pt --rows 2048

On a batch of the prior data's rows and one of the replay buffer's (the run's own chunks), from the
checkpoint's critics, actor and buffer: min-over-members Q of the stored chunk, of the actor's mean
chunk and of the mean plus Gaussian noise (``--noise``, in normalised action units); how often the
stored chunk scores above the mean; the spread of Q over states against its change under noise. Then
the norms of the actor-loss terms' gradients over the actor's weights, ``-Q(s, a ~ actor)`` and
``bc_coef x`` the imitation loss of the prior chunks, and their cosine. A critic that is close to a
state value (tiny change under noise, a coin between stored and mean chunks) gives the actor little
to follow; a large imitation gradient means the actor mostly clones the prior data (issue 31).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.report import table
from nets.errors import BadInput, program_name, run_cli
from trainers.checkpoint import latest_checkpoint, load_policy
from trainers.config import build
from trainers.env_factory import make_vec_env
from trainers.sac.algorithm import Learner, SACConfig
from trainers.sac.prior import load_prior
from trainers.sac.replay import Batch, ReplayBuffer


def _flat(grads: tuple[torch.Tensor | None, ...]) -> torch.Tensor:
    return torch.cat([g.reshape(-1) for g in grads if g is not None])


def _q_rows(
    policy: Any, learner: Learner, batch: Batch, noise: float, g: torch.Generator
) -> dict[str, float]:
    """Q of the stored chunks, of the actor's mean and of the mean plus noise, over one batch."""
    with torch.no_grad():
        q_stored = learner.q(batch.obs, batch.actions).min(0).values
        mean = policy.act(batch.obs, deterministic=True).actions.to(batch.actions.dtype)
        q_mean = learner.q(batch.obs, mean).min(0).values
        low = learner.action_center - learner.action_scale
        high = learner.action_center + learner.action_scale
        moved = mean + noise * learner.action_scale * torch.randn(mean.shape, generator=g)
        q_noisy = learner.q(batch.obs, torch.maximum(torch.minimum(moved, high), low)).min(0).values
    return {
        "q_stored": float(q_stored.mean()),
        "q_mean": float(q_mean.mean()),
        "q_noisy": float(q_noisy.mean()),
        "stored_above_mean": float((q_stored > q_mean).float().mean()),
        "q_spread_over_states": float(q_mean.std()),
        "q_change_under_noise": float((q_mean - q_noisy).std()),
    }


def _gradients(policy: Any, learner: Learner, batch: Batch, bc_coef: float) -> dict[str, float]:
    """Norms of the actor-loss terms' gradients over the actor's weights, and their cosine."""
    params = [p for p in policy.parameters() if p.requires_grad]
    actions, _ = policy.rsample(batch.obs)
    q_term = -learner.q(batch.obs, actions).min(0).values.mean()
    g_q = _flat(torch.autograd.grad(q_term, params, allow_unused=True))
    out = {"grad_q": float(g_q.norm())}
    if bc_coef > 0:
        bc = bc_coef * policy.imitation_loss(batch.obs, batch.actions)
        g_bc = _flat(torch.autograd.grad(bc, params, allow_unused=True))
        out["grad_bc"] = float(g_bc.norm())
        out["cosine"] = float(torch.nn.functional.cosine_similarity(g_q, g_bc, dim=0))
    return out


def diagnose(
    run_dir: str | Path,
    checkpoint: str | Path | None = None,
    rows: int = 1024,
    noise: float = 0.1,
    seed: int = 0,
) -> dict[str, dict[str, float]]:
    """``{"prior": {...}, "online": {...}}`` for a SAC run folder (its newest checkpoint by default)."""
    run_dir = Path(run_dir)
    configs = json.loads((run_dir / "config.json").read_text())
    if configs.get("algo", "sac") != "sac" or "sac" not in configs:
        raise BadInput(f"{run_dir}: expected a SAC run folder (config.json with a 'sac' section)")
    run, config = configs["run"], build(SACConfig, configs["sac"])
    env = make_vec_env(run["env"], 1, run.get("env_kwargs") or {})
    obs_space, action_space = env.single_observation_space, env.single_action_space
    env.close()
    path, data = latest_checkpoint(checkpoint or run_dir)
    policy = load_policy(path, obs_space, action_space)
    if getattr(policy, "sac_action_space", action_space) is not action_space:
        raise BadInput(f"{run_dir}: a DSRL run's critics score noise, not the env's chunks: not handled here")
    obs_norm = getattr(policy, "obs_norm", "off")
    learner = Learner(
        obs_space, action_space, config, obs_norm if config.critic_obs_norm == "actor" else "fixed"
    )
    learner.load_state_dict(data["extra"]["learner"])
    shape = tuple(learner.action_center.shape)
    buffer = ReplayBuffer(obs_space, shape, config.buffer_size)
    buffer.load_state_dict(data["extra"]["buffer"])
    g = torch.Generator().manual_seed(seed)
    batches = {"online": buffer.sample(min(rows, len(buffer)), g, "cpu")}
    if config.prior_data:
        prior = load_prior(config.prior_data, obs_space, shape, config.gamma, config.n_step)
        batches = {"prior": prior.sample(min(rows, len(prior)), g, "cpu"), **batches}
    out = {}
    for name, batch in batches.items():
        out[name] = {
            **_q_rows(policy, learner, batch, noise, g),
            **_gradients(policy, learner, batch, config.bc_coef if name == "prior" else 0.0),
        }
    return out


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(
        prog=program_name(), description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run_dir", help="a SAC run folder")
    parser.add_argument("--checkpoint", help="one of its checkpoints (default: the newest)")
    parser.add_argument("--rows", type=int, default=1024, help="rows per batch")
    parser.add_argument(
        "--noise", type=float, default=0.1, help="std of the noise on the mean (normalised units)"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.rows < 1 or not args.noise > 0:
        parser.error(f"--rows must be >= 1 and --noise > 0, got {args.rows} and {args.noise}")
    result = diagnose(args.run_dir, args.checkpoint, args.rows, args.noise, args.seed)
    keys = list(next(iter(result.values())))
    header = ["rows", *[k.replace("_", " ") for k in keys]]
    print(
        table(
            header,
            [[name, *[np.round(r.get(k, float("nan")), 4) for k in keys]] for name, r in result.items()],
        )
    )
    return result


if __name__ == "__main__":
    run_cli(main)

"""FSDP2 data parallel (``--data-parallel fsdp``, ``trainers/parallel.py``) on CPU with gloo.

As in ``tests/test_trainers_parallel.py`` (whose fixed CartPole rollouts these tests share),
two spawned ranks each update on half of the envs, and their weights must equal those of the
single-process update over the whole rollout (one minibatch per epoch). The policy is sharded
at the root alone (the small policies' case) or, in addition, in two sub-units (``fsdp_units``).
"""

from __future__ import annotations

import datetime
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.test_trainers_parallel import (
    FAST,
    WORLD,
    _assert_close,
    _grpo_rollout,
    _policy,
    _ppo_rollout,
    _run_update,
    _torchrun,
)
from trainers import checkpoint as ckpt
from trainers import parallel
from trainers.grpo import GRPOConfig, grpo_update, select_envs
from trainers.grpo import make_optimizer as grpo_optimizer
from trainers.metrics import read_metrics
from trainers.parallel import Evaluate
from trainers.ppo import PPOConfig, make_optimizer, ppo_update
from trainers.run import RunConfig

PPO = dict(n_steps=24, batch_size=4096, n_epochs=3, ent_coef=0.01, clip_value=0.2, learning_rate=1e-3)
GRPO = dict(group_size=2, learning_rate=1e-2, loss_agg="traj_mean", kl_beta=0.05, log_prob_level="chunk")


def _fsdp_update(algo: str, kwargs: dict, envs: range, units: bool, dtype, checkpointing: bool) -> dict:
    """``_run_update`` with the policy sharded by FSDP (before its optimizer is built); the rollout
    is collected inside ``gathered`` (whole parameters for ``policy.act``)."""
    policy = _policy(critic=algo == "ppo")
    if units:  # the torsos as FSDP units of their own, as a VLA's transformer blocks would be
        policy.fsdp_units = lambda: [policy.torso, *([policy.critic_torso] if algo == "ppo" else [])]
    generator = torch.Generator().manual_seed(5 + parallel.rank())
    root = parallel.fully_shard_policy(policy, dtype, checkpointing)
    before = {k: v.detach().clone() for k, v in parallel.full_state(root, policy)[0].items()}
    with parallel.gathered(root):
        if algo == "ppo":
            config = PPOConfig(**kwargs)
            rollout = select_envs([(_ppo_rollout(policy), envs)])
        else:
            config = GRPOConfig(**kwargs)
            rollout = select_envs([(_grpo_rollout(policy, config.group_size), envs)])
    if algo == "ppo":
        optimizer = make_optimizer(policy, config)
        metrics = [ppo_update(policy, optimizer, rollout, config, generator=generator, evaluator=root)]
    else:
        ref = _policy(critic=False).requires_grad_(False)
        optimizer = grpo_optimizer(policy, config)
        metrics = [
            grpo_update(
                policy, optimizer, rollout, config, ref_policy=ref, generator=generator, evaluator=root
            )
            for _ in range(2)
        ]
    state, optim = parallel.full_state(root, policy, optimizer)
    return {"state": state, "before": before, "optimizer": optim, "metrics": metrics}


def _worker(
    rank: int, store: str, out_dir: str, algo: str, kwargs: dict, units: bool, dtype, ac: bool
) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD,
        timeout=datetime.timedelta(seconds=60),
    )  # fmt: skip
    try:
        share = parallel.shard(4 if algo == "ppo" else 8, rank, WORLD)
        out = _fsdp_update(algo, kwargs, share, units, dtype, ac)
        torch.save(out, Path(out_dir) / f"rank{rank}.pt")
    finally:
        parallel.shutdown()  # a barrier first: see its docstring


def _two_ranks(tmp_path, algo: str, kwargs: dict, units: bool = False, dtype=None, ac: bool = False) -> dict:
    args = (str(tmp_path / "store"), str(tmp_path), algo, kwargs, units, dtype, ac)
    mp.spawn(_worker, args=args, nprocs=WORLD)
    return torch.load(tmp_path / "rank0.pt")  # the full states are gathered to rank 0


@pytest.mark.parametrize("units", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["root", "units"])
def test_fsdp_ppo_update_over_two_ranks_equals_the_single_process_update(tmp_path, units):
    sharded = _two_ranks(tmp_path, "ppo", PPO, units=units)
    single = _run_update("ppo", PPO, None)
    _assert_close(sharded["state"], single["state"], atol=1e-6)
    for key in ("loss", "policy_loss", "value_loss", "approx_kl", "samples"):
        assert sharded["metrics"][0][key] == pytest.approx(single["metrics"][0][key], rel=1e-5, abs=1e-7)
    # the optimizer state comes back in Optimizer.state_dict form, indexed as in one process
    params = len(list(_policy(critic=True).parameters()))
    assert sorted(sharded["optimizer"]["state"]) == list(range(params))
    assert all(
        s["exp_avg"].shape == p.shape
        for s, p in zip(sharded["optimizer"]["state"].values(), _policy(True).parameters())
    )


@pytest.mark.slow
def test_fsdp_grpo_update_over_two_ranks_equals_the_single_process_update(tmp_path):
    # sub-units: during the rollout (inside gathered) the ranks call act different numbers of
    # times (episodes until all done), with no collective in between; rank 1 has no rows
    sharded = _two_ranks(tmp_path, "grpo", GRPO, units=True)
    single = _run_update("grpo", GRPO, None)
    _assert_close(sharded["state"], single["state"], atol=1e-6)
    for key in ("loss", "policy_loss", "kl_ref", "samples"):
        assert sharded["metrics"][1][key] == pytest.approx(single["metrics"][1][key], rel=1e-5, abs=1e-7)


@pytest.mark.slow
def test_fsdp_bf16_and_activation_checkpointing_update(tmp_path):
    # no equality claim: bfloat16 compute; the weights (kept in float32) move and stay finite
    sharded = _two_ranks(tmp_path, "ppo", PPO, units=True, dtype=torch.bfloat16, ac=True)
    before, after = sharded["before"], sharded["state"]
    params = dict(_policy(critic=True).named_parameters())
    assert all(after[k].dtype == torch.float32 and torch.isfinite(after[k]).all() for k in params)
    assert max((after[k] - before[k]).abs().max() for k in params) > 1e-4
    assert np.isfinite(sharded["metrics"][0]["loss"])


def test_bad_data_parallel_options_are_refused():
    with pytest.raises(ValueError, match=r"data_parallel must be one of \['ddp', 'fsdp'\], got 'zero'"):
        RunConfig(data_parallel="zero")
    with pytest.raises(ValueError, match=r"fsdp_param_dtype must be one of \['bfloat16'"):
        RunConfig(data_parallel="fsdp", fsdp_param_dtype="float64")  # "bf16" is read as bfloat16
    with pytest.raises(ValueError, match="need data_parallel='fsdp'"):
        RunConfig(activation_checkpointing=True)
    assert RunConfig(data_parallel="fsdp", fsdp_param_dtype="bfloat16").fsdp_param_dtype == "bfloat16"


def test_fsdp_options_in_one_process_train_the_plain_policy_with_a_warning(tmp_path):
    from trainers.ppo import train as ppo_train

    args = ["--total-steps", "256", "--n-steps", "32", "--eval-episodes", "1", "--run-dir", str(tmp_path)]
    with pytest.warns(RuntimeWarning, match="a single process trains the plain policy"):
        final = ppo_train.main([*args, "--data-parallel", "fsdp", "--fsdp-param-dtype", "bfloat16", *FAST])
    assert np.isfinite(final["train/loss"])


@pytest.mark.slow
def test_torchrun_fsdp_ppo_checkpoints_then_resumes_on_one_rank_and_evaluates(tmp_path):
    from trainers.ppo import train as ppo_train

    run_dir = tmp_path / "run"
    stdout = _torchrun(
        "-m", "trainers.ppo", "--env", "CartPole-v1", "--num-envs", "4", "--total-steps", "512",
        "--n-steps", "64", "--batch-size", "64", "--checkpoint-every", "1", "--eval-episodes", "3",
        "--data-parallel", "fsdp", "--run-dir", str(run_dir), *FAST,
    )  # fmt: skip
    assert stdout.count("summary: ") == 1
    path, data = ckpt.latest_checkpoint(run_dir)
    assert path.name == "iter_000002.pt" and data["counters"]["env_steps"] == 512
    assert len((run_dir / "eval_episodes.jsonl").read_text().splitlines()) == 3
    # the single-file format with full tensors: a plain policy loads it
    space = gym.make("CartPole-v1")
    policy = ckpt.load_policy(path, space.observation_space, space.action_space)
    assert policy.state_dict().keys() == data["policy"]["state_dict"].keys()
    state = data["optimizer"]["state"]
    assert sorted(state) == list(range(len(list(policy.parameters()))))
    assert all(s["exp_avg"].shape == p.shape for s, p in zip(state.values(), policy.parameters()))

    # resumed in one process (world size 1: plain policy) from the 2-rank fsdp checkpoint
    final = ppo_train.main(["--resume", str(run_dir), "--total-steps", "768", "--eval-episodes", "2", *FAST])
    assert np.isfinite(final["train/loss"]) and np.isfinite(final["eval/return"])
    _, resumed = ckpt.latest_checkpoint(run_dir)
    assert resumed["counters"]["iteration"] == 3 and resumed["counters"]["env_steps"] == 768
    assert resumed["optimizer"]["state"][0]["step"] > data["optimizer"]["state"][0]["step"]
    assert [r["iteration"] for r in read_metrics(run_dir) if "train/loss" in r] == [1, 2, 3]

    # and back onto two fsdp ranks: weights loaded before sharding, optimizer state into the shards
    stdout = _torchrun(
        "-m", "trainers.ppo", "--resume", str(run_dir), "--total-steps", "1024", "--eval-every", "-1",
        "--data-parallel", "fsdp", *FAST,
    )  # fmt: skip
    assert "resumed from" in stdout and stdout.count("summary: ") == 1
    _, again = ckpt.latest_checkpoint(run_dir)
    assert again["counters"]["iteration"] == 4 and again["counters"]["env_steps"] == 1024
    # Adam's step counts went on from the loaded ones (not from a fresh optimizer)
    updates = [r["train/updates"] for r in read_metrics(run_dir) if "train/updates" in r][-1]
    start = resumed["optimizer"]["state"][0]["step"]
    assert {float(s["step"]) for s in again["optimizer"]["state"].values()} == {float(start) + updates}


def _round_trip_worker(rank: int, store: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        saved = torch.load(Path(out_dir) / "single.pt")
        policy = _policy(critic=True)
        policy.load_state_dict(saved["policy"])
        policy.fsdp_units = lambda: [policy.torso]
        root = parallel.fully_shard_policy(policy)
        optimizer = make_optimizer(policy, PPOConfig())
        parallel.load_optimizer_state(root, policy, optimizer, saved["optimizer"])
        torch.save(parallel.full_state(root, policy, optimizer), Path(out_dir) / f"rank{rank}.pt")
    finally:
        parallel.shutdown()  # a barrier first: see its docstring


@pytest.mark.slow
def test_fsdp_loads_and_gives_back_a_single_process_checkpoint_state(tmp_path):
    # a single-process policy and Adam state (after two steps) go into the shards and come back whole
    policy = _policy(critic=True)
    optimizer = make_optimizer(policy, PPOConfig())
    for _ in range(2):
        optimizer.zero_grad()
        sum(p.square().sum() for p in policy.parameters()).backward()
        optimizer.step()
    single = {"policy": policy.state_dict(), "optimizer": optimizer.state_dict()}
    torch.save(single, tmp_path / "single.pt")
    mp.spawn(_round_trip_worker, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=WORLD)
    model, optim = torch.load(tmp_path / "rank0.pt")
    _assert_close(model, single["policy"], atol=0)
    tuples = lambda groups: [{k: tuple(v) if k == "betas" else v for k, v in g.items()} for g in groups]  # noqa: E731
    assert tuples(optim["param_groups"]) == single["optimizer"]["param_groups"]  # (a list from DCP)
    for i, state in single["optimizer"]["state"].items():
        _assert_close(optim["state"][i], state, atol=0)
    assert torch.load(tmp_path / "rank1.pt") == ({}, {})  # gathered to rank 0 only


# ---------------------------------------------------------------------- tiny VLAs
def _vla(name: str, folder: str):
    """A tiny pi0.5 (sharded at the root only) or OpenVLA-OFT (vision blocks and LLaMA layers as
    FSDP units), built from the checkpoint in ``folder``."""
    torch.manual_seed(0)  # heads not in the checkpoint (pi0.5's value head) are drawn at random
    if name == "pi05":
        from policies.pi05 import Pi05Policy
        from tests.test_pi05 import ACT_SPACE, KW, OBS_SPACE

        policy = Pi05Policy(OBS_SPACE, ACT_SPACE, model_path=folder, **KW)
    else:
        from tests.test_openvla_oft import _policy

        policy = _policy(folder, freeze_vision=False)
    policy.seed(0)
    return policy


def _vla_obs(name: str) -> dict:
    if name == "pi05":
        from tests.test_pi05 import _obs

        return _obs(4)
    from tests.test_openvla_oft import INSTRUCTIONS, _obs

    return _obs((*INSTRUCTIONS, INSTRUCTIONS[0]))


def _vla_step(policy, evaluator, replay: dict, rows: int) -> None:
    """One SGD step on minus the mean log-prob over ``rows`` rows of all ranks (FSDP averages the
    ranks' gradients: each rank's share is scaled by the world size)."""
    optimizer = torch.optim.SGD([p for p in policy.parameters() if p.requires_grad], lr=0.1)
    (out,) = parallel.evaluate(evaluator, replay)
    loss = -out.log_probs.sum() / (rows * out.log_probs[0].numel()) * parallel.world_size()
    loss.backward()
    optimizer.step()


def _vla_worker(rank: int, store: str, out_dir: str, name: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        data = torch.load(Path(out_dir) / "single.pt")
        policy = _vla(name, data["folder"])
        root = parallel.fully_shard_policy(policy)
        with parallel.gathered(root):  # whole weights for act; rank 0 acts twice, rank 1 once
            acted = [policy.act(_vla_obs(name)).actions for _ in range(2 - rank)]
        share = parallel.shard(4, rank, WORLD)
        _vla_step(policy, root, {k: v[share.start : share.stop] for k, v in data["replay"].items()}, 4)
        torch.save(
            {"acted": acted[0], "state": parallel.full_state(root, policy)[0]},
            Path(out_dir) / f"rank{rank}.pt",
        )
    finally:
        parallel.shutdown()  # a barrier first: see its docstring


@pytest.mark.slow
@pytest.mark.parametrize("name", ["pi05", "openvla_oft"])
def test_fsdp_update_of_a_tiny_vla_over_two_ranks_equals_the_single_process_update(tmp_path, name):
    if name == "pi05":
        from policies.pi05.tiny import write_tiny_pi05 as write
    else:
        from policies.openvla_oft.tiny import write_tiny_openvla as write

    folder = str(write(tmp_path / name))
    policy = _vla(name, folder)
    assert (len(parallel.fsdp_units(policy)) > 0) == (name == "openvla_oft")
    out = policy.act(_vla_obs(name))
    torch.save({"folder": folder, "replay": out.replay}, tmp_path / "single.pt")
    _vla_step(policy, Evaluate(policy), out.replay, 4)
    mp.spawn(_vla_worker, args=(str(tmp_path / "store"), str(tmp_path), name), nprocs=WORLD)
    sharded = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    for r in sharded:  # act with the gathered weights samples what the plain policy sampled
        assert torch.equal(r["acted"], out.actions)
    _assert_close(sharded[0]["state"], policy.state_dict(), atol=1e-6)
    start = _vla(name, folder).state_dict()
    assert (
        max((policy.state_dict()[k] - v).abs().max() for k, v in start.items() if v.is_floating_point())
        > 1e-4
    )


@pytest.mark.slow
def test_torchrun_fsdp_grpo_with_a_reference_policy_then_fsdp_at_world_size_one(tmp_path):
    from trainers import __main__ as cli

    run_dir = tmp_path / "run"
    grpo = ["--group-size", "2", "--learning-rate", "3e-3", "--log-prob-level", "chunk", "--kl-beta", "0.05"]
    stdout = _torchrun(
        "-m", "trainers", "--algo", "grpo", "--env", "CartPole-v1", "--num-envs", "8", *grpo,
        "--max-iterations", "2", "--total-steps", "100000", "--eval-episodes", "3",
        "--data-parallel", "fsdp", "--run-dir", str(run_dir), *FAST,
    )  # fmt: skip
    assert stdout.count("summary: ") == 1
    _, data = ckpt.latest_checkpoint(run_dir)
    assert data["counters"]["iteration"] == 2
    # the reference policy is the unsharded initial copy: plain tensors, the policy's names
    assert data["extra"]["ref_policy"].keys() == data["policy"]["state_dict"].keys()
    # --data-parallel fsdp in one process is the plain single-process run
    final = cli.main(["--resume", str(run_dir), "--max-iterations", "3", "--data-parallel", "fsdp", *FAST])
    assert np.isfinite(final["train/loss"]) and np.isfinite(final["eval/return"])
    for key, value in data["extra"]["ref_policy"].items():
        assert torch.equal(value, ckpt.latest_checkpoint(run_dir)[1]["extra"]["ref_policy"][key])

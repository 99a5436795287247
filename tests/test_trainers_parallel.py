"""Data-parallel PPO and GRPO (``trainers/parallel.py``) on CPU with the gloo backend.

Two processes share a rollout collected from CartPole, each taking half of the envs (whole GRPO
groups); their DDP update must give the weights of the single-process update on the whole rollout.
That is exact (up to float summation order) when every minibatch is the whole batch: with several
shuffled minibatches the two runs draw different minibatches, so there the test checks that the
ranks stay in step (same number of updates, same early stop, identical weights). Self-imitation
buffers gather every rank's rows, so with a generator common to both runs for the imitation rows
the 2-rank update with them is exact too. The end-to-end tests run ``torchrun`` (``python -m
torch.distributed.run``) on the trainers' command lines.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from policies.registry import make_policy
from trainers import checkpoint as ckpt
from trainers import parallel
from trainers.grpo import GRPOConfig, group_seeds, grpo_update, select_envs
from trainers.grpo import make_optimizer as grpo_optimizer
from trainers.metrics import read_metrics
from trainers.ppo import PPOConfig, make_optimizer, ppo_update
from trainers.rollout import Collector, Rollout
from trainers.self_imitation import SuccessBuffer

WORLD = 2
ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------- a fixed rollout
def _policy(critic: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    space = gym.make("CartPole-v1")
    policy = make_policy("categorical", space.observation_space, space.action_space, use_critic=critic)
    policy.seed(1)
    return policy


def _ppo_rollout(policy) -> Rollout:
    env = gym.make_vec("CartPole-v1", 4, vectorization_mode="sync")
    collector = Collector(env, policy)
    collector.reset(seed=3)
    return collector.collect(24)


def _grpo_rollout(policy, group_size: int) -> Rollout:
    env = gym.make_vec("CartPole-v1", 8, vectorization_mode="sync")
    collector = Collector(env, policy, bootstrap="none")
    collector.reset(seed=group_seeds(7, 8, group_size))
    rollout = collector.collect(300, until_all_done=True)
    rollout.rewards[:, 4:] *= 0.0  # the second half's groups carry no signal: rank 1 has no rows
    return rollout


SIL_CAPACITY = 150


def _sil_buffer(rollout: Rollout) -> SuccessBuffer:
    """Every rank adds its envs' long first episodes (``add`` gathers them over the ranks), then
    the short ones: the second add overflows the capacity, so FIFO drops rows after a gather.
    Each env's rows carry a weight of their own (its episode's length / 100), gathered with them."""
    buffer = SuccessBuffer(SIL_CAPACITY)
    lengths = rollout.first_episode.any(-1).sum(0)  # not the scores: rank 1's rewards are zeroed
    buffer.add(rollout, lengths > 20, lengths / 100.0)
    buffer.add(rollout, lengths <= 20, lengths / 100.0)
    return buffer


def _run_update(
    algo: str, kwargs: dict, rollout_envs: range | None, sil: bool = False, sil_seed: int | None = None
) -> dict:
    """One update (PPO) or two (GRPO) of the fixed rollout's envs ``rollout_envs`` (all: None),
    with the policy wrapped by ``parallel.data_parallel`` (plain at world size 1). ``sil``: with
    a self-imitation buffer (returned as ``"sil"``), its rows drawn from a generator seeded with
    ``sil_seed`` (None: ``grpo_update``'s default)."""
    torch.set_num_threads(1)
    policy = _policy(critic=algo == "ppo")
    generator = torch.Generator().manual_seed(5 + parallel.rank())
    if algo == "ppo":
        rollout = _ppo_rollout(policy)
        if rollout_envs is not None:
            rollout = select_envs([(rollout, rollout_envs)])
        config = PPOConfig(**kwargs)
        optimizer = make_optimizer(policy, config)
        evaluator = parallel.data_parallel(policy)
        metrics = [ppo_update(policy, optimizer, rollout, config, generator=generator, evaluator=evaluator)]
    else:
        config = GRPOConfig(**kwargs)
        rollout = _grpo_rollout(policy, config.group_size)
        if rollout_envs is not None:
            rollout = select_envs([(rollout, rollout_envs)])
        ref = _policy(critic=False).requires_grad_(False)
        buffer = _sil_buffer(rollout) if sil else None
        sil_generator = torch.Generator().manual_seed(sil_seed) if sil_seed is not None else None
        optimizer = grpo_optimizer(policy, config)
        evaluator = parallel.data_parallel(policy)
        metrics = [
            grpo_update(
                policy,
                optimizer,
                rollout,
                config,
                ref_policy=ref,
                generator=generator,
                sil=buffer,
                evaluator=evaluator,
                sil_generator=sil_generator,
            )
            for _ in range(2)
        ]
    state = {k: v.detach().clone() for k, v in policy.state_dict().items()}
    out = {"state": state, "metrics": metrics}
    if sil:
        out["sil"] = buffer.state_dict()
    return out


def _worker(
    rank: int, store: str, out_dir: str, algo: str, kwargs: dict, sil: bool, sil_seed: int | None
) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=60),
    )
    try:
        envs = 4 if algo == "ppo" else 8
        share = parallel.shard(envs, rank, WORLD)
        torch.save(_run_update(algo, kwargs, share, sil, sil_seed), Path(out_dir) / f"rank{rank}.pt")
    finally:
        parallel.shutdown()  # a barrier first: see its docstring


def _two_ranks(
    tmp_path, algo: str, kwargs: dict, sil: bool = False, sil_seed: int | None = None
) -> list[dict]:
    args = (str(tmp_path / "store"), str(tmp_path), algo, kwargs, sil, sil_seed)
    mp.spawn(_worker, args=args, nprocs=WORLD)
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]


def _assert_close(a: dict, b: dict, atol: float) -> None:
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=atol, rtol=0, msg=key)


# ---------------------------------------------------------------------- updates
def test_ppo_update_over_two_ranks_equals_the_single_process_update(tmp_path):
    # one minibatch (batch_size >= all rows) per epoch: the same batch in both runs; minibatch
    # advantage normalization, value clipping and the entropy bonus all over the whole batch
    kwargs = dict(n_steps=24, batch_size=4096, n_epochs=3, ent_coef=0.01, clip_value=0.2, learning_rate=1e-3)
    ranks = _two_ranks(tmp_path, "ppo", kwargs)
    single = _run_update("ppo", kwargs, None)
    for r in ranks:
        _assert_close(r["state"], single["state"], atol=1e-6)
    start = dict(_policy(critic=True).named_parameters())
    assert max((single["state"][k] - p).abs().max() for k, p in start.items()) > 1e-4  # it learned
    one, both = single["metrics"][0], ranks[0]["metrics"][0]
    for key in ("loss", "policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "samples"):
        assert both[key] == pytest.approx(one[key], rel=1e-5, abs=1e-7), key
    assert both["explained_variance"] == pytest.approx(one["explained_variance"], rel=1e-6)
    assert ranks[1]["metrics"] == ranks[0]["metrics"]


@pytest.mark.slow
def test_grpo_update_over_two_ranks_equals_the_single_process_update(tmp_path):
    # rank 1's groups all carry no signal: it has no rows and still steps with rank 0; traj_mean
    # weights and the reference KL divide by counts over both ranks
    kwargs = dict(
        group_size=2, learning_rate=1e-2, loss_agg="traj_mean", kl_beta=0.05, log_prob_level="chunk"
    )
    ranks = _two_ranks(tmp_path, "grpo", kwargs)
    single = _run_update("grpo", kwargs, None)
    for r in ranks:
        _assert_close(r["state"], single["state"], atol=1e-6)
    assert single["metrics"][1]["groups_kept"] == ranks[0]["metrics"][1]["groups_kept"] <= 0.5
    for key in ("loss", "policy_loss", "kl_ref", "approx_kl", "score_mean", "samples"):
        assert ranks[0]["metrics"][1][key] == pytest.approx(single["metrics"][1][key], rel=1e-5, abs=1e-7)
    assert ranks[0]["metrics"] == ranks[1]["metrics"]


def _assert_same_buffer(a: dict, b: dict) -> None:
    assert a["replay"].keys() == b["replay"].keys()
    for key in a["replay"]:
        assert torch.equal(a["replay"][key], b["replay"][key]), key
    assert torch.equal(a["valid"], b["valid"]) and torch.equal(a["weights"], b["weights"])


@pytest.mark.slow
def test_grpo_self_imitation_over_two_ranks_equals_the_single_process_update(tmp_path):
    # both ranks add successes; the buffer gathered on each rank is the single process's (same
    # rows, same order, FIFO cap included), and the ranks' shares of each minibatch's imitation rows
    # are the rows one process draws with the same generator. Rank 1 has no policy-gradient rows
    # (its groups carry no signal) but imitates its share.
    kwargs = dict(group_size=2, learning_rate=1e-2, n_epochs=3, sil_coef=0.5, sil_capacity=SIL_CAPACITY)
    ranks = _two_ranks(tmp_path, "grpo", kwargs, sil=True, sil_seed=9)
    single = _run_update("grpo", kwargs, None, sil=True, sil_seed=9)
    assert len(single["sil"]["valid"]) == SIL_CAPACITY  # the cap applied
    for r in ranks:
        _assert_same_buffer(r["sil"], single["sil"])
        _assert_close(r["state"], single["state"], atol=1e-6)
    start = dict(_policy(critic=False).named_parameters())
    assert max((single["state"][k] - p).abs().max() for k, p in start.items()) > 1e-4  # it learned
    for key in ("loss", "policy_loss", "sil_loss", "samples", "updates"):
        assert ranks[0]["metrics"][1][key] == pytest.approx(single["metrics"][1][key], rel=1e-5, abs=1e-7)
    assert single["metrics"][1]["sil_loss"] != 0.0
    assert ranks[0]["metrics"] == ranks[1]["metrics"]

    # rank 0's buffer (what its checkpoint holds) resumes in one process as the single process's
    resumed = SuccessBuffer(SIL_CAPACITY)
    resumed.load_state_dict(ranks[0]["sil"])
    _assert_same_buffer(resumed.state_dict(), single["sil"])
    alone = SuccessBuffer(SIL_CAPACITY)
    alone.load_state_dict(single["sil"])
    drawn = [b.sample(50, torch.Generator().manual_seed(3)) for b in (resumed, alone)]
    assert torch.equal(drawn[0][1], drawn[1][1])
    for key, value in drawn[0][0].items():
        assert torch.equal(value, drawn[1][0][key]), key


@pytest.mark.slow
def test_ranks_stay_in_step_over_shuffled_minibatches_and_early_stop(tmp_path):
    # several minibatches: the ranks draw their own, so only agreement between ranks is checked
    kwargs = dict(n_steps=24, batch_size=10, n_epochs=10, target_kl=0.002, learning_rate=3e-3)
    ppo = _two_ranks(tmp_path, "ppo", kwargs)
    assert ppo[0]["metrics"][0]["early_stop"] == 1.0 and 1 <= ppo[0]["metrics"][0]["updates"] < 100
    grpo_kwargs = dict(
        group_size=2, learning_rate=0.05, batch_size=8, n_epochs=6, target_kl=0.01, sil_coef=0.5
    )
    grpo = _two_ranks(tmp_path, "grpo", grpo_kwargs, sil=True)  # a common SIL stream seeded by rank 0
    assert grpo[0]["metrics"][0]["sil_loss"] != 0.0
    _assert_same_buffer(grpo[0]["sil"], grpo[1]["sil"])
    for runs in (ppo, grpo):
        assert runs[0]["metrics"] == runs[1]["metrics"]
        for key, value in runs[0]["state"].items():
            assert torch.equal(value, runs[1]["state"][key]), key


# ---------------------------------------------------------------------- torchrun, end to end
FAST = ["--no-progress", "--no-video", "--torch-threads", "1"]


def _torchrun(*args: str, timeout: float = 120) -> str:
    """``torchrun --nproc-per-node 2`` (as ``python -m torch.distributed.run``) on this checkout."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    # --standalone: the rendezvous on a free port (other tests may run torchrun at the same time)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(WORLD),
        *args,
    ]
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def _only_rank0_wrote(run_dir: Path, stdout: str, iterations: int) -> None:
    # every rank writing would double the appended logs, add a second TensorBoard event file
    # (each writer names its own) and print the summary twice
    rows = read_metrics(run_dir)
    assert [r["iteration"] for r in rows if "train/loss" in r] == list(range(1, iterations + 1))
    assert len(list((run_dir / "tb").glob("events.out.tfevents.*"))) == 1
    assert stdout.count("summary: ") == 1


@pytest.mark.slow
def test_torchrun_ppo_checkpoints_then_resumes_on_one_rank_and_evaluates(tmp_path):
    from trainers.evaluation import evaluate_episodes
    from trainers.ppo import train as ppo_train

    run_dir = tmp_path / "run"
    common = ["--n-steps", "64", "--batch-size", "64", "--checkpoint-every", "2", "--eval-episodes", "5"]
    stdout = _torchrun(
        "-m", "trainers.ppo", "--env", "CartPole-v1", "--num-envs", "4", "--total-steps", "1024",
        *common, "--run-dir", str(run_dir), *FAST,
    )  # fmt: skip
    _only_rank0_wrote(run_dir, stdout, iterations=4)  # 4 x 64 steps x 4 envs
    path, data = ckpt.latest_checkpoint(run_dir)
    assert path.name == "iter_000004.pt" and data["counters"]["env_steps"] == 1024
    assert [p.name for p in ckpt.checkpoint_paths(run_dir)] == ["iter_000002.pt", "iter_000004.pt"]

    # the split evaluation equals a single-process one of the same weights (deterministic policy)
    evaluated = [json.loads(line) for line in (run_dir / "eval_episodes.jsonl").read_text().splitlines()]
    space = gym.make("CartPole-v1")
    policy = ckpt.load_policy(path, space.observation_space, space.action_space)
    env = gym.make_vec("CartPole-v1", 4, vectorization_mode="sync")
    single = evaluate_episodes(policy, env, 5, seed=10**6)
    assert [e["return"] for e in evaluated] == [e["return"] for e in single]

    # the same run goes on in one process: weights, optimizer and counters from the 2-rank checkpoint
    final = ppo_train.main(["--resume", str(run_dir), "--total-steps", "1536", "--eval-every", "-1", *FAST])
    assert np.isfinite(final["train/loss"])
    _, resumed = ckpt.latest_checkpoint(run_dir)
    assert resumed["counters"]["iteration"] == 6 and resumed["counters"]["env_steps"] == 1536
    assert resumed["optimizer"]["state"][0]["step"] > data["optimizer"]["state"][0]["step"]
    assert [r["iteration"] for r in read_metrics(run_dir) if "train/loss" in r] == list(range(1, 7))


@pytest.mark.slow
def test_torchrun_grpo_checkpoints_resumes_on_one_rank_then_on_two(tmp_path):
    from trainers import __main__ as cli

    run_dir = tmp_path / "run"
    grpo = ["--group-size", "2", "--learning-rate", "3e-3", "--log-prob-level", "chunk", "--kl-beta", "0.05"]
    grpo += ["--sil-coef", "0.5"]
    stdout = _torchrun(
        "-m", "trainers", "--algo", "grpo", "--env", "CartPole-v1", "--num-envs", "8", *grpo,
        "--max-iterations", "3", "--total-steps", "100000", "--checkpoint-every", "2",
        "--eval-episodes", "3", "--run-dir", str(run_dir), *FAST,
    )  # fmt: skip
    _only_rank0_wrote(run_dir, stdout, iterations=3)
    rows = read_metrics(run_dir)
    assert rows[0]["env/episodes"] == 8  # every rank's first episodes, gathered
    path, data = ckpt.latest_checkpoint(run_dir)
    assert data["counters"]["iteration"] == 3 and "ref_policy" in data["extra"]
    # env steps count both ranks' envs: at least the 8 first episodes of each iteration (a round
    # runs until every env of the rank finished one)
    assert data["counters"]["env_steps"] >= sum(r["env/return"] * r["env/episodes"] for r in rows[:3])
    assert len((run_dir / "eval_episodes.jsonl").read_text().splitlines()) == 3
    # the checkpoint holds the buffer of both ranks: the length logged (the ranks' mean) is its own
    sil = data["extra"]["sil"]["valid"]
    assert len(sil) == [r["rollout/sil_buffer"] for r in rows if "rollout/sil_buffer" in r][-1] > 0

    final = cli.main(["--resume", str(run_dir), "--max-iterations", "4", "--eval-every", "-1", *FAST])
    assert np.isfinite(final["train/loss"])
    _, resumed = ckpt.latest_checkpoint(run_dir)
    assert resumed["counters"]["iteration"] == 4
    for key, value in data["extra"]["ref_policy"].items():  # the frozen reference policy carries over
        assert torch.equal(value, resumed["extra"]["ref_policy"][key])
    assert torch.equal(resumed["extra"]["sil"]["valid"][: len(sil)], sil)  # and the buffer, appended to

    # and back onto two ranks: both load the 1-rank checkpoint and train on from it
    stdout = _torchrun("-m", "trainers.grpo", "--resume", str(run_dir), "--max-iterations", "5", *FAST)
    assert "resumed from" in stdout and stdout.count("summary: ") == 1
    _, again = ckpt.latest_checkpoint(run_dir)
    assert (
        again["counters"]["iteration"] == 5
        and again["counters"]["env_steps"] > resumed["counters"]["env_steps"]
    )
    before = resumed["extra"]["sil"]["valid"]
    assert torch.equal(again["extra"]["sil"]["valid"][: len(before)], before)
    assert [r["iteration"] for r in read_metrics(run_dir) if "train/loss" in r] == list(range(1, 6))


# ---------------------------------------------------------------------- bad input
def test_envs_that_do_not_split_over_the_ranks_are_refused_before_any_work(tmp_path, monkeypatch):
    from trainers.grpo import train as grpo_train
    from trainers.ppo import train as ppo_train

    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ValueError, match="num_envs=4 does not split over 3 ranks"):
        ppo_train.main(["--num-envs", "4", "--run-dir", str(tmp_path / "ppo"), *FAST])
    monkeypatch.setenv("WORLD_SIZE", "2")
    match = "num_envs=8 over 2 ranks gives 4 envs per rank, not a multiple of group_size=8"
    with pytest.raises(ValueError, match=match):
        grpo_train.main(["--num-envs", "8", "--group-size", "8", "--run-dir", str(tmp_path / "grpo"), *FAST])
    assert not dist.is_initialized() and not any(tmp_path.iterdir())  # no process group, no run directory
    assert parallel.check_split(8, 2, group_size=2) == 4


# ---------------------------------------------------------------------- shares of evaluations and starts
def test_the_ranks_shares_of_an_evaluation_are_the_single_process_episodes():
    from policies.gaussian import GaussianPolicy
    from tests.counting_env import CountingVectorEnv
    from trainers.evaluation import evaluate_episodes

    def shares(policy, make_env, episodes: int, key) -> tuple[list, list]:
        single = evaluate_episodes(policy, make_env(4), episodes, seed=11)
        split = [
            ep
            for r in range(3)
            for ep in evaluate_episodes(policy, make_env(2), episodes, seed=11, shard=(r, 3))
        ]
        return sorted(map(key, single)), sorted(map(key, split))

    # seeds (seed + episode index; gymnasium's sync vector env seeds env i with seed + i): CartPole;
    # 7 episodes over 3 ranks: 3, 2, 2
    cartpole = _policy(critic=False)
    sync = lambda n: gym.make_vec("CartPole-v1", n, vectorization_mode="sync")  # noqa: E731
    single, split = shares(cartpole, sync, 7, lambda e: e["return"])
    assert single == split and len(set(single)) > 1
    # initial frames, played as a queue (DISABLED autoreset): the same frames, the same episodes
    env = CountingVectorEnv(num_envs=2, autoreset_mode="Disabled")
    torch.manual_seed(0)
    walker = GaussianPolicy(env.single_observation_space, env.single_action_space)
    single, split = shares(
        walker,
        lambda n: CountingVectorEnv(num_envs=n, autoreset_mode="Disabled"),
        5,
        lambda e: (e["frame"], e["return"], e["length"]),
    )
    assert single == split and len(single) == 5
    assert evaluate_episodes(cartpole, sync(1), 1, shard=(1, 2)) == []  # rank 1 has no share of 1 episode


def test_group_starts_of_the_ranks_are_the_single_process_starts():
    from tests.counting_env import CountingVectorEnv
    from trainers.grpo import group_reset

    seeds = gym.make_vec("CartPole-v1", 4)  # no initial frames: one seed per group
    whole = group_reset(gym.make_vec("CartPole-v1", 8), 2, seed=3, iteration=5, rnd=1)
    parts = [group_reset(seeds, 2, seed=3, iteration=5, rnd=1, shard=(r, 2)) for r in range(2)]
    assert parts[0]["seed"] + parts[1]["seed"] == whole["seed"]
    frames = CountingVectorEnv(num_envs=4)
    whole = group_reset(CountingVectorEnv(num_envs=8), 2, seed=3, iteration=5, rnd=1)
    parts = [group_reset(frames, 2, seed=3, iteration=5, rnd=1, shard=(r, 2)) for r in range(2)]
    ids = [p["options"]["initial_frames"] for p in parts]
    assert ids[0] + ids[1] == whole["options"]["initial_frames"]
    assert [p["seed"] for p in parts] == [whole["seed"], whole["seed"] + 4]  # env i gets seed + i


def _merge_worker(rank: int, store: str, out_dir: str) -> None:
    from tests.counting_env import CountingVectorEnv
    from trainers.grpo import GroupStarts

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        starts = GroupStarts(
            CountingVectorEnv(num_envs=4), 2, seed=0, weighting="informative", shard=(rank, 2)
        )
        for rnd in range(2):  # two rounds: rank 0's groups carry signal, rank 1's do not
            starts.reset_kwargs(iteration=0, rnd=rnd)
            starts.record(torch.tensor([rank == 0, rank == 0]))
        starts.merge_ranks()
        torch.save(starts.state_dict(), Path(out_dir) / f"rank{rank}.pt")
    finally:
        parallel.shutdown()  # a barrier first: see its docstring


def test_group_start_counts_are_merged_over_the_ranks(tmp_path):
    mp.spawn(_merge_worker, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=WORLD)
    states = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    assert states[0] == states[1]
    kept, groups = np.sum(list(states[0]["counts"].values()), axis=0)
    assert (kept, groups) == (4, 8)  # 2 ranks x 2 rounds x 2 groups, rank 0's kept

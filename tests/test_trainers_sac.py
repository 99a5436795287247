"""SAC over action chunks (trainers/sac): n-step chunk returns, the replay buffer, the Q ensemble,
prior data, exact resume, learning on Pendulum, and what it refuses."""

from __future__ import annotations

import json
import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from sac_envs import Reach  # also registers SacReach-v0, SacClock-v0

from trainers import checkpoint as ckpt
from trainers.datasets.demos import Episode, write_demos
from trainers.metrics import read_metrics
from trainers.sac import QEnsemble, ReplayBuffer
from trainers.sac import replay as replay_module
from trainers.sac import train as sac_train
from trainers.sac.actors import step_transitions
from trainers.sac.prior import demo_transitions
from trainers.sac.replay import ChunkStep, NStepWriter

pytestmark = pytest.mark.usefixtures("one_torch_thread")
FAST = ["--no-progress", "--no-tensorboard", "--no-video", "--torch-threads", "1"]
G = 0.9


def _step(rewards, valid, tag=0):
    return ChunkStep(
        {"x": np.array([tag], np.float32)},
        np.full((len(rewards), 1), tag, np.float32),
        np.array(rewards, np.float32),
        np.array(valid, bool),
    )


def _obs(tag):
    return {"x": np.array([tag], np.float32)}


# ---------------------------------------------------------------------- n-step chunk returns
def test_nstep_chunk_returns_by_hand():
    w = NStepWriter(num_envs=2, n_step=2, gamma=G)
    assert w.push(0, _step([1, 0, 0], [1, 1, 1], tag=0), _obs(1), False, False) == []
    (t,) = w.push(0, _step([0, 2, 0], [1, 1, 1], tag=1), _obs(2), False, False)
    # two chunks of 3 executed sub-steps: 1 + gamma^4 * 2, bootstrapped gamma^6 from obs 2
    assert t.reward == pytest.approx(1 + G**4 * 2) and t.discount == pytest.approx(G**6)
    assert t.obs["x"][0] == 0 and t.next_obs["x"][0] == 2
    # terminated after 2 of 3 sub-steps: both pending chunk-steps flush, no bootstrap
    done = w.push(0, _step([0, 5, 0], [1, 1, 0], tag=2), _obs(9), True, False)
    assert [d.obs["x"][0] for d in done] == [1, 2]
    assert done[0].reward == pytest.approx(G * 2 + G**4 * 5) and done[0].discount == 0.0
    assert done[1].reward == pytest.approx(G * 5) and done[1].discount == 0.0
    # truncated after 1 sub-step: bootstraps gamma^1 from the final observation
    (t,) = w.push(1, _step([3, 0, 0], [1, 0, 0], tag=7), _obs(8), False, True)
    assert t.reward == pytest.approx(3) and t.discount == pytest.approx(G) and t.next_obs["x"][0] == 8
    assert w.pending == [[], []]


# ---------------------------------------------------------------------- replay buffer
def _dict_space():
    return spaces.Dict({"proprio": spaces.Box(-1, 1, (2,), np.float32), "instruction": spaces.Text(32)})


def _transition(i):
    from trainers.sac.replay import Transition

    obs = {"proprio": np.full(2, i, np.float32), "instruction": f"task {i}"}
    nxt = {"proprio": np.full(2, i + 0.5, np.float32), "instruction": f"task {i}"}
    return Transition(obs, np.full((3, 1), i, np.float32), float(i), 0.5, nxt)


def test_replay_buffer_wraps_samples_rows_whole_and_round_trips():
    buf = ReplayBuffer(_dict_space(), (3, 1), capacity=5)
    buf.add([_transition(i) for i in range(7)])  # 0 and 1 are overwritten
    assert len(buf) == 5 and buf.pos == 2
    batch = buf.sample(64, torch.Generator().manual_seed(0))
    ids = batch.rewards.numpy()
    assert set(ids.tolist()) <= {2.0, 3.0, 4.0, 5.0, 6.0} and len(set(ids.tolist())) > 1
    assert np.array_equal(batch.obs["proprio"][:, 0], ids) and np.array_equal(
        batch.next_obs["proprio"][:, 0], ids + 0.5
    )
    assert list(batch.obs["instruction"]) == [f"task {int(i)}" for i in ids]
    assert torch.equal(batch.actions[:, 0, 0], batch.rewards) and not batch.prior.any()

    other = ReplayBuffer(_dict_space(), (3, 1), capacity=5)
    other.load_state_dict(buf.state_dict())
    again = other.sample(64, torch.Generator().manual_seed(0))
    assert torch.equal(again.actions, batch.actions) and again.obs["instruction"] == batch.obs["instruction"]
    with pytest.raises(ValueError, match="does not fit"):
        ReplayBuffer(_dict_space(), (3, 1), capacity=3).load_state_dict(buf.state_dict())


def test_replay_buffer_larger_than_memory_is_refused(monkeypatch):
    monkeypatch.setattr(replay_module, "available_memory", lambda: 1 << 30)
    image = spaces.Dict({"image": spaces.Box(0, 255, (128, 128, 3), np.uint8)})
    with pytest.raises(
        ValueError, match=r"needs .* GiB, more than 80% of the 1.00 GiB available: lower buffer_size"
    ):
        ReplayBuffer(image, (8, 7), capacity=100_000)
    assert len(ReplayBuffer(image, (8, 7), capacity=100)) == 0  # a buffer that fits is allocated


# ---------------------------------------------------------------------- critics
@pytest.mark.parametrize("layer_norm", [False, True])
def test_q_ensemble_members_are_their_written_out_mlps(layer_norm):
    space = spaces.Box(-1, 1, (5,), np.float32)
    q = QEnsemble(space, (2, 3), n_critics=3, hidden_sizes=(16, 8), layer_norm=layer_norm)
    with torch.no_grad():
        for p in q.parameters():
            p.add_(torch.randn_like(p) * 0.1)  # LayerNorm affines away from 1 / 0
    obs, act = torch.randn(4, 5), torch.rand(4, 2, 3) * 2 - 1
    out = q(obs, act)
    assert out.shape == (3, 4)
    x = torch.cat([obs, act.reshape(4, -1)], 1)
    for n in range(3):
        h = x
        for i in range(3):
            h = h @ q.weights[i][n] + q.biases[i][n, 0]
            if i < 2:
                if layer_norm:
                    h = (
                        torch.nn.functional.layer_norm(h, (h.shape[-1],)) * q.norm_scales[i][n, 0]
                        + q.norm_shifts[i][n, 0]
                    )
                h = torch.relu(h)
        torch.testing.assert_close(out[n], h[:, 0])
    members = torch.tensor([2, 0])  # a REDQ target computes only its subset's members
    torch.testing.assert_close(q(obs, act, members), out[members])


# ---------------------------------------------------------------------- prior data
def _episode(length, success, d=2):
    t = np.arange(length, dtype=np.float32)
    return Episode(
        obs={"proprio": np.stack([t, t], 1)},
        actions=np.stack([t, -t], 1)[:, None, :],
        valid=np.ones((length, 1), bool),
        rewards=np.where(np.arange(length) == length - 1, float(success), 0.0)[:, None].astype(np.float32),
        instruction="walk",
        success=success,
    )


def test_demos_become_chunk_transitions():
    space = spaces.Dict({"proprio": spaces.Box(-100, 100, (2,), np.float32), "instruction": spaces.Text(32)})
    # a 6-step success cut into K=4 chunks at every start (4 interleaved sequences), 1-step returns
    out = demo_transitions([_episode(6, True)], space, (4, 2), G, 1)
    starts = sorted(int(t.obs["proprio"][0]) for t in out)
    assert starts == [0, 1, 2, 3, 4, 5]
    by_start = {int(t.obs["proprio"][0]): t for t in out}
    assert by_start[0].discount == pytest.approx(G**4) and by_start[0].next_obs["proprio"][0] == 4
    assert np.array_equal(by_start[1].action[:, 0], [1, 2, 3, 4])
    assert by_start[3].discount == 0.0 and by_start[3].reward == pytest.approx(G**2)  # success at step 5
    assert np.array_equal(by_start[4].action[:, 0], [4, 5, 0, 0]) and by_start[4].obs["instruction"] == "walk"
    # a failed episode: the chunks that run past its end (no next observation) are dropped
    failed = demo_transitions([_episode(6, False)], space, (4, 2), G, 1)
    assert sorted(int(t.obs["proprio"][0]) for t in failed) == [0, 1]
    assert all(t.discount == pytest.approx(G**4) for t in failed)
    # K = 1 demos used as they are, 2-step returns
    k1 = demo_transitions([_episode(3, True)], space, (1, 2), G, 2)
    assert [(int(t.obs["proprio"][0]), round(t.reward, 6), t.discount) for t in k1] == [
        (0, 0.0, pytest.approx(G**2)),
        (1, round(G, 6), 0.0),
        (2, 1.0, 0.0),
    ]


def test_prior_data_that_does_not_fit_the_env_is_refused():
    space = spaces.Dict({"proprio": spaces.Box(-100, 100, (2,), np.float32), "wrist": spaces.Box(0, 1, (2,))})
    with pytest.raises(
        ValueError, match=r"the env observes \['proprio', 'wrist'\]; the demonstrations have no 'wrist'"
    ):
        demo_transitions([_episode(6, True)], space, (4, 2), G, 1)
    proprio3 = spaces.Dict({"proprio": spaces.Box(-100, 100, (3,), np.float32)})
    with pytest.raises(ValueError, match=r"observation 'proprio' has shape \(2,\), the env's \(3,\)"):
        demo_transitions([_episode(6, True)], proprio3, (4, 2), G, 1)
    ok = spaces.Dict({"proprio": spaces.Box(-100, 100, (2,), np.float32)})
    with pytest.raises(ValueError, match="actions of 2 dimensions; the env takes 7"):
        demo_transitions([_episode(6, True)], ok, (4, 7), G, 1)
    chunked = _episode(6, True)
    chunked.actions = np.zeros((6, 3, 2), np.float32)
    with pytest.raises(ValueError, match="chunks of 3 actions; the env's chunk size is 4"):
        demo_transitions([chunked], ok, (4, 2), G, 1)


def test_prior_data_with_nan_and_a_buffer_that_holds_less_than_it_says_are_refused():
    from trainers.sac.prior import _finite

    buffer = ReplayBuffer(_dict_space(), (3, 1), capacity=4, prior=True)
    rows = [_transition(i) for i in range(4)]
    rows[2].reward = float("nan")
    buffer.add(rows)
    with pytest.raises(
        ValueError, match=r"demos.h5: prior data rewards holds NaN or inf in 1 of 4 transitions"
    ):
        _finite(buffer, "demos.h5")
    state = buffer.state_dict()
    state["size"] = 4
    state["rewards"] = state["rewards"][:1]  # says 4 rows, holds 1: never broadcast into 4 copies
    with pytest.raises(ValueError, match=r"says it holds 4 rows, but holds \{'rewards': 1\}"):
        ReplayBuffer(_dict_space(), (3, 1), capacity=4).load_state_dict(state)


# ---------------------------------------------------------------------- a deterministic task
def _reach_args(run_dir, *extra, obs_norm="off"):
    policy = {"hidden_sizes": [32, 32], "torso_kwargs": {"obs_norm": obs_norm}}
    return [
        "--env", "SacReach-v0", "--num-envs", "2", "--total-steps", "120", "--steps-per-iteration", "10",
        "--learning-starts", "30", "--batch-size", "32", "--gradient-steps", "2", "--n-step", "2",
        "--checkpoint-every", "2", "--eval-every", "-1", "--run-dir", str(run_dir),
        "--policy-kwargs", json.dumps(policy), "--critic-hidden-sizes", "[32, 32]", *FAST, *extra,
    ]  # fmt: skip


@pytest.mark.parametrize("obs_norm", ["off", "running"])
def test_sac_killed_run_resumes_exactly(tmp_path, monkeypatch, obs_norm):
    sac_train.main(_reach_args(tmp_path / "straight", obs_norm=obs_norm))
    straight = ckpt.latest_checkpoint(tmp_path / "straight")[1]
    assert straight["counters"]["iteration"] == 6 and straight["extra"]["updates"] == 90
    real, calls = sac_train.sac_update, []

    def dying(*args, **kwargs):  # killed during iteration 5, after the checkpoint of iteration 4
        calls.append(1)
        if len(calls) == 55:  # updates start at vector step 16: 10 in iterations 1-2, 20 in each later
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(sac_train, "sac_update", dying)
    with pytest.raises(KeyboardInterrupt):
        sac_train.main(_reach_args(tmp_path / "killed", obs_norm=obs_norm))
    assert ckpt.latest_checkpoint(tmp_path / "killed")[0].name == "iter_000004.pt"
    monkeypatch.setattr(sac_train, "sac_update", real)
    sac_train.main(["--resume", str(tmp_path / "killed"), *FAST])
    resumed = ckpt.latest_checkpoint(tmp_path / "killed")[1]

    assert resumed["counters"]["env_steps"] == straight["counters"]["env_steps"] == 120
    for part in ("policy", "extra"):
        a = straight[part]["state_dict"] if part == "policy" else straight[part]["learner"]
        b = resumed[part]["state_dict"] if part == "policy" else resumed[part]["learner"]
        for key, value in a.items():
            assert torch.equal(value, b[key]), key
    for key in ("actions", "rewards", "discounts"):
        assert torch.equal(straight["extra"]["buffer"][key], resumed["extra"]["buffer"][key])
    counts = [v for k, v in resumed["policy"]["state_dict"].items() if k.endswith("norm_count")]
    assert (counts == []) == (obs_norm == "off") and all(c > 50 for c in counts)  # compared above
    rows = read_metrics(tmp_path / "killed")
    assert [r["iteration"] for r in rows if "train/critic_loss" in r] == [2, 3, 4, 5, 6]


@pytest.mark.slow
def test_sac_learns_pendulum(tmp_path):
    final = sac_train.main(
        ["--env", "Pendulum-v1", "--num-envs", "1", "--total-steps", "3000", "--steps-per-iteration", "500",
         "--learning-rate", "1e-3", "--eval-episodes", "5", "--run-dir", str(tmp_path / "run"), *FAST]
    )  # fmt: skip
    assert final["eval/return"] > -600, final  # random actions: about -1200
    assert final["train/alpha"] < 1.0


# ---------------------------------------------------------------------- chunks, prior data, RLPD
def _register_counting():
    if "SacCounting-v0" not in gym.registry:
        gym.register("SacCounting-v0", vector_entry_point="counting_env:CountingVectorEnv")


def test_chunked_env_transitions_count_executed_sub_steps(tmp_path):
    """Goal 3 with K=4: success after 3 sub-steps (terminated, no bootstrap); goal 20: truncated by the
    10-step limit after 4 + 4 + 2 sub-steps (the last chunk bootstraps gamma^2)."""
    _register_counting()
    from counting_env import ConstantPolicy

    from trainers.rollout import Collector
    from trainers.run import Run, RunConfig
    from trainers.sac.algorithm import SACConfig

    cfg = RunConfig(
        env="SacCounting-v0", env_kwargs={"chunk_size": 4}, num_envs=1, run_dir=str(tmp_path), progress=False
    )
    env = Run("sac", cfg, SACConfig()).make_env(autoreset="same_step")
    collector = Collector(env, ConstantPolicy(env.single_observation_space, env.single_action_space, 1.0))
    writer = NStepWriter(1, 1, G)
    collector.reset(options={"initial_frames": [4]})  # goal 20
    truncated = []
    for _ in range(3):
        truncated += step_transitions(collector.collect(1, record_obs=True), collector.obs, writer)
    collector.reset(options={"initial_frames": [0]})  # goal 3
    (success,) = step_transitions(collector.collect(1, record_obs=True), collector.obs, writer)
    env.close()
    assert [t.discount for t in truncated] == [pytest.approx(G**4), pytest.approx(G**4), pytest.approx(G**2)]
    assert [t.obs["proprio"][0] for t in truncated] == [0, 4, 8] and truncated[-1].next_obs["proprio"][
        0
    ] == 10
    assert truncated[0].obs["instruction"] == "walk 20 cells" and truncated[0].obs["image"].shape == (2, 2, 3)
    assert success.discount == 0.0 and success.reward == pytest.approx(G**2)


def test_rlpd_from_demos_mixes_batches_after_offline_steps(tmp_path):
    _register_counting()
    demos = tmp_path / "demos.h5"
    eps = []
    for goal in (3, 4):
        pos = np.arange(goal, dtype=np.float32)
        eps.append(Episode(
            obs={"image": np.repeat(pos, 12).reshape(goal, 2, 2, 3).astype(np.uint8),
                 "proprio": np.stack([pos, np.full(goal, goal)], 1).astype(np.float32)},
            actions=np.ones((goal, 1, 2), np.float32), valid=np.ones((goal, 1), bool),
            rewards=(np.arange(goal) == goal - 1).astype(np.float32)[:, None],
            instruction=f"walk {goal} cells", success=True,
        ))  # fmt: skip
    write_demos(demos, eps, {"env": "SacCounting-v0", "chunk_size": 1, "action_dim": 2})
    final = sac_train.main(
        ["--env", "SacCounting-v0", "--env-kwargs", '{"chunk_size": 2}', "--num-envs", "2",
         "--total-steps", "40", "--steps-per-iteration", "5", "--learning-starts", "4", "--batch-size", "8",
         "--prior-data", str(demos), "--offline-steps", "3", "--bc-coef", "0.5", "--n-critics", "4",
         "--critic-subsample", "2", "--critic-layer-norm", "--eval-episodes", "2",
         "--policy-kwargs", '{"hidden_sizes": [16]}', "--critic-hidden-sizes", "[16]",
         "--run-dir", str(tmp_path / "run"), *FAST]
    )  # fmt: skip
    assert final["train/bc_loss"] != 0 and math.isfinite(final["train/critic_loss"])
    rows = read_metrics(tmp_path / "run")
    assert any("offline/critic_loss" in r for r in rows)
    # benchmarks.sac_critic reads the run back: its critics, actor, buffer and prior data
    from benchmarks.sac_critic import diagnose

    found = diagnose(tmp_path / "run", rows=8)
    assert list(found) == ["prior", "online"] and 0 <= found["prior"]["stored_above_mean"] <= 1
    assert found["prior"]["grad_q"] > 0 and found["prior"]["grad_bc"] > 0 and "grad_bc" not in found["online"]
    assert all(math.isfinite(v) for rows in found.values() for v in rows.values())
    # an earlier run's transitions as prior data; a run of another algorithm is refused
    final = sac_train.main(
        ["--env", "SacCounting-v0", "--env-kwargs", '{"chunk_size": 2}', "--num-envs", "2",
         "--total-steps", "10", "--steps-per-iteration", "5", "--learning-starts", "4", "--batch-size", "8",
         "--prior-data", str(tmp_path / "run"), "--eval-every", "-1",
         "--policy-kwargs", '{"hidden_sizes": [16]}', "--critic-hidden-sizes", "[16]",
         "--run-dir", str(tmp_path / "second"), *FAST]
    )  # fmt: skip
    assert math.isfinite(final["train/critic_loss"])

    def standardised(name: str, policy: dict, *flags: str) -> dict:
        """A short SAC run from the prior data; its newest checkpoint."""
        sac_train.main(
            ["--env", "SacCounting-v0", "--env-kwargs", '{"chunk_size": 2}', "--num-envs", "2",
             "--total-steps", "10", "--steps-per-iteration", "5", "--learning-starts", "4",
             "--batch-size", "8", "--prior-data", str(demos), "--eval-every", "-1",
             "--policy-kwargs", json.dumps(policy),
             "--critic-hidden-sizes", "[16]", "--run-dir", str(tmp_path / name), *flags, *FAST]
        )  # fmt: skip
        return ckpt.latest_checkpoint(tmp_path / name)[1]

    # obs_norm "fixed": actor and critics standardise by the prior data's statistics, set once
    data = standardised("fixed", {"hidden_sizes": [16], "torso_kwargs": {"obs_norm": "fixed"}})
    prior_proprio = data["policy"]["state_dict"]["torso.encoders.proprio.norm_mean"]
    for state in (data["policy"]["state_dict"], data["extra"]["learner"]):
        counts = [int(v) for k, v in state.items() if k.endswith("proprio.norm_count")]
        assert counts and set(counts) == {7}  # the prior rows: a chunk starts at every demo step, 3 + 4
        means = [v for k, v in state.items() if k.endswith("proprio.norm_mean")]
        assert all(torch.equal(m, prior_proprio) for m in means)
    # critic_obs_norm "prior": the critics standardise by the prior data while the actor stays raw
    data = standardised("critic", {"hidden_sizes": [16]}, "--critic-obs-norm", "prior")
    assert not any("norm_" in k for k in data["policy"]["state_dict"])
    learner = data["extra"]["learner"]
    for target in ("critic.", "critic_target."):
        assert torch.equal(learner[target + "encoder.encoders.proprio.norm_mean"], prior_proprio)
        assert int(learner[target + "encoder.encoders.proprio.norm_count"]) == 7
    # actor_obs_norm "prior": a raw actor is folded to fixed standardisation; its checkpoints rebuild it
    data = standardised("actor", {"hidden_sizes": [16]}, "--actor-obs-norm", "prior")
    assert data["policy"]["kwargs"]["torso_kwargs"] == {"obs_norm": "fixed"}
    assert torch.equal(data["policy"]["state_dict"]["torso.encoders.proprio.norm_mean"], prior_proprio)
    assert not any("norm_" in k for k in data["extra"]["learner"])  # critics: as the actor was built
    from trainers.checkpoint import load_policy

    env = gym.make_vec("SacCounting-v0", num_envs=1, chunk_size=2)
    folded = load_policy(tmp_path / "actor", env.single_observation_space, env.single_action_space)
    assert folded.obs_norm == "fixed"


# ---------------------------------------------------------------------- bad input
def test_sac_refuses_what_it_cannot_train(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"SAC needs a Box action space .* CartPole-v1 has Discrete\(2\)"):
        sac_train.main(["--env", "CartPole-v1", "--run-dir", str(tmp_path / "a"), *FAST])
    with pytest.raises(ValueError, match="SAC trains a squashed Gaussian actor .* got FlowPolicy"):
        sac_train.main(["--env", "Pendulum-v1", "--policy", "flow", "--run-dir", str(tmp_path / "b"), *FAST])
    with pytest.raises(ValueError, match="with squash=False"):
        sac_train.main(
            [
                "--env",
                "Pendulum-v1",
                "--policy-kwargs",
                '{"squash": false}',
                "--run-dir",
                str(tmp_path / "c"),
                *FAST,
            ]
        )
    with pytest.raises(ValueError, match="critic_obs_norm .prior. takes its statistics from prior_data"):
        sac_train.main(["--env", "Pendulum-v1", "--critic-obs-norm", "prior", *FAST])
    with pytest.raises(ValueError, match="actor_obs_norm 'prior' takes its statistics from prior_data"):
        sac_train.main(["--env", "Pendulum-v1", "--actor-obs-norm", "prior", *FAST])
    with pytest.raises(ValueError, match="critic_subsample 3 > n_critics 2"):
        sac_train.main(["--env", "Pendulum-v1", "--critic-subsample", "3", *FAST])
    with pytest.raises(FileNotFoundError, match="no demonstration dataset"):
        sac_train.main(
            [
                "--env",
                "Pendulum-v1",
                "--prior-data",
                str(tmp_path / "none.h5"),
                "--run-dir",
                str(tmp_path / "d"),
                *FAST,
            ]
        )
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="--algo sac runs in one process"):
        sac_train.main(["--env", "Pendulum-v1", *FAST])


def test_placebo_shuffles_outcomes_among_rows_only():
    from trainers.sac.algorithm import shuffle_outcomes

    buf = ReplayBuffer(_dict_space(), (3, 1), capacity=16)
    buf.add([_transition(i) for i in range(16)])
    for i in range(16):
        buf.discounts[i] = i / 100  # a distinct discount per row, to check pairs move together
    batch = buf.sample(32, torch.Generator().manual_seed(1))
    placebo = shuffle_outcomes(batch, torch.Generator().manual_seed(2))
    pairs = sorted(zip(batch.rewards.tolist(), batch.discounts.tolist()))
    assert sorted(zip(placebo.rewards.tolist(), placebo.discounts.tolist())) == pairs
    assert not torch.equal(placebo.rewards, batch.rewards)
    assert torch.equal(placebo.actions, batch.actions) and placebo.obs is batch.obs
    assert np.allclose(placebo.discounts.numpy() * 100, placebo.rewards.numpy(), atol=1e-4)


# ---------------------------------------------------------------------- DSRL
def _flow_checkpoint(path):
    from policies.flow import FlowPolicy

    env = Reach()
    kwargs = {"num_steps": 3, "velocity_hidden": [16], "hidden_sizes": [16], "use_critic": False}
    flow = FlowPolicy(env.observation_space, env.action_space, **kwargs)
    spec = {"name": "flow", "kwargs": kwargs, "state_dict": flow.state_dict(), "omitted": []}
    ckpt.save_checkpoint(path, {"algo": "bc", "policy": spec, "counters": {}, "config": {}})
    return flow


def test_flow_denoise_is_the_deterministic_chain_from_its_noise():
    from policies.flow import FlowPolicy

    env = Reach()
    flow = FlowPolicy(
        env.observation_space, env.action_space, num_steps=4, velocity_hidden=[16], hidden_sizes=[16]
    )
    flow.seed(0)
    obs = torch.randn(5, 2)
    out = flow.act(obs, deterministic=True)
    torch.testing.assert_close(flow.denoise(obs, out.replay["chains"][:, 0]), out.actions)


def test_dsrl_starts_as_its_base_acts_from_zero_noise():
    """Before any update the noise actor's deterministic noise is exactly 0: a flow base with
    ``deterministic_init="zeros"`` then acts as the clone does when evaluated."""
    from policies.dsrl import NoiseSteeredPolicy
    from policies.flow import FlowPolicy

    env = Reach()
    kwargs = {"num_steps": 3, "velocity_hidden": [16], "hidden_sizes": [16], "deterministic_init": "zeros",
              "use_critic": False}  # fmt: skip
    flow = FlowPolicy(env.observation_space, env.action_space, **kwargs)
    base = {"name": "flow", "kwargs": kwargs}
    dsrl = NoiseSteeredPolicy(env.observation_space, env.action_space, base=base, hidden_sizes=[16])
    dsrl.base.load_state_dict(flow.state_dict())
    obs = torch.randn(6, 2)
    steered = dsrl.act(obs, deterministic=True)
    assert torch.equal(steered.replay["sac_action"], torch.zeros_like(steered.replay["sac_action"]))
    torch.testing.assert_close(steered.actions, flow.act(obs, deterministic=True).actions)
    dsrl.seed(0)
    explored = dsrl.act(obs).replay["sac_action"]  # sampling still explores around zero
    assert explored.abs().min() > 0 and explored.std() > 0.1
    default = NoiseSteeredPolicy(
        env.observation_space, env.action_space, base=base, hidden_sizes=[16], start_at_base=False
    )
    assert default.act(obs, deterministic=True).replay["sac_action"].abs().max() > 0


def test_dsrl_trains_the_noise_actor_of_a_frozen_flow_policy(tmp_path):
    base = _flow_checkpoint(tmp_path / "flow.pt")
    actor = {"hidden_sizes": [16], "max_noise": 1.5, "torso_kwargs": {"obs_norm": "running"}}
    final = sac_train.main(
        ["--env", "SacReach-v0", "--num-envs", "2", "--total-steps", "60", "--steps-per-iteration", "10",
         "--learning-starts", "20", "--batch-size", "16", "--policy", "dsrl",
         "--init-policy", str(tmp_path / "flow.pt"),
         "--policy-kwargs", json.dumps(actor),
         "--critic-hidden-sizes", "[16]",
         "--eval-episodes", "2", "--run-dir", str(tmp_path / "run"), *FAST]
    )  # fmt: skip
    assert math.isfinite(final["train/critic_loss"]) and math.isfinite(final["eval/return"])
    data = ckpt.latest_checkpoint(tmp_path / "run")[1]
    state = data["policy"]["state_dict"]
    for key, value in base.state_dict().items():  # the base is frozen
        assert torch.equal(state[f"base.{key}"], value), key
    noise = data["extra"]["buffer"]["actions"]
    # the noise actor standardises its input with running statistics of every stored observation
    assert state["actor.torso.encoders.obs.norm_count"] == len(noise)
    assert noise.abs().max() <= 1.5 and data["policy"]["name"] == "policies.dsrl:NoiseSteeredPolicy"
    # the buffer holds the noise, the env got the base's action for it
    from trainers.checkpoint import load_policy

    policy = load_policy(tmp_path / "run", Reach.observation_space, Reach.action_space)
    obs = data["extra"]["buffer"]["obs"]["obs"][:4]
    torch.testing.assert_close(policy.decode(obs, noise[:4]), base.denoise(obs, noise[:4]))


def test_dsrl_refuses_what_does_not_fit(tmp_path):
    _flow_checkpoint(tmp_path / "flow.pt")
    flow = ["--env", "SacReach-v0", "--policy", "dsrl", "--init-policy", str(tmp_path / "flow.pt")]
    with pytest.raises(ValueError, match="DSRL's critics score the noise fed to the frozen policy"):
        sac_train.main(
            [*flow, "--prior-data", str(tmp_path / "demos.h5"), "--run-dir", str(tmp_path / "a"), *FAST]
        )
    gauss = sac_train.main(["--env", "SacReach-v0", "--total-steps", "20", "--steps-per-iteration", "10",
                            "--eval-every", "-1", "--run-dir", str(tmp_path / "g"), *FAST])  # fmt: skip
    assert math.isfinite(gauss["env/return"])
    with pytest.raises(TypeError, match="DSRL steers a flow policy .* got GaussianPolicy"):
        sac_train.main(["--env", "SacReach-v0", "--policy", "dsrl", "--init-policy", str(tmp_path / "g"),
                        "--run-dir", str(tmp_path / "b"), *FAST])  # fmt: skip


def test_actor_every_steps_the_actor_and_temperature_on_every_nth_update_only(tmp_path, monkeypatch):
    """``--actor-every 3``: updates 0, 3, 6... move the actor and alpha; the others only the critics."""
    real, seen = sac_train.sac_update, []

    def recording(actor, learner, *args):
        before = [p.detach().clone() for p in (*actor.parameters(), learner.log_alpha)]
        critic = [p.detach().clone() for p in learner.critic.parameters()]
        out = real(actor, learner, *args)
        moved = any(not torch.equal(a, p) for a, p in zip(before, (*actor.parameters(), learner.log_alpha)))
        seen.append(
            (args[-1], moved, any(not torch.equal(a, p) for a, p in zip(critic, learner.critic.parameters())))
        )
        return out

    monkeypatch.setattr(sac_train, "sac_update", recording)
    sac_train.main(_reach_args(tmp_path / "run", "--actor-every", "3"))
    assert len(seen) == 90 and all(critic for _, _, critic in seen)
    assert [flag for flag, _, _ in seen] == [i % 3 == 0 for i in range(90)]
    assert all(moved == flag for flag, moved, _ in seen)
    row = [r for r in read_metrics(tmp_path / "run") if "train/actor_loss" in r][-1]
    assert {"train/critic_loss", "train/alpha_loss", "train/entropy"} <= set(row)  # averaged where present
    seen.clear()  # a critic warm-up: the first 10 updates step the critics only, then every 3rd the actor
    sac_train.main(_reach_args(tmp_path / "warm", "--actor-every", "3", "--actor-starts", "10"))
    assert [flag for flag, _, _ in seen] == [i >= 10 and (i - 10) % 3 == 0 for i in range(90)]
    assert all(moved == flag for flag, moved, _ in seen) and all(critic for _, _, critic in seen)

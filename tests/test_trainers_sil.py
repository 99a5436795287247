"""Self-imitation from success (``trainers/sil``) on the counting env: it learns, keeps only
successes (or, as the placebo, as many episodes chosen without the reward), mixes the prior data in,
resumes its buffer and weight average, draws successes by Oh et al.'s weights (``value_weighting``),
and refuses bad settings before any env step."""

import json

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from nets.errors import BadInput
from policies.gaussian import GaussianPolicy
from trainers.checkpoint import latest_checkpoint
from trainers.datasets.demos import Episode, write_demos
from trainers.optim import EMA_KEY, BadUpdateGuard
from trainers.sil import ChunkRows, SILConfig
from trainers.sil.algorithm import chosen
from trainers.sil.train import main as sil_main
from trainers.sil.value import SuccessValue

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# goals 3, 4, 5, 6 (reachable in the 10-step limit) and 20 (never)
ENV = ["--env", "SacCounting-v0", "--env-kwargs", '{"chunk_size": 2}', "--num-envs", "4"]
POLICY = ["--policy", "gaussian", "--policy-kwargs", json.dumps({"hidden_sizes": [16], "squash": True})]
FAST = ["--no-progress", "--no-tensorboard", "--no-video", "--eval-episodes", "10", "--eval-num-envs", "2"]


@pytest.fixture(autouse=True)
def _counting():
    if "SacCounting-v0" not in gym.registry:
        gym.register("SacCounting-v0", vector_entry_point="counting_env:CountingVectorEnv")


def _sil(run_dir, *extra):
    return sil_main([*ENV, *POLICY, *FAST, "--run-dir", str(run_dir), *extra])


def test_self_imitation_learns_to_walk(tmp_path):
    """A new squashed Gaussian's mean action is 0, so deterministically it never walks; its samples
    walk half the time and reach the near goals. Imitating the successful episodes moves the mean
    forward: the four reachable goals of five (0.8) deterministically, and the buffer holds forward
    steps."""
    final = _sil(tmp_path / "run", "--total-steps", "1200", "--steps-per-iteration", "5",
                 "--updates-per-iteration", "8", "--batch-size", "64", "--learning-rate", "3e-3",
                 "--ema-decay", "0", "--eval-at-start")  # fmt: skip
    assert final["eval/success"] >= 0.7, final
    assert final["train/success_episodes"] > 0 and np.isfinite(final["train/sil_loss"])
    buffer = latest_checkpoint(tmp_path / "run")[1]["extra"]["successes"]
    assert (buffer["actions"][..., 0][buffer["valid"]] > 0).mean() > 0.6


def test_the_placebo_keeps_as_many_episodes_chosen_without_the_reward():
    flags = [True, False, False, True, False, False, False, True]
    g = torch.Generator().manual_seed(0)
    assert chosen(flags, False, g) == flags
    draws = [chosen(flags, True, g) for _ in range(50)]
    assert all(sum(d) == 3 for d in draws)
    assert any(d != flags for d in draws)
    assert chosen([], True, g) == []


def test_success_rows_keep_the_newest_and_round_trip():
    rows = ChunkRows(capacity=5)

    def episode(n, start):
        return [({"proprio": np.full(2, start + t, np.float32), "instruction": f"s{start + t}"},
                 np.zeros((2, 2), np.float32), np.ones(2, bool), t) for t in range(n)]  # fmt: skip

    rows.add(episode(3, 0))
    rows.add(episode(4, 10))
    assert len(rows) == 5 and rows.episodes == 2
    assert rows.obs["proprio"][:, 0].tolist() == [2, 10, 11, 12, 13]
    assert rows.obs["instruction"] == ["s2", "s10", "s11", "s12", "s13"]
    assert rows.lags.tolist() == [2, 0, 1, 2, 3] and rows.rows_added == 7
    empty = ChunkRows(capacity=5)
    empty.load_state_dict(ChunkRows(capacity=5).state_dict())
    assert len(empty) == 0 and empty.episodes == 0
    again = ChunkRows(capacity=5)
    again.load_state_dict(rows.state_dict())
    np.testing.assert_array_equal(again.obs["proprio"], rows.obs["proprio"])
    with pytest.raises(BadInput, match="differ in length"):
        again.load_state_dict({**rows.state_dict(), "valid": rows.valid[:2]})


def _demos(tmp_path, action_dim=2):
    eps = []
    for goal in (3, 4):
        pos = np.arange(goal, dtype=np.float32)
        eps.append(Episode(
            obs={"image": np.zeros((goal, 2, 2, 3), np.uint8),
                 "proprio": np.stack([pos, np.full(goal, goal)], 1)},
            actions=np.ones((goal, 1, action_dim), np.float32), valid=np.ones((goal, 1), bool),
            rewards=np.zeros((goal, 1), np.float32), instruction=f"walk {goal} cells", success=True,
        ))  # fmt: skip
    return write_demos(tmp_path / f"demos{action_dim}.h5", eps, {"env": "SacCounting-v0", "chunk_size": 1})


def test_prior_data_is_imitated_and_a_resume_keeps_buffer_and_average(tmp_path):
    """With prior demos the first updates need no success. A run resumed with no updates ends with the
    policy (the average) and the trained weights of its checkpoint, and the buffer it had."""
    demos = _demos(tmp_path)
    args = ["--prior-data", str(demos), "--steps-per-iteration", "5", "--batch-size", "16",
            "--ema-decay", "0.9", "--eval-every", "-1", "--checkpoint-every", "1"]  # fmt: skip
    first = _sil(tmp_path / "run", *args, "--total-steps", "80")
    assert first["train/prior_share"] == pytest.approx(1.0) or first["train/success_rows"] > 0
    before = latest_checkpoint(tmp_path / "run")[1]
    _sil(tmp_path / "run", *args, "--total-steps", "160", "--updates-per-iteration", "0",
         "--resume", str(tmp_path / "run"))  # fmt: skip
    after = latest_checkpoint(tmp_path / "run")[1]
    assert after["counters"]["iteration"] > before["counters"]["iteration"]
    for name, value in before["policy"]["state_dict"].items():
        torch.testing.assert_close(after["policy"]["state_dict"][name], value, rtol=0, atol=0)
    for name, value in before["extra"][EMA_KEY].items():
        torch.testing.assert_close(after["extra"][EMA_KEY][name], value, rtol=0, atol=0)
    kept, now = before["extra"]["successes"], after["extra"]["successes"]
    assert now["episodes"] >= kept["episodes"]
    np.testing.assert_array_equal(now["actions"][: len(kept["actions"])], kept["actions"])


def test_bad_settings_are_refused_before_any_env_step(tmp_path):
    with pytest.raises(BadInput, match="prior_ratio"):
        SILConfig(prior_ratio=1.0)
    with pytest.raises(BadInput, match="ema_decay"):
        SILConfig(ema_decay=1.0)
    with pytest.raises(BadInput, match="max_policy_lag must be >= 0"):
        SILConfig(max_policy_lag=-1)
    with pytest.raises(BadInput, match="demonstrated chunks are 2 x 3"):
        _sil(tmp_path / "b", "--prior-data", str(_demos(tmp_path, action_dim=3)))
    assert not (tmp_path / "b" / "checkpoints").exists()


def test_warm_up_clones_the_prior_before_any_env_step_and_is_not_redone_on_resume(tmp_path):
    """``warmup_updates`` are behaviour cloning on the prior data alone, after the evaluation at start
    and before any env step: with no update after them the policy walks like the forward-walking
    demos. They are logged once, and a resumed run does not repeat them."""
    demos = _demos(tmp_path)
    args = ["--prior-data", str(demos), "--warmup-updates", "60", "--updates-per-iteration", "0",
            "--batch-size", "16", "--learning-rate", "3e-3", "--ema-decay", "0", "--steps-per-iteration", "5",
            "--checkpoint-every", "1"]  # fmt: skip
    first = _sil(tmp_path / "run", *args, "--total-steps", "40", "--eval-at-start")
    assert first["train/updates"] == 60 and first["train/updates_per_chunk"] == 0
    assert first["eval/success"] >= 0.7, first
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    warm = [r for r in rows if "train/warmup_updates" in r]
    assert (
        len(warm) == 1 and warm[0]["train/warmup_updates"] == 60 and np.isfinite(warm[0]["train/warmup_loss"])
    )
    start = [i for i, r in enumerate(rows) if "eval/success" in r][0]  # the new policy, before it
    assert start < rows.index(warm[0]) and rows[start]["eval/episode_len"] > first["eval/episode_len"]
    again = _sil(tmp_path / "run", *args, "--total-steps", "80", "--resume", str(tmp_path / "run"))
    assert again["train/updates"] == 60
    rows = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert sum("train/warmup_updates" in line for line in rows) == 1


def test_warm_up_needs_prior_data():
    with pytest.raises(BadInput, match="warmup_updates"):
        SILConfig(warmup_updates=10)
    with pytest.raises(BadInput, match="warmup_updates must be >= 0"):
        SILConfig(warmup_updates=-1, prior_data="demos.h5")


def test_balance_tasks_draws_every_task_equally_and_survives_a_round_trip():
    """90 rows of one task and 10 of another: uniform draws follow the rows, balanced draws the tasks;
    a buffer restored from its state draws the same rows from the same generator state."""
    rows = ChunkRows(capacity=1000)
    for task, n in (("often", 90), ("rarely", 10)):
        rows.add([({"proprio": np.zeros(2, np.float32), "instruction": task},
                   np.zeros((2, 2), np.float32), np.ones(2, bool), 0) for _ in range(n)])  # fmt: skip
    rare = np.array([t == "rarely" for t in rows.obs["instruction"]])
    uniform = rows.sample(20_000, np.random.default_rng(0))
    balanced = rows.sample(20_000, np.random.default_rng(0), balance_tasks=True)
    assert rare[uniform].mean() == pytest.approx(0.1, abs=0.01)
    assert rare[balanced].mean() == pytest.approx(0.5, abs=0.015)
    again = ChunkRows(capacity=1000)
    again.load_state_dict(rows.state_dict())
    np.testing.assert_array_equal(
        again.sample(50, np.random.default_rng(1), True), rows.sample(50, np.random.default_rng(1), True)
    )
    no_text = ChunkRows(capacity=10)
    no_text.add([({"proprio": np.zeros(2, np.float32)}, np.zeros((2, 2), np.float32), np.ones(2, bool), 0)])
    with pytest.raises(BadInput, match="instruction"):
        no_text.sample(4, np.random.default_rng(0), balance_tasks=True)


def test_balance_tasks_trains_and_needs_an_instruction(tmp_path):
    out = _sil(tmp_path / "run", "--balance-tasks", "--total-steps", "120", "--steps-per-iteration", "5")
    assert out["train/success_rows"] > 0 and np.isfinite(out["train/sil_loss"])
    with pytest.raises(BadInput, match="'instruction' observation"):
        sil_main(["--env", "Pendulum-v1", "--policy", "gaussian", *FAST, "--balance-tasks",
                  "--run-dir", str(tmp_path / "p")])  # fmt: skip
    assert not (tmp_path / "p" / "checkpoints").exists()


GUIDED_FLOW = {"hidden_sizes": [16], "velocity_hidden": [32], "outcome_conditioned": True, "guidance": 2.0}
GUIDED = ["--policy", "flow", "--policy-kwargs", json.dumps(GUIDED_FLOW)]


def test_guided_self_imitation_learns_from_successes_and_failures_and_resumes_both(tmp_path):
    """``failure_share``: failed episodes are kept in a buffer of their own and imitated labelled as
    failures beside the successes; the outcome-conditioned flow policy, guided towards success, learns
    to walk. A resumed run (no updates) keeps both buffers."""
    args = [*ENV, *GUIDED, *FAST, "--run-dir", str(tmp_path / "run"), "--failure-share", "0.25",
            "--steps-per-iteration", "5", "--updates-per-iteration", "8", "--batch-size", "64",
            "--learning-rate", "3e-3", "--ema-decay", "0", "--checkpoint-every", "1"]  # fmt: skip
    final = sil_main([*args, "--total-steps", "1200", "--eval-at-start"])
    assert final["eval/success"] >= 0.7, final
    assert final["train/failure_rows"] > 0 and final["train/failure_share"] == pytest.approx(0.25)
    extra = latest_checkpoint(tmp_path / "run")[1]["extra"]
    fails, wins = extra["failures"], extra["successes"]
    assert fails["episodes"] > 0 and wins["episodes"] > 0
    forward = {name: (rows["actions"][..., 0][rows["valid"]] > 0).mean() for name, rows in extra.items()
               if name in ("failures", "successes")}  # fmt: skip
    assert forward["successes"] > forward["failures"], forward
    sil_main(
        [*args, "--total-steps", "1300", "--updates-per-iteration", "0", "--resume", str(tmp_path / "run")]
    )
    again = latest_checkpoint(tmp_path / "run")[1]["extra"]["failures"]
    np.testing.assert_array_equal(again["actions"][: len(fails["actions"])], fails["actions"])


def test_guided_minibatches_label_each_row_by_its_source(monkeypatch):
    """Prior and successful rows are labelled success, failed rows failure, and about
    ``unconditioned_share`` of all rows none; the shares follow ``prior_ratio`` and ``failure_share``."""
    from policies.flow import OUTCOMES, FlowPolicy
    from trainers.sil.algorithm import sil_update

    policy = FlowPolicy(spaces.Box(-1, 1, (2,), np.float32), spaces.Box(-1, 1, (2, 2), np.float32),
                        hidden_sizes=(8,), velocity_hidden=(8,), outcome_conditioned=True)  # fmt: skip
    seen = {}
    loss = policy.imitation_loss

    def recording(obs, actions, valid, outcome=None):
        seen["obs"], seen["outcome"] = obs["obs"], outcome
        return loss(obs, actions, valid, outcome=outcome)

    monkeypatch.setattr(policy, "imitation_loss", recording)

    def rows(value, n):
        buffer = ChunkRows(100)
        row = ({"obs": np.full(2, value, np.float32)}, np.zeros((2, 2), np.float32), np.ones(2, bool), 0)
        buffer.add([row] * n)
        return buffer

    prior = {"obs": {"obs": np.zeros((10, 2), np.float32)}, "actions": np.zeros((10, 2, 2), np.float32),
             "valid": np.ones((10, 2), bool)}  # fmt: skip
    config = SILConfig(batch_size=2000, prior_ratio=0.25, failure_share=0.25, unconditioned_share=0.1)
    optimizer = torch.optim.Adam(policy.parameters())
    out = sil_update(policy, optimizer, prior, rows(1.0, 5), config, np.random.default_rng(0),
                     BadUpdateGuard(10), None, rows(-1.0, 5))  # fmt: skip
    source = seen["obs"][:, 0]  # 0: prior, 1: successes, -1: failures
    assert [(source == v).sum() for v in (0.0, 1.0, -1.0)] == [500, 1000, 500]
    labels = seen["outcome"].numpy()
    assert (labels == OUTCOMES["none"]).mean() == pytest.approx(0.1, abs=0.02)
    labelled = labels != OUTCOMES["none"]
    assert (labels[labelled & (source >= 0)] == OUTCOMES["success"]).all()
    assert (labels[labelled & (source < 0)] == OUTCOMES["failure"]).all()
    assert float(out["failure_share"]) == 0.25 and float(out["prior_share"]) == 0.25


def test_guided_self_imitation_bad_settings_are_refused_before_any_env_step(tmp_path):
    with pytest.raises(BadInput, match="prior_ratio \\+ failure_share < 1"):
        SILConfig(prior_ratio=0.5, failure_share=0.5)
    with pytest.raises(BadInput, match="failure_share must be in"):
        SILConfig(failure_share=-0.1)
    with pytest.raises(BadInput, match="unconditioned_share"):
        SILConfig(unconditioned_share=1.5)
    with pytest.raises(BadInput, match="outcome-conditioned flow policy"):
        _sil(tmp_path / "g", "--failure-share", "0.25")  # the Gaussian policy has no outcome input
    assert not (tmp_path / "g" / "checkpoints").exists()


def test_a_guided_run_starts_from_a_plain_flow_checkpoint(tmp_path):
    """``--init-policy`` of a plain flow policy with ``outcome_conditioned`` in ``--policy-kwargs``: the
    weights load, the outcome embedding (missing from them) starts at zero, and the saved spec says so."""
    flow = {"hidden_sizes": [16], "velocity_hidden": [32]}
    plain = ["--policy", "flow", "--policy-kwargs", json.dumps(flow)]
    sil_main([*ENV, *plain, *FAST, "--run-dir", str(tmp_path / "plain"), "--total-steps", "80",
              "--steps-per-iteration", "5", "--ema-decay", "0"])  # fmt: skip
    kwargs = json.dumps({"outcome_conditioned": True, "guidance": 1.5})
    sil_main([*ENV, *FAST, "--run-dir", str(tmp_path / "guided"), "--init-policy", str(tmp_path / "plain"),
              "--policy-kwargs", kwargs, "--failure-share", "0.25", "--total-steps", "80",
              "--steps-per-iteration", "5", "--updates-per-iteration", "0", "--ema-decay", "0"])  # fmt: skip
    before = latest_checkpoint(tmp_path / "plain")[1]["policy"]
    after = latest_checkpoint(tmp_path / "guided")[1]["policy"]
    assert after["kwargs"]["outcome_conditioned"] is True and after["kwargs"]["guidance"] == 1.5
    for name, value in before["state_dict"].items():
        torch.testing.assert_close(after["state_dict"][name], value, rtol=0, atol=0)
    assert not after["state_dict"]["outcome_embedding.weight"].any()


OBS = spaces.Dict({"proprio": spaces.Box(-5, 5, (2,), np.float32)})


def _rows(x: float, n: int) -> list:
    """``n`` chunk-steps of one episode whose state is ``(x, 1)``."""
    return [
        ({"proprio": np.array([x, 1.0], np.float32)}, np.zeros((2, 1), np.float32), np.ones(2, bool), 0)
    ] * n


def test_value_learns_where_success_is_rare_and_weighs_those_successes_most():
    """From state +1 the policy succeeds 9 times in 10, from -1 once in 10: V learns both rates, a
    success from -1 weighs about 0.9 and one from +1 about 0.1, and the draws follow the weights."""
    torch.manual_seed(0)
    policy = GaussianPolicy(OBS, spaces.Box(-1, 1, (2, 1), np.float32), hidden_sizes=[16])
    value = SuccessValue(policy, learning_rate=3e-3)
    successes, failures = ChunkRows(10_000), ChunkRows(10_000)
    for x, wins in ((1.0, 9), (-1.0, 1)):
        for episode in range(10):
            (successes if episode < wins else failures).add(_rows(x, 5))
    np.testing.assert_allclose(value.weights(successes), 0.5)  # an untrained V weighs all alike
    rng, guard = np.random.default_rng(0), BadUpdateGuard()
    losses = [float(value.update(successes, failures, 128, rng, guard)) for _ in range(300)]
    assert losses[-1] < losses[0]
    weights = value.weights(successes)
    hard = successes.obs["proprio"][:, 0] < 0
    assert weights[hard].mean() == pytest.approx(0.9, abs=0.08)
    assert weights[~hard].mean() == pytest.approx(0.1, abs=0.08)
    drawn = successes.sample(20_000, np.random.default_rng(1), weights=weights)
    share = weights[hard].sum() / weights.sum()  # one hard success's 5 rows against 9 easy ones' 45
    assert hard[drawn].mean() == pytest.approx(share, abs=0.015) and share > 0.4


def test_value_weighting_bad_input_is_named():
    with pytest.raises(BadInput, match="value_every must be >= 1"):
        SILConfig(value_weighting=True, value_every=0)
    with pytest.raises(BadInput, match="value_weighting and balance_tasks"):
        SILConfig(value_weighting=True, balance_tasks=True)
    with pytest.raises(BadInput, match="value_weighting learns V.*Linear has none"):
        SuccessValue(torch.nn.Linear(2, 2), 1e-3)
    rows = ChunkRows(10)
    rows.add(_rows(0.0, 3))
    with pytest.raises(BadInput, match=r"one per row \(3\)"):
        rows.sample(4, np.random.default_rng(0), weights=np.ones(2))


def test_a_value_weighted_run_learns_and_resumes_its_value(tmp_path):
    """On the counting env a value-weighted run keeps failures beside successes, trains V, and its
    checkpoint carries V and its optimizer, which a resume with no update takes back unchanged."""
    args = ["--value-weighting", "--value-every", "2", "--steps-per-iteration", "5", "--batch-size", "32",
            "--learning-rate", "3e-3", "--eval-every", "-1", "--checkpoint-every", "1"]  # fmt: skip
    first = _sil(tmp_path / "run", *args, "--total-steps", "200")
    assert first["train/success_rows"] > 0 and first["train/failure_rows"] > 0
    assert np.isfinite(first["train/value_loss"]) and 0 < first["train/success_weight_mean"] < 1
    before = latest_checkpoint(tmp_path / "run")[1]["extra"]
    _sil(tmp_path / "run", *args, "--total-steps", "240", "--updates-per-iteration", "0",
         "--resume", str(tmp_path / "run"))  # fmt: skip
    after = latest_checkpoint(tmp_path / "run")[1]["extra"]
    for name, weight in before["value"]["net"].items():
        torch.testing.assert_close(after["value"]["net"][name], weight, rtol=0, atol=0)
    assert after["value"]["optimizer"]["state"].keys() == before["value"]["optimizer"]["state"].keys()
    assert after["failures"]["episodes"] >= before["failures"]["episodes"]

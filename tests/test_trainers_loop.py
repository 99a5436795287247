"""The training loops end to end: command line, logging, evaluation, checkpoints, exact resume,
bad input. Short runs on CartPole (seconds); learning-curve figures live in benchmarks/."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import subprocess
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch

from trainers import checkpoint as ckpt
from trainers.config import parse
from trainers.grpo import GroupStarts, group_reset
from trainers.grpo import train as grpo_train
from trainers.metrics import read_metrics
from trainers.ppo import PPOConfig
from trainers.ppo import train as ppo_train
from trainers.rollout import Collector
from trainers.run import RunConfig

FAST = ["--no-progress", "--no-tensorboard", "--no-video", "--torch-threads", "1"]


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


# ---------------------------------------------------------------------- config and command line
def test_flags_config_file_and_types(tmp_path):
    classes = {"run": RunConfig, "ppo": PPOConfig}
    cfg = parse(
        classes,
        [
            "--env",
            "Pendulum-v1",
            "--num-envs",
            "3",
            "--no-tensorboard",
            "--clip-value",
            "0.2",
            "--target-kl",
            "none",
            "--env-kwargs",
            '{"g": 9.0}',
            "--time-unit",
            "chunk",
        ],
    )
    run, ppo = cfg["run"], cfg["ppo"]
    assert (run.env, run.num_envs, run.tensorboard, run.env_kwargs) == ("Pendulum-v1", 3, False, {"g": 9.0})
    assert (ppo.clip_value, ppo.target_kl, ppo.time_unit, ppo.n_steps) == (0.2, None, "chunk", 2048)
    assert run.video is True and run.seed == 0  # flags not given keep the defaults
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"run": {"num_envs": 5, "seed": 3}, "ppo": {"n_epochs": 2}}))
    cfg = parse(classes, ["--config", str(path), "--seed", "4"])
    assert (cfg["run"].num_envs, cfg["run"].seed, cfg["ppo"].n_epochs) == (5, 4, 2)  # flags win
    path.write_text(json.dumps({"ppo": {"target_kl": 0.01, "normalize": 1}}))
    with pytest.raises(ValueError, match="unknown ppo settings"):
        parse(classes, ["--config", str(path)])
    path.write_text(json.dumps({"ppo": {"target_kl": 0.01}, "run": {"tensorboard": False}}))
    cfg = parse(classes, ["--config", str(path), "--target-kl", "none", "--tensorboard"])
    assert cfg["ppo"].target_kl is None and cfg["run"].tensorboard  # "none" and --flag override the file
    path.write_text(json.dumps({"ppo": {"n_epoch": 2}}))
    with pytest.raises(ValueError, match="unknown ppo settings \\['n_epoch'\\]"):
        parse(classes, ["--config", str(path)])
    with pytest.raises(SystemExit):  # argparse rejects a value outside a Literal's choices
        parse(classes, ["--time-unit", "episode"])
    with pytest.raises(ValueError, match="time_unit"):
        PPOConfig(time_unit="episode")


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"run": None}, "the 'run' settings must be a JSON object"),
        ({"run": {"num_envs": True}}, r"RunConfig.num_envs: expected int, got True"),
        ({"run": {"num_envs": "8"}}, r"RunConfig.num_envs: expected int, got '8'"),
        ({"run": {"env_kwargs": [1]}}, r"RunConfig.env_kwargs: expected a JSON object, got \[1\]"),
        ({"run": {"seed": -1}}, "seed must be >= 0, got -1"),
        ({"run": {"eval_num_envs": -3}}, "eval_num_envs must be >= 0, got -3"),
        ({"run": {"device": "cuda"}}, "CUDA is not available"),
        ({"run": {"device": "meta"}}, "training runs on cpu, cuda or cuda:N"),
        ({"run": {"max_minutes": -1.0}}, "max_minutes must be a finite number >= 0"),
        ({"run": {"loop": "later"}}, r"RunConfig.loop: expected one of"),
        ({"run": {"seed": 2**64}}, r"seed must be in \[0, 2\*\*32 - 1\], got 18446744073709551616"),
        ({"ppo": {"gamma": float("nan")}}, r"PPOConfig.gamma: expected a finite number, got nan"),
        (
            {"ppo": {"learning_rate": float("inf")}},
            r"PPOConfig.learning_rate: expected a finite number, got inf",
        ),
        ({"run": {"autoreset_mode": 3}}, r"RunConfig.autoreset_mode: expected one of"),
        ({"ppo": {"target_kl": -1}}, "target_kl must be > 0"),
        ({"ppo": {"clip_low": -1}}, "need 0 <= clip_low < 1"),
        ({"ppo": {"gamma": "0.9"}}, r"PPOConfig.gamma: expected a number, got '0.9'"),
        ({"ppo": {"target_kl": "x"}}, r"PPOConfig.target_kl: expected float \| None, got 'x'"),
    ],
)
def test_bad_settings_are_a_value_error_naming_the_field(tmp_path, settings, message):
    """A config file's values of the wrong type or out of range: a ValueError naming the setting,
    what it expects and what came (never a raw TypeError, never accepted)."""
    if "device" in (settings.get("run") or {}) and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    path = tmp_path / "c.json"
    path.write_text(json.dumps(settings))
    with pytest.raises(ValueError, match=message):
        parse({"run": RunConfig, "ppo": PPOConfig}, ["--config", str(path)])


def test_help_names_the_program_as_it_is_run():
    for module in (
        "trainers",
        "trainers.sac",
        "trainers.checkpoint",
        "benchmarks.evaluate",
        "benchmarks.rl_recipe_study",
    ):
        out = subprocess.run(
            [sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0 and out.stdout.startswith(f"usage: python -m {module} "), out.stdout[:200]


def test_help_shows_each_fields_docstring(capsys):
    """A field's docstring (the string right below it) is its --help text; comments are not read."""
    from dataclasses import dataclass

    from trainers.config import add_arguments, field_docs

    @dataclass
    class Base:
        z: int = 0
        """from the base class"""

    @dataclass
    class Example(Base):
        # a comment above a field is no help
        a: int = 1
        """the docstring below a field
        is its help, one paragraph"""
        b: float = 0.5  # an end-of-line comment is no help either
        """50% of the docstring"""
        c: str = "x"
        # -- a section title
        d: int = 3
        """d's docstring"""
        "a second string is not read"

    assert field_docs(Example) == {
        "z": "from the base class",
        "a": "the docstring below a field is its help, one paragraph",
        "b": "50% of the docstring",
        "d": "d's docstring",
    }
    parser = argparse.ArgumentParser()
    add_arguments(parser, Example)
    text = " ".join(parser.format_help().split())
    assert "-a A the docstring below a field is its help, one paragraph (default: 1)" in text
    assert "-b B 50% of the docstring (default: 0.5)" in text
    assert "-c C (default: x)" in text and "comment" not in text
    with pytest.raises(SystemExit):
        parse({"run": RunConfig, "ppo": PPOConfig}, ["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert (
        "--total-steps TOTAL_STEPS env steps (executed sub-steps, summed over envs) (default: 100000)" in text
    )
    assert "--n-steps N_STEPS policy steps per env per rollout (default: 2048)" in text


@pytest.mark.parametrize("algo", ["grpo", "ppo", "sac"])
def test_every_flag_says_what_it_means(algo, capsys):
    """``python -m trainers --help``: every field of every trainer's config has help text besides
    its default, --policy names every registered policy, and the examples keep their lines."""
    import dataclasses

    from policies.registry import POLICIES
    from trainers.__main__ import ALGOS
    from trainers.__main__ import main as trainers_main
    from trainers.config import field_docs

    for cls in (RunConfig, ALGOS[algo][0]):
        missing = [f.name for f in dataclasses.fields(cls) if f.name not in field_docs(cls)]
        assert not missing, f"{cls.__name__} fields without help: {missing}"
    with pytest.raises(SystemExit):
        trainers_main(["--algo", algo, "--help"])
    out = capsys.readouterr().out
    policy_help = " ".join(out.split("\n  --policy POLICY", 1)[1].split("--policy-kwargs", 1)[0].split())
    assert all(name in policy_help for name in POLICIES), policy_help
    assert "\n    python -m trainers --config configs/libero_spatial_sil.json" in out  # the main job


def test_every_command_lines_settings_have_docstrings():
    """Every field of every dataclass a command line parses has a docstring (its --help text)."""
    from trainers.bc import BCConfig
    from trainers.config import field_docs
    from trainers.demos import DemoConfig
    from trainers.grpo import GRPOConfig
    from trainers.reward_model.train import RewardModelConfig
    from trainers.sac import SACConfig

    for cls in (RunConfig, PPOConfig, GRPOConfig, SACConfig, BCConfig, DemoConfig, RewardModelConfig):
        missing = [f.name for f in dataclasses.fields(cls) if not field_docs(cls).get(f.name)]
        assert not missing, f"{cls.__name__} fields without a docstring: {missing}"


# ---------------------------------------------------------------------- PPO
def _ppo_args(tmp_path, *extra):
    return [
        "--env",
        "CartPole-v1",
        "--num-envs",
        "4",
        "--n-steps",
        "128",
        "--run-dir",
        str(tmp_path / "run"),
        *FAST,
        *extra,
    ]


@pytest.mark.slow
def test_ppo_command_line_learns_logs_and_checkpoints(tmp_path):
    final = ppo_train.main(
        _ppo_args(
            tmp_path,
            "--total-steps",
            "12000",
            "--eval-every",
            "10",
            "--checkpoint-every",
            "5",
            "--keep-checkpoints",
            "2",
            "--seed",
            "1",
        )
    )
    run_dir = tmp_path / "run"
    rows = read_metrics(run_dir)
    iterations = [r["iteration"] for r in rows if "train/loss" in r]
    assert iterations == list(range(1, 25))  # 24 x 512 steps >= 12000
    assert rows[-1]["step"] == 24 * 512 and "eval/return" in rows[-1]
    for key in (
        "env/return",
        "env/episode_len",
        "train/approx_kl",
        "train/clip_fraction",
        "train/entropy",
        "train/grad_norm",
        "train/explained_variance",
        "time/sps",
    ):
        assert key in rows[5], key
    assert any("eval/return" in r for r in rows[:-1])  # periodic evaluation (iteration 10 and 20)
    assert [p.name for p in ckpt.checkpoint_paths(run_dir)] == ["iter_000020.pt", "iter_000024.pt"]
    assert json.loads((run_dir / "config.json").read_text())["ppo"]["n_steps"] == 128
    # it learned: the first episodes of random play last ~20 steps
    first = next(r["env/return"] for r in rows if "env/return" in r)
    assert final["eval/return"] > max(100.0, 3 * first), (first, final["eval/return"])


def test_ppo_running_obs_norm_counts_every_executed_step(tmp_path):
    """``obs_norm="running"``: after each update the rollout's observations join the statistics of
    the actor and the critic torso, and the run's checkpoint holds them."""
    kwargs = '{"torso_kwargs": {"obs_norm": "running"}}'
    args = _ppo_args(tmp_path, "--total-steps", "1024", "--eval-every", "-1", "--policy-kwargs", kwargs)
    ppo_train.main(args)
    state = ckpt.latest_checkpoint(tmp_path / "run")[1]["policy"]["state_dict"]
    counts = {k: int(v) for k, v in state.items() if k.endswith("norm_count")}
    assert counts == {"torso.encoders.obs.norm_count": 1024, "critic_torso.encoders.obs.norm_count": 1024}
    assert state["torso.encoders.obs.norm_var"].gt(0).all()


def test_max_minutes_ends_the_run_at_the_end_of_an_iteration(tmp_path):
    args = _ppo_args(tmp_path, "--total-steps", "100000", "--eval-every", "-1", "--max-minutes", "1e-6")
    ppo_train.main(args)
    counters = ckpt.latest_checkpoint(tmp_path / "run")[1]["counters"]
    assert counters["iteration"] == 1 and counters["env_steps"] < 100000


def test_ppo_resume_restores_weights_optimizer_rng_and_counters(tmp_path):
    args = _ppo_args(tmp_path, "--total-steps", "2048", "--checkpoint-every", "2", "--eval-every", "-1")
    ppo_train.main(args)
    path, data = ckpt.latest_checkpoint(tmp_path / "run")
    assert path.name == "iter_000004.pt" and data["counters"]["env_steps"] == 2048
    # continue the same run to a larger budget: only the changed flag is given again
    ppo_train.main(["--resume", str(tmp_path / "run"), "--total-steps", "4096", *FAST])
    rows = read_metrics(tmp_path / "run")
    assert [r["iteration"] for r in rows] == list(range(1, 9))
    assert rows[-1]["step"] == 4096
    _, data2 = ckpt.latest_checkpoint(tmp_path / "run")
    assert data2["counters"]["iteration"] == 8 and data2["config"]["run"]["total_steps"] == 4096
    assert data2["optimizer"]["state"][0]["step"] > data["optimizer"]["state"][0]["step"]


# ---------------------------------------------------------------------- GRPO
def _grpo_args(tmp_path, name, *extra):
    return [
        "--env",
        "CartPole-v1",
        "--num-envs",
        "8",
        "--group-size",
        "4",
        "--learning-rate",
        "3e-3",
        "--log-prob-level",
        "chunk",
        "--run-dir",
        str(tmp_path / name),
        "--eval-every",
        "-1",
        *FAST,
        *extra,
    ]


def test_grpo_killed_run_resumes_exactly(tmp_path, monkeypatch):
    budget = [
        "--total-steps",
        "2500",
        "--checkpoint-every",
        "2",
        "--resample-rounds",
        "2",
        "--kl-beta",
        "0.05",
        "--sil-coef",
        "0.5",
    ]
    final = grpo_train.main(_grpo_args(tmp_path, "straight", *budget))
    straight = ckpt.latest_checkpoint(tmp_path / "straight")[1]
    n_iter = straight["counters"]["iteration"]
    assert n_iter >= 4 and math.isfinite(final["env/return"])
    assert len(straight["extra"]["sil"]["valid"]) > 0 and final["train/sil_loss"] != 0

    # the same run, killed during iteration 4 (after the checkpoint of iteration 2)
    real_update, calls = grpo_train.grpo_update, []

    def dying_update(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real_update(*args, **kwargs)

    monkeypatch.setattr(grpo_train, "grpo_update", dying_update)
    with pytest.raises(KeyboardInterrupt):
        grpo_train.main(_grpo_args(tmp_path, "killed", *budget))
    assert ckpt.latest_checkpoint(tmp_path / "killed")[0].name == "iter_000002.pt"
    monkeypatch.setattr(grpo_train, "grpo_update", real_update)
    grpo_train.main(["--resume", str(tmp_path / "killed"), *FAST])
    resumed = ckpt.latest_checkpoint(tmp_path / "killed")[1]

    assert resumed["counters"]["env_steps"] == straight["counters"]["env_steps"]
    for key, value in straight["policy"]["state_dict"].items():
        assert torch.equal(value, resumed["policy"]["state_dict"][key]), key
    rows = read_metrics(tmp_path / "killed")
    assert [r["iteration"] for r in rows if "train/loss" in r] == list(range(1, n_iter + 1))

    # resuming the finished run trains nothing and keeps the loop's state in its last checkpoint
    grpo_train.main(["--resume", str(tmp_path / "killed"), *FAST])
    again = ckpt.latest_checkpoint(tmp_path / "killed")[1]
    for key in ("iteration", "env_steps", "episodes"):
        assert again["counters"][key] == resumed["counters"][key], key
    assert set(again["extra"]) == set(resumed["extra"]) and "sil" in again["extra"]
    assert torch.equal(
        torch.as_tensor(again["extra"]["sil"]["valid"]), torch.as_tensor(resumed["extra"]["sil"]["valid"])
    )


def test_grpo_lifts_cartpole(tmp_path):
    final = grpo_train.main(
        _grpo_args(
            tmp_path,
            "run",
            "--total-steps",
            "40000",
            "--num-envs",
            "16",
            "--group-size",
            "8",
            "--weight-decay",
            "0",
            "--eval-episodes",
            "4",
            "--eval-every",
            "0",
        )
    )
    rows = read_metrics(tmp_path / "run")
    first = rows[0]["env/return"]
    assert first < 40 and final["env/return"] > 2.5 * first, (first, final["env/return"])
    assert rows[0]["train/groups_kept"] == 1.0  # random CartPole lengths differ within a group


def test_group_reset_gives_each_group_one_start():
    env = gym.make_vec("CartPole-v1", 6, vectorization_mode="sync")
    kwargs = group_reset(env, 3, seed=0, iteration=5, rnd=0)
    obs, _ = env.reset(**kwargs)
    assert (
        np.array_equal(obs[0], obs[2])
        and np.array_equal(obs[3], obs[5])
        and not np.array_equal(obs[0], obs[3])
    )
    assert kwargs == group_reset(env, 3, seed=0, iteration=5, rnd=0)  # a function of its inputs
    assert kwargs != group_reset(env, 3, seed=0, iteration=5, rnd=1)

    class WithFrames:
        num_envs, initial_frames = 4, list(range(50))

    ids = group_reset(WithFrames(), 2, 0, 0, 0)["options"]["initial_frames"]
    assert ids[0] == ids[1] and ids[2] == ids[3] and all(0 <= i < 50 for i in ids)


def test_grpo_rejects_groups_that_do_not_divide_the_envs(tmp_path):
    with pytest.raises(ValueError, match="num_envs=6 must be a multiple of group_size=4"):
        grpo_train.main(_grpo_args(tmp_path, "run", "--num-envs", "6"))


# ---------------------------------------------------------------------- robustness
def test_checkpoints_are_atomic_and_a_corrupt_one_is_skipped(tmp_path):
    run_dir = tmp_path / "run"
    ckpt.save_checkpoint(run_dir / "checkpoints" / "iter_000001.pt", {"counters": {"iteration": 1}})
    ckpt.save_checkpoint(run_dir / "checkpoints" / "iter_000002.pt", {"counters": {"iteration": 2}})
    (run_dir / "checkpoints" / ".iter_000003.pt.partial").write_bytes(b"half a file")  # killed mid-write
    assert ckpt.latest_checkpoint(run_dir)[1]["counters"]["iteration"] == 2
    (run_dir / "checkpoints" / "iter_000002.pt").write_bytes(b"garbage")
    with pytest.warns(RuntimeWarning, match="skipping unreadable checkpoint"):
        assert ckpt.latest_checkpoint(run_dir)[1]["counters"]["iteration"] == 1
    with pytest.raises(FileNotFoundError, match="no checkpoints under"):
        ckpt.latest_checkpoint(tmp_path / "elsewhere")
    torch.save({"weights": 1}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not a vla-gym checkpoint"):
        ckpt.load_checkpoint(tmp_path / "other.pt")


class WrongRewardShape(gym.vector.VectorWrapper):
    def step(self, actions):
        obs, reward, term, trunc, info = self.env.step(actions)
        return obs, reward[:, None], term, trunc, info


def test_env_with_wrong_shapes_is_named():
    from policies import CategoricalPolicy

    env = WrongRewardShape(gym.make_vec("CartPole-v1", 2, vectorization_mode="sync"))
    policy = CategoricalPolicy(env.single_observation_space, env.single_action_space)
    with pytest.raises(
        ValueError, match=r"env CartPole-v1: step returned reward of shape \(2, 1\), expected \(2,\)"
    ):
        Collector(env, policy).collect(2)


def test_nan_updates_are_skipped_then_stop_the_run(tmp_path, monkeypatch):
    from trainers.ppo import algorithm

    real = algorithm.value_loss
    monkeypatch.setattr(algorithm, "value_loss", lambda *a, **k: real(*a, **k) * float("nan"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with pytest.raises(RuntimeError, match="3 updates in a row had a non-finite loss"):
            ppo_train.main(_ppo_args(tmp_path, "--total-steps", "2048", "--max-bad-updates", "3"))


def test_module_entry_points_print_help():
    for module in ("trainers.ppo", "trainers.grpo"):
        out = subprocess.run(
            [sys.executable, "-m", module, "--help"], capture_output=True, text=True, check=True
        )
        assert "--total-steps" in out.stdout and "--resume" in out.stdout


def test_ppo_critic_warmup_trains_the_critic_only():
    from policies import GaussianPolicy
    from trainers.ppo import make_optimizer, ppo_update

    env = gym.make_vec("Pendulum-v1", 4, vectorization_mode="sync")
    policy = GaussianPolicy(env.single_observation_space, env.single_action_space)
    policy.seed(0)
    col = Collector(env, policy)
    col.reset(seed=0)
    rollout = col.collect(16)
    config = PPOConfig(batch_size=16, n_epochs=2, critic_warmup_iters=1)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    ppo_update(policy, make_optimizer(policy, config), rollout, config, train_actor=False)
    changed = {k for k, v in policy.state_dict().items() if not torch.equal(v, before[k])}
    assert changed and all(k.startswith(("critic_torso.", "value_head.")) for k in changed), changed
    with pytest.raises(ValueError, match="critic_warmup_iters must be >= 0"):
        PPOConfig(critic_warmup_iters=-1)


def test_group_reset_keeps_each_groups_task_for_same_task_iters():
    class WithTasks:
        num_envs = 6
        initial_frames = list(range(30))  # frames 10 t .. 10 t + 9 belong to task t

    tasks = [f"task{i // 10}" for i in range(30)]
    env, seen = WithTasks(), []
    for it in range(6):
        ids = group_reset(env, 2, 0, it, 0, same_task_iters=3, tasks=tasks)["options"]["initial_frames"]
        assert ids[0::2] == ids[1::2]  # groups of 2 share a start
        seen.append([i // 10 for i in ids[0::2]])
    assert seen[0] == seen[1] == seen[2] and seen[3] == seen[4] == seen[5]
    # starts still vary inside the block, and every frame stays equally likely
    counts = np.zeros(30)
    for it in range(3000):
        for i in group_reset(env, 2, 0, it, 0, same_task_iters=3, tasks=tasks)["options"]["initial_frames"]:
            counts[i] += 1
    assert counts.min() > 0.8 * counts.mean() and counts.max() < 1.2 * counts.mean()


def test_informative_starts_favour_tasks_whose_groups_carried_signal():
    class Frame:
        def __init__(self, i):
            self.task = f"task{i // 10}"

    class WithTasks:
        num_envs = 4
        initial_frames = [Frame(i) for i in range(30)]  # three tasks of 10 frames

    starts = GroupStarts(WithTasks(), 2, seed=0, weighting="informative")
    seen = {"task0": 0, "task1": 0, "task2": 0}
    for it in range(400):
        ids = starts.reset_kwargs(it, 0)["options"]["initial_frames"]
        groups = [f"task{i // 10}" for i in ids[0::2]]
        for task in groups:
            seen[task] += 1
        starts.record(torch.tensor([task == "task1" for task in groups]))  # only task1 has signal
    assert seen["task1"] > 3 * max(seen["task0"], seen["task2"])
    restored = GroupStarts(WithTasks(), 2, seed=0, weighting="informative")
    restored.load_state_dict(starts.state_dict())
    assert restored.reset_kwargs(400, 0) == starts.reset_kwargs(400, 0)
    with pytest.raises(ValueError, match="needs an env whose initial_frames say their task"):
        GroupStarts(gym.make_vec("CartPole-v1", 2, vectorization_mode="sync"), 2, 0, weighting="informative")


def test_user_callbacks_see_every_hook_in_order_and_add_metrics(tmp_path):
    from trainers.callbacks import Callback
    from trainers.ppo.algorithm import PPOConfig
    from trainers.ppo.train import train
    from trainers.run import RunConfig

    calls = []

    class Recorder(Callback):
        def on_training_start(self, run):
            calls.append(("start", run.counters["iteration"]))

        def on_iteration_end(self, run, row):
            row["custom/twice"] = 2 * row["iteration"]
            calls.append(("end", row["iteration"], "eval/return" in row))

        def on_row_logged(self, run, row):
            calls.append(("logged", row["iteration"], len(read_metrics(run.dir))))

        def on_training_end(self, run, final):
            final["custom/done"] = 1.0
            calls.append(("finish", run.counters["iteration"], "eval/return" in final))

    cfg = RunConfig(
        env="CartPole-v1", num_envs=2, total_steps=512, run_dir=str(tmp_path / "run"), eval_every=2,
        eval_at_start=True, eval_episodes=2, video=False, tensorboard=False, progress=False, torch_threads=1,
    )  # fmt: skip
    final = train(cfg, PPOConfig(n_steps=64, batch_size=64), callbacks=[Recorder()])
    assert calls[0] == ("start", 0)
    # the default Evaluation ran first (iteration 2: eval metrics already in the row); rows logged before
    # on_row_logged; the run's own final evaluation is in ``final`` before the user's end hook
    assert calls[1:5] == [("end", 1, False), ("logged", 1, 2), ("end", 2, True), ("logged", 2, 3)]
    assert calls[-1] == ("finish", 4, True) and final["custom/done"] == 1.0
    rows = read_metrics(tmp_path / "run")
    assert [r.get("custom/twice") for r in rows if "custom/twice" in r] == [2, 4, 6, 8]


def test_a_callback_returning_false_stops_the_run_cleanly(tmp_path):
    """SB3's rule: a hook returning False stops training. The iteration's other hooks still run,
    then the run finishes as at its last step: one final evaluation (not a second one at the step
    just evaluated), the final checkpoint, summary.md, the folder's lock released; it resumes."""
    from trainers.callbacks import Callback, RunContext
    from trainers.ppo.train import train

    class StopAt(Callback):
        def __init__(self, iteration):
            self.iteration, self.logged = iteration, []

        def on_iteration_end(self, run: RunContext, row):
            return run.counters["iteration"] < self.iteration  # False at `iteration`: stop

        def on_row_logged(self, run, row):
            self.logged.append(row["iteration"])  # None: carry on

    cfg = RunConfig(
        env="CartPole-v1", num_envs=2, total_steps=100_000, run_dir=str(tmp_path / "run"), eval_every=2,
        eval_episodes=2, video=False, tensorboard=False, progress=False, torch_threads=1, checkpoint_every=0,
    )  # fmt: skip
    stop = StopAt(2)
    final = train(cfg, PPOConfig(n_steps=64, batch_size=64), callbacks=[stop])
    assert stop.logged == [1, 2] and final["iteration"] == 2 and "eval/return" in final
    run_dir = tmp_path / "run"
    assert [p.name for p in ckpt.checkpoint_paths(run_dir)] == ["iter_000002.pt"]
    assert ckpt.latest_checkpoint(run_dir)[1]["counters"]["env_steps"] == 256
    assert "| iterations | 2 |" in (run_dir / "summary.md").read_text()
    episodes = [json.loads(line) for line in (run_dir / "eval_episodes.jsonl").read_text().splitlines()]
    assert [ep["env_step"] for ep in episodes] == [256, 256]  # evaluated once at the stop
    assert [r["iteration"] for r in read_metrics(run_dir)] == [1, 2]

    # the stop is not saved with the run: a resume goes on (here to the next stop)
    resumed = dataclasses.replace(cfg, run_dir=None, resume=str(run_dir))
    final = train(resumed, PPOConfig(n_steps=64, batch_size=64), callbacks=[StopAt(3)])
    assert final["iteration"] == 3 and ckpt.latest_checkpoint(run_dir)[0].name == "iter_000003.pt"


def test_a_sampled_evaluation_of_training_starts_leaves_training_unchanged_and_resumes(tmp_path):
    """A second ``Evaluation`` (a user callback): sampled actions on the training env, its own
    metrics and episodes file, its own sampling stream (the run trains exactly as without it), its
    file trimmed to the checkpoint on resume."""
    from trainers.callbacks import Evaluation
    from trainers.ppo.train import train

    def config(name, **kw):
        return RunConfig(
            env="CartPole-v1", num_envs=2, total_steps=512, run_dir=str(tmp_path / name), eval_every=0,
            eval_at_start=True, eval_episodes=3, video=False, tensorboard=False, progress=False,
            torch_threads=1, checkpoint_every=2, **kw,
        )  # fmt: skip

    def sampled():
        return Evaluation(
            "sampled", every=2, at_start=True, episodes=3, train_env_kwargs={}, deterministic=False
        )

    ppo = PPOConfig(n_steps=64, batch_size=64)
    final = train(config("with"), ppo, callbacks=[sampled()])
    train(config("without"), ppo)
    weights = [ckpt.latest_checkpoint(tmp_path / n)[1]["policy"]["state_dict"] for n in ("with", "without")]
    for key, value in weights[0].items():
        assert torch.equal(value, weights[1][key]), key
    rows = read_metrics(tmp_path / "with")
    assert [r["iteration"] for r in rows if "sampled/return" in r] == [0, 2, 4]  # start, every 2, end
    assert "sampled/return" in final and "eval/return" in final
    episodes = [
        json.loads(line) for line in (tmp_path / "with" / "sampled_episodes.jsonl").read_text().splitlines()
    ]
    assert [ep["env_step"] for ep in episodes] == [0] * 3 + [256] * 3 + [512] * 3
    # the same starts (env reset seeds) as the deterministic evaluation, but sampled actions
    det = [json.loads(line) for line in (tmp_path / "with" / "eval_episodes.jsonl").read_text().splitlines()]
    assert [ep["length"] for ep in episodes[:3]] != [ep["length"] for ep in det[:3]]

    # resumed from iteration 2: the later rows are dropped, then the same evaluations come again
    (tmp_path / "with" / "checkpoints" / "iter_000004.pt").unlink()
    train(config("resumed", resume=str(tmp_path / "with")), ppo, callbacks=[sampled()])
    again = [
        json.loads(line) for line in (tmp_path / "with" / "sampled_episodes.jsonl").read_text().splitlines()
    ]
    assert again == episodes


def test_the_checkpoint_digest_takes_empty_arrays():
    """Zero-size arrays (nothing collected yet) are digested by dtype and shape, not refused."""
    from trainers.checkpoint import payload_digest

    empty = payload_digest({"a": np.zeros((0, 8, 7), np.float32), "t": torch.zeros(0)})
    assert empty != payload_digest({"a": np.zeros((0, 8, 6), np.float32), "t": torch.zeros(0)})
    assert empty == payload_digest({"a": np.zeros((0, 8, 7), np.float32), "t": torch.zeros(0)})

"""The README's main job (the self-imitation recipe in configs/, from the shipped 20-demo flow clone) and the
other recipes (SAC with its prior data, DSRL, GRPO), through ``python -m trainers``, on real LIBERO with the
repository's checkpoints, cut to a tiny budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import requires_libero

from trainers.__main__ import config_algo, main
from trainers.config import load_config
from trainers.grpo.algorithm import GRPOConfig
from trainers.metrics import read_metrics
from trainers.ppo.algorithm import PPOConfig
from trainers.run import RunConfig

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "configs" / "libero_spatial_grpo.json"
SAC_RECIPE = ROOT / "configs" / "libero_spatial_sac.json"  # with its prior data's demos config
DSRL_RECIPE = ROOT / "configs" / "libero_spatial_dsrl.json"  # steers the shipped flow clone
DEMOS = ROOT / "configs" / "libero_spatial_demos.json"
SIL_RECIPE = ROOT / "configs" / "libero_spatial_sil.json"  # self-imitation from the 20-demo clone


def test_recipe_names_a_checkpoint_that_exists_and_holds_out_init_states():
    data = load_config(RECIPE, {"run": RunConfig, "grpo": GRPOConfig})
    run = RunConfig(**data["run"])
    assert (ROOT / run.init_policy).is_file()
    train, held_out = set(run.env_kwargs["init_states"]), set(run.eval_env_kwargs["init_states"])
    assert train and held_out and not train & held_out
    assert config_algo(["--config", str(RECIPE)]) == "grpo"


def test_sac_recipe_and_its_prior_data_use_training_starts_only():
    from trainers.demos import DemoConfig
    from trainers.sac import SACConfig

    sac = load_config(SAC_RECIPE, {"run": RunConfig, "sac": SACConfig})
    run, config = RunConfig(**sac["run"]), SACConfig(**sac["sac"])
    demos = DemoConfig(**load_config(DEMOS, {"demos": DemoConfig})["demos"])
    assert (ROOT / run.init_policy).is_file() and config.prior_data == demos.out
    train, held_out = set(run.env_kwargs["init_states"]), set(run.eval_env_kwargs["init_states"])
    assert set(demos.env_kwargs["init_states"]) == train and not train & held_out
    assert demos.env_kwargs["chunk_size"] is None and demos.env_kwargs["cameras"] == run.env_kwargs["cameras"]
    assert config_algo(["--config", str(SAC_RECIPE)]) == "sac"


def test_dsrl_recipe_steers_the_shipped_flow_clone_on_training_starts_only():
    from trainers.sac import SACConfig

    data = load_config(DSRL_RECIPE, {"run": RunConfig, "sac": SACConfig})
    run, config = RunConfig(**data["run"]), SACConfig(**data["sac"])
    assert run.policy == "dsrl" and (ROOT / run.init_policy).is_file() and config.prior_data is None
    train, held_out = set(run.env_kwargs["init_states"]), set(run.eval_env_kwargs["init_states"])
    sac = load_config(SAC_RECIPE, {"run": RunConfig, "sac": SACConfig})["run"]
    assert train == set(sac["env_kwargs"]["init_states"]) and held_out == set(
        sac["eval_env_kwargs"]["init_states"]
    )
    assert config_algo(["--config", str(DSRL_RECIPE)]) == "sac"


def test_sil_recipe_imitates_demos_of_training_starts_only_and_fits_half_an_hour():
    from trainers.datasets.demos import read_demos
    from trainers.sil import SILConfig

    data = load_config(SIL_RECIPE, {"run": RunConfig, "sil": SILConfig})
    run, config = RunConfig(**data["run"]), SILConfig(**data["sil"])
    assert (ROOT / run.init_policy).is_file() and (ROOT / config.prior_data).is_file()
    train, held_out = set(run.env_kwargs["init_states"]), set(run.eval_env_kwargs["init_states"])
    assert train and held_out and not train & held_out
    demos = read_demos(ROOT / config.prior_data)
    starts = demos.meta["env_kwargs"]["init_states"]  # frame = task * len(starts) + index in starts
    assert set(starts) == train
    assert {starts[ep.initial_frame % len(starts)] for ep in demos.episodes} == {0, 1}
    assert 0 < run.max_minutes <= 25  # + set-up and two evaluations: within 30 minutes
    assert config_algo(["--config", str(SIL_RECIPE)]) == "sil"


def test_the_shipped_prior_data_is_what_its_demos_config_makes():
    from trainers.datasets.demos import read_demos
    from trainers.demos import DemoConfig

    demos = DemoConfig(**load_config(DEMOS, {"demos": DemoConfig})["demos"])
    path = ROOT / demos.out
    assert path.stat().st_size <= 10 * 2**20  # committed to the repository: kept small
    data = read_demos(path)
    meta = data.meta
    assert (meta["env"], meta["env_kwargs"], meta["seed"]) == (demos.env, demos.env_kwargs, demos.seed)
    assert meta["policy"] == "policies.libero_expert:LiberoExpert" and meta["policy_kwargs"] == {}
    assert meta["episodes_run"] == demos.episodes and meta["episodes_successful"] == len(data.episodes) == 394
    assert all(ep.success for ep in data.episodes)
    frames = [ep.initial_frame for ep in data.episodes]  # ids among the 10 tasks x the training starts
    assert len(set(frames)) == len(frames) and 0 <= min(frames) and max(frames) < 10 * 40


def test_algo_flag_ignores_the_other_algorithms_section(tmp_path):
    from trainers.config import parse_cli

    configs = parse_cli({"run": RunConfig, "ppo": PPOConfig}, ["--config", str(RECIPE)], ignore=["grpo"])
    assert configs["run"].num_envs == 16 and configs["ppo"] == PPOConfig()
    with pytest.raises(ValueError, match="keys among"):
        parse_cli({"run": RunConfig, "ppo": PPOConfig}, ["--config", str(RECIPE)])


@pytest.mark.slow
@requires_libero
def test_sac_recipe_end_to_end(tmp_path):
    """The SAC recipe (the main job until 2026-11-29): the demos config, then the recipe, cut to a tiny
    budget."""
    from trainers import demos

    prior = tmp_path / "demos.h5"
    demos.main(["--config", str(DEMOS), "--episodes", "2", "--out", str(prior)])
    short = {"chunk_size": 8, "task_state": True, "max_episode_steps": 24}
    train_env = {**short, "cameras": [], "init_states": [0, 1]}
    eval_env = {**short, "cameras": ["agentview"], "image_size": 32, "init_states": [40]}
    run_dir = tmp_path / "sac"
    final = main(
        [
            "--config", str(SAC_RECIPE), "--run-dir", str(run_dir), "--total-steps", "1",
            "--num-envs", "2", "--steps-per-iteration", "2", "--learning-starts", "2", "--batch-size", "8",
            "--offline-steps", "2", "--prior-data", str(prior),
            "--eval-episodes", "2", "--eval-num-envs", "2",
            "--env-kwargs", json.dumps(train_env), "--eval-env-kwargs", json.dumps(eval_env),
            "--no-progress", "--video",  # the recipe evaluates state-only; a camera and --video add the mp4s
        ]
    )  # fmt: skip
    assert "eval/success_once" in final
    offline = [r for r in read_metrics(run_dir) if "offline/bc_loss" in r]  # pretrained on the demos
    assert len(offline) == 1 and offline[0]["offline/bc_loss"] > 0
    summary = (run_dir / "summary.md").read_text()
    assert "checkpoints/bc_libero_spatial_state_weak.pt" in summary
    assert "## Evaluation before training (2 episodes" in summary and "## Evaluation after" in summary
    videos = sorted((run_dir / "videos").glob("*.mp4"))
    assert len(videos) == 2 and all(v.stat().st_size > 1000 for v in videos)
    assert (run_dir / "learning_curve.png").stat().st_size > 5000
    assert list((run_dir / "tb").iterdir()) and list((run_dir / "checkpoints").glob("iter_*.pt"))


@pytest.mark.slow
@requires_libero
def test_dsrl_recipe_end_to_end(tmp_path):
    """The DSRL recipe, cut to a tiny budget: the noise actor trains, the shipped flow clone stays."""
    import torch

    from trainers.checkpoint import latest_checkpoint

    short = {"chunk_size": 8, "task_state": True, "cameras": [], "max_episode_steps": 24}
    run_dir = tmp_path / "dsrl"
    final = main(
        [
            "--config", str(DSRL_RECIPE), "--run-dir", str(run_dir), "--total-steps", "1",
            # 24-step episodes end after 3 chunks, when their 4-chunk returns are written
            "--num-envs", "2", "--steps-per-iteration", "4", "--learning-starts", "2", "--batch-size", "4",
            "--eval-episodes", "2", "--eval-num-envs", "2",
            "--env-kwargs", json.dumps({**short, "init_states": [0, 1]}),
            "--eval-env-kwargs", json.dumps({**short, "init_states": [40]}), "--no-progress",
        ]
    )  # fmt: skip
    assert final["train/updates"] > 0 and torch.isfinite(torch.tensor(final["train/critic_loss"]))
    state = latest_checkpoint(run_dir)[1]["policy"]["state_dict"]
    flow = latest_checkpoint(ROOT / "checkpoints" / "flow_libero_spatial_state.pt")[1]["policy"]["state_dict"]
    assert all(torch.equal(state[f"base.{k}"], v) for k, v in flow.items())
    assert state["actor.torso.encoders.task_state.norm_count"] > 0  # the actor standardises its input


@pytest.mark.slow
@requires_libero
def test_main_job_end_to_end(tmp_path):
    """README's main job, the self-imitation recipe on the async actor-learner, cut to a tiny budget:
    imitation updates on the shipped 20 demos from the shipped clone, evaluated before and after on a
    held-out start."""
    short = {"chunk_size": 8, "task_state": True, "cameras": [], "max_episode_steps": 24}
    run_dir = tmp_path / "sil"
    final = main(
        [
            "--config", str(SIL_RECIPE), "--run-dir", str(run_dir), "--total-steps", "1",
            "--num-envs", "2", "--steps-per-iteration", "3", "--updates-per-iteration", "2",
            "--batch-size", "8",
            "--eval-episodes", "2", "--eval-num-envs", "2",
            "--env-kwargs", json.dumps({**short, "init_states": [0, 1]}),
            "--eval-env-kwargs", json.dumps({**short, "init_states": [40]}), "--no-progress",
        ]
    )  # fmt: skip
    rows = read_metrics(run_dir)
    assert final["train/sil_loss"] > 0 and any(r.get("train/kept_this_iteration") is not None for r in rows)
    summary = (run_dir / "summary.md").read_text()
    assert "checkpoints/flow_libero_spatial_20demos_e6000.pt" in summary
    assert "## Evaluation before training (2 episodes" in summary and "## Evaluation after" in summary
    assert json.loads(SIL_RECIPE.read_text())["run"]["loop"] == "async"  # the learner has a core of its own
    assert "| train/updates_per_chunk |" in summary  # what the async learner made of each stored chunk

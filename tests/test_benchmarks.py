"""The benchmark scripts' statistics (Wilson, McNemar, PSNR, SSIM) and short runs of the scripts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import requires_libero

from benchmarks.evaluate import summarize
from trainers.metrics import wilson_interval

CHECKPOINT = Path(__file__).resolve().parent.parent / "checkpoints" / "bc_libero_spatial_state.pt"


def test_wilson_interval_known_values():
    low, high = wilson_interval(8, 10)
    assert low == pytest.approx(0.4902, abs=1e-4) and high == pytest.approx(0.9433, abs=1e-4)
    assert wilson_interval(0, 20)[0] == 0.0 and wilson_interval(20, 20)[1] == 1.0
    assert wilson_interval(20, 20)[0] == pytest.approx(0.8389, abs=1e-4)


def test_summarize_per_task_and_overall():
    episodes = [
        {"task": "libero_spatial/a", "success": True, "length": 100},
        {"task": "libero_spatial/a", "success": False, "length": 220},
        {"task": "libero_spatial/b", "success": True, "length": 80},
    ]
    s = summarize(episodes)
    assert [(r["task"], r["successes"], r["trials"]) for r in s["tasks"]] == [("a", 1, 2), ("b", 1, 1)]
    assert s["tasks"][0]["mean_steps_success"] == 100.0
    assert (s["successes"], s["trials"]) == (2, 3) and s["rate"] == pytest.approx(2 / 3)


def test_mcnemar_exact_p_values():
    from trainers.metrics import mcnemar_p

    assert mcnemar_p(0, 0) == 1.0 and mcnemar_p(3, 3) == 1.0
    assert mcnemar_p(5, 0) == pytest.approx(2 / 32) and mcnemar_p(0, 5) == pytest.approx(2 / 32)
    assert mcnemar_p(9, 1) == pytest.approx(2 * 11 / 1024)


def test_psnr_and_ssim_by_hand():
    from benchmarks.wm_vs_sim import psnr, ssim

    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (24, 32, 3), dtype=np.uint8)
    assert psnr(a, a) == float("inf") and ssim(a, a) == pytest.approx(1.0)
    zeros, ones = np.zeros((8, 8, 3), np.uint8), np.ones((8, 8, 3), np.uint8)
    assert psnr(zeros, ones) == pytest.approx(10 * np.log10(255.0**2))  # MSE 1
    # constant images: only the luminance term is left, (2 mu_x mu_y + c1) / (mu_x^2 + mu_y^2 + c1)
    c1 = (0.01 * 255) ** 2
    assert ssim(zeros, ones * 100) == pytest.approx(c1 / (100**2 + c1))
    assert ssim(a, 255 - a) < 0  # anti-correlated structure


def test_env_throughput_runs_a_tiny_world_model(tmp_path):
    from benchmarks.env_throughput import main

    rows = main(["--ids", "OpenSoraWM-LiberoSpatial-v0", "No-Such-Env-v0", "--num-envs", "1",
                 "--chunks", "1", "--out", str(tmp_path)])  # fmt: skip
    assert rows[0]["steps_per_s"] > 0 and rows[0]["memory_gb"] > 0 and rows[0]["note"].startswith("tiny")
    assert rows[1]["note"] == "skipped" and "No-Such-Env" in rows[1]["skipped"]
    assert (tmp_path / "env_throughput.json").exists() and (tmp_path / "env_throughput.png").exists()


@requires_libero
@pytest.mark.slow
def test_wm_vs_sim_compares_the_same_starts(tmp_path):
    from benchmarks.wm_vs_sim import main

    result = main(["--episodes", "1", "--max-episode-steps", "8", "--out", str(tmp_path)])
    assert set(result["runs"]) == {"sim", "wm", "wm open-loop"}
    assert result["frame_index"] == list(range(9))  # the shared start and 8 sub-steps
    assert result["ssim"][0] > 0.99  # frame 0 is the simulator's frame in both
    assert (tmp_path / "wm_vs_sim.png").exists()
    assert result["agreement"]["episodes"] == 1


def test_wm_vs_sim_replay_recuts_per_step_actions_into_the_world_models_chunks():
    from benchmarks.wm_vs_sim import Replay

    recorded = np.arange(10 * 7, dtype=np.float32).reshape(10, 7) + 1  # 10 sub-steps, no zero action
    replay = Replay([recorded, recorded[:3]], (2, 8, 7))
    first, second, third = (replay.act(None).actions.numpy() for _ in range(3))
    np.testing.assert_array_equal(first[0], recorded[:8])
    np.testing.assert_array_equal(second[0, :2], recorded[8:])
    np.testing.assert_array_equal(first[1, :3], recorded[:3])
    assert not second[0, 2:].any() and not first[1, 3:].any() and not third.any()  # then zeros


def test_wm_vs_sim_agreement_by_hand():
    from benchmarks.wm_vs_sim import agreement

    got = agreement(np.array([1, 1, 0, 0, 1], bool), np.array([1, 0, 1, 0, 1], bool))
    assert (got["both"], got["sim_only"], got["wm_only"], got["neither"], got["agree"]) == (2, 1, 1, 1, 3)
    lo, hi = got["agree_ci95"]
    assert lo < 3 / 5 < hi


@requires_libero
@pytest.mark.slow
def test_wm_vs_sim_replays_the_experts_actions_in_the_world_model(tmp_path):
    from benchmarks.wm_vs_sim import main

    args = "--episodes 1 --max-episode-steps 16 --expert-noise 0".split()
    result = main([*args, "--sim-env-kwargs", '{"envs_per_worker": 1}', "--out", str(tmp_path)])
    assert set(result["runs"]) == {"sim", "wm open-loop"}  # the expert cannot drive the world model
    agreed = result["agreement"]
    assert agreed["both"] + agreed["sim_only"] == sum(result["runs"]["sim"]["success"])
    assert agreed["both"] + agreed["wm_only"] <= sum(result["runs"]["wm open-loop"]["success"])
    assert agreed["episodes"] == 1 and "scripted expert" in result["table"]
    for bad in (
        ["--expert-noise", "-1"],
        ["--sim-env-kwargs", "[1]"],
        ["--wm-env-kwargs", "2"],
    ):  # before any env
        with pytest.raises(SystemExit):
            main([*bad, "--out", str(tmp_path)])


@requires_libero
@pytest.mark.slow
def test_evaluate_writes_failure_videos(tmp_path):
    from benchmarks.evaluate import main

    env_kwargs = {"cameras": ["agentview"], "image_size": 32, "task_state": True, "chunk_size": 8}
    summary = main(
        [
            "--checkpoint", str(CHECKPOINT), "--tasks", "0", "--init-states", "40:42",
            "--env-kwargs", json.dumps({**env_kwargs, "max_episode_steps": 16}),  # too short to succeed
            "--failure-videos", str(tmp_path / "fail"), "--max-videos", "1",
            "--out", str(tmp_path / "e.json"),
        ]
    )  # fmt: skip
    assert (summary["successes"], summary["trials"]) == (0, 2)
    videos = list((tmp_path / "fail").glob("*.mp4"))
    assert len(videos) == 1 and videos[0].name.endswith("_init40.mp4")
    assert json.loads((tmp_path / "e.json").read_text())["args"]["init_states"] == [40, 41]


@requires_libero
def test_evaluate_policy_by_name_with_kwargs_over_seeds(tmp_path):
    """``--policy NAME --policy-kwargs``: a policy built from arguments; ``--seeds``: one pass per
    seed, each seed's rate and their mean and spread; ``--temperature`` needs a policy that has one."""
    from benchmarks.evaluate import main

    common = ["--tasks", "0", "--init-states", "40:41", "--num-envs", "1", "--out", str(tmp_path / "e.json"),
              "--env-kwargs", json.dumps({"cameras": [], "task_state": True, "chunk_size": 8,
                                          "max_episode_steps": 16})]  # fmt: skip
    summary = main(["--policy", "gaussian", "--policy-kwargs", '{"hidden_sizes": [8]}', "--seeds", "0", "1",
                    "--sample", *common])  # fmt: skip
    assert summary["trials"] == 2 and [r["seed"] for r in summary["per_seed"]] == [0, 1]
    assert summary["seed_mean"] == 0.0 and summary["seed_std"] == 0.0  # 16 steps: too short to succeed
    assert json.loads((tmp_path / "e.json").read_text())["args"]["policy_kwargs"] == {"hidden_sizes": [8]}
    with pytest.raises(ValueError, match="has no sampling temperature"):
        main(["--policy", "gaussian", "--temperature", "1.5", *common])
    with pytest.raises(SystemExit):
        main(["--policy", "gaussian", "--policy-kwargs", "[1]", *common])
    none = ["--tasks", "99", *common[2:]]  # no such task: never a rate over 0 trials
    with pytest.raises(ValueError, match=r"--tasks \[99\] select no \(task, init state\) pair"):
        main(["--policy", "gaussian", *none])


@pytest.mark.slow
def test_vla_latency_times_both_policies_on_tiny_checkpoints(tmp_path, capsys):
    from benchmarks import vla_latency

    rows = vla_latency.main(["--size", "tiny", "--batch", "2", "--repeats", "1", "--num-steps", "2",
                             "--device", "cpu", "--json", str(tmp_path / "lat.json")])  # fmt: skip
    assert [r["model"] for r in rows] == ["openvla_oft", "pi05", "cosmos_policy"]
    assert all(r["act_s_median"] > 0 and r["batch"] == 2 for r in rows)
    assert json.loads((tmp_path / "lat.json").read_text())[1]["num_steps"] == 2
    assert "VLA act latency" in capsys.readouterr().out
    if not torch.cuda.is_available():
        assert vla_latency.main(["--size", "real", "--device", "cpu"]) == []


def _tiny_recipe(tmp_path: Path) -> Path:
    """The main job's recipe cut down to one task, 2 envs and 40-step episodes."""
    recipe = json.loads((CHECKPOINT.parent.parent / "configs" / "libero_spatial_grpo.json").read_text())
    small = {"task_ids": [0], "max_episode_steps": 40}
    run = recipe["run"]
    run.update(num_envs=2, total_steps=60, init_policy=str(CHECKPOINT))
    run["env_kwargs"] = {**run["env_kwargs"], **small, "init_states": [0, 1]}
    run["eval_env_kwargs"] = {**run["eval_env_kwargs"], **small, "init_states": [40, 41]}
    recipe["grpo"]["group_size"] = 2
    path = tmp_path / "recipe.json"
    path.write_text(json.dumps(recipe))
    return path


@pytest.mark.slow
@requires_libero
def test_rl_recipe_study_table_curves_and_reuse(tmp_path, capsys):
    from benchmarks.rl_recipe_study import main

    recipe, out = _tiny_recipe(tmp_path), tmp_path / "study"
    args = ["--recipe", str(recipe), "--out", str(out), "--eval-envs", "2"]
    weak = str(CHECKPOINT.with_name("bc_libero_spatial_state_weak.pt"))
    other = {"about": "another start", "run": {"init_policy": weak}, "grpo": {"learning_rate": 1e-6}}
    extra = json.dumps({"small-lr": other})
    curves = ["--curve-every", "1", "--sampled-every", "1"]
    summary = main([*args, "--variants", "recipe", "small-lr", "--define", extra, *curves])
    table = capsys.readouterr().out
    assert "held-out before" in table and "McNemar p" in table and "small-lr" in table
    assert "sampled success, fixed train starts: before->after" in table
    assert "sampled: one episode with sampled actions per fixed training start, init states [0, 1]" in table
    rows = summary["results"]
    assert [r["variant"] for r in rows] == ["recipe", "small-lr"]
    assert [r["start"] for r in rows] == [str(CHECKPOINT), weak]
    for r in rows:
        assert r["env_steps"] >= 60 and len(r["after"]) == 2 and r["before"]["trials"] == 2
        assert r["held_out_curve"]["env_steps"]  # the run's own held-out evaluations
        assert r["pairs"]["gained"] + r["pairs"]["lost"] <= 2
        # the fixed training starts (task 0 x init states 0 and 1), sampled, before and after training
        fixed = r["sampled_curve"]
        assert fixed["init_states"] == [0, 1] and fixed["pairs"] == 2 and fixed["every"] == 1
        assert fixed["env_steps"][0] == 0 and fixed["env_steps"][-1] == r["env_steps"]
        assert len(fixed["success"]) == len(fixed["env_steps"]) >= 2
        played = [json.loads(line) for line in (out / f"{r['variant']}-s0" / "sampled_episodes.jsonl").open()]
        assert sorted(ep["frame"] for ep in played if ep["env_step"] == 0) == [0, 1]  # each start once
        assert f"{fixed['success'][0]:.2f} -> {fixed['success'][-1]:.2f}" in table
    # each starting policy is evaluated once, and a row is paired with its own start's episodes
    assert set(summary["before"]) == {str(CHECKPOINT), weak}
    for r in rows:
        before = json.loads((out / f"before-{Path(r['start']).stem}.json").read_text())
        assert before["policy"] == r["start"]
        assert r["before"]["successes"] == sum(ep["success"] for ep in before["episodes"])
    assert "bc_libero_spatial_state_weak" in table
    assert (out / "learning_curves.png").stat().st_size > 0
    assert (out / "held_out_curves.png").stat().st_size > 0
    # a finished (variant, seed) is reused, not retrained
    stamp = (out / "recipe-s0" / "result.json").stat().st_mtime
    again = main([*args, "--variants", "recipe"])
    assert (out / "recipe-s0" / "result.json").stat().st_mtime == stamp
    assert again["results"][0]["after"] == rows[0]["after"]
    # ... unless its settings changed since: then it is trained again
    changed = '{"recipe": {"grpo": {"learning_rate": 2e-6}}}'
    main([*args, "--variants", "recipe", "--define", changed])
    assert (out / "recipe-s0" / "result.json").stat().st_mtime > stamp
    assert json.loads((out / "recipe-s0" / "config.json").read_text())["grpo"]["learning_rate"] == 2e-6
    # --report tabulates what is there and trains nothing; a result from before the fixed starts: n/a
    old = json.loads((out / "small-lr-s0" / "result.json").read_text())
    del old["sampled_curve"]
    (out / "small-lr-s0" / "result.json").write_text(json.dumps(old))
    report = main([*args, "--report", "--define", extra])
    assert [r["variant"] for r in report["results"]] == ["recipe", "small-lr"]
    assert re.search(r"^small-lr +0 +\S+ +\d+ +\S+ +n/a ", report["table"], re.M), report["table"]
    assert re.search(r"^recipe +0 +\S+ +\d+ +\S+ +\d\.\d\d -> \d\.\d\d ", report["table"], re.M)
    # the same runs over runs: one number each, read from the study's own files
    from benchmarks.over_runs import main as over_runs

    found = over_runs([str(out)])
    assert sorted((r["variant"], r["successes"]) for r in found["runs"]) == sorted(
        (r["variant"], sum(ep["success"] for ep in r["after"])) for r in report["results"]
    )
    assert [r["eval_init_states"] for r in found["runs"]] == [None, None]  # the recipe's own, not given


def test_robustness_probe_prints_its_table(tmp_path, capsys):
    """The probe's fast categories (its LIBERO ones are tests in test_libero.py too)."""
    from benchmarks.robustness import main

    results = main(["--categories", "untrusted files", "checkpoints", "--out", str(tmp_path)])
    assert all(outcome == "" for cases in results.values() for outcome in cases.values()), results
    out = capsys.readouterr().out
    rows = {line.rsplit(None, 2)[0]: line.split()[-2:] for line in out.splitlines()[3:6]}
    assert rows == {"untrusted files": ["11", "11"], "checkpoints": ["6", "6"], "all": ["17", "17"]}
    assert json.loads((tmp_path / "robustness.json").read_text()).keys() == results.keys()
    settings = main(["--categories", "settings", "--out", str(tmp_path)])["settings"]
    assert len(settings) >= 10 and all(outcome == "" for outcome in settings.values()), settings
    special = main(["--categories", "special files", "--out", str(tmp_path)])["special files"]
    assert len(special) == 8 and all(outcome == "" for outcome in special.values()), special
    issue47 = main(
        ["--categories", "settings from files", "data semantics", "outputs", "--out", str(tmp_path)]
    )
    assert [len(issue47[c]) for c in issue47] == [8, 5, 4]
    assert all(outcome == "" for cases in issue47.values() for outcome in cases.values()), issue47


def test_reward_model_benchmark_prints_its_table_from_saved_frames(tmp_path, capsys):
    """The recipe's table, on frames of the counting env (tests/counting_env.py) to run in seconds."""
    import gymnasium as gym

    from benchmarks.reward_model import main
    from trainers.reward_model.train import RewardModelConfig, run

    if "RMCountingBench-v0" not in gym.registry:
        gym.register("RMCountingBench-v0", vector_entry_point="counting_env:CountingVectorEnv")
    policies = ["counting_env:ConstantPolicy,episodes=6", "counting_env:ConstantPolicy,value=-1,episodes=4"]
    frames = []
    for seed in (0, 1):  # the collection to train on, and an independent one
        cfg = RewardModelConfig(
            env="RMCountingBench-v0", env_kwargs={"chunk_size": 2}, policy=policies, seed=seed,
            collect_only=True, out=str(tmp_path / f"collect{seed}"), progress=False,
        )  # fmt: skip
        frames.append(run(cfg)["frames"])
    args = ["--frames", frames[0], "--extra-frames", frames[1], "--frame-size", "16", "16", "--width", "2",
            "--steps", "4", "--batch-size", "8", "--out", str(tmp_path / "bench"),
            "--no-progress"]  # fmt: skip
    report = main(args)
    out = capsys.readouterr().out
    m, extra = report["held_out_frames"], report["independent_collection"]
    assert re.search(rf"confusion: sim yes -> model yes / no +{m['tp']} / {m['fn']} +\d+ / \d+\n", out)
    assert (
        "independent collection" in out
        and extra["data"]["episodes"] + extra["data"]["left_out_episodes"] == 10
    )
    assert extra["frames"]["frames"] == extra["data"]["frames"]
    saved = json.loads((tmp_path / "bench" / "reward_model.json").read_text())
    assert saved["held_out_frames"]["tn"] == m["tn"] and saved["independent_collection"]["data"]["seed"] == 1


def test_rl_recipe_study_pools_seeds_against_placebo_and_clone():
    from benchmarks.rl_recipe_study import pooled_comparisons

    def result(variant, seed, outcomes):
        return {
            "variant": variant,
            "seed": seed,
            "after": [{"frame": i, "success": o} for i, o in enumerate(outcomes)],
        }

    results = [
        result("rl", 0, [1, 1, 0]), result("rl", 1, [1, 0, 0]),
        result("rl-placebo", 0, [0, 1, 0]), result("rl-placebo", 1, [0, 0, 1]),
        result("clone-x", 0, [1, 0, 0]),  # seed 0 only: pooled over the seeds both ran
    ]  # fmt: skip
    by_pair = {(c["a"], c["b"]): c for c in pooled_comparisons(results, None)}
    assert set(by_pair) == {("rl", "rl-placebo"), ("rl", "clone-x")}
    placebo = by_pair[("rl", "rl-placebo")]
    assert (
        placebo["seeds"] == [0, 1]
        and placebo["a_rate"]["successes"] == 3
        and placebo["b_rate"]["trials"] == 6
    )
    assert (placebo["gained"], placebo["lost"]) == (2, 1)  # (0, 0) and (1, 0) won, (1, 2) lost
    # per seed 2/3 - 1/3 and 1/3 - 1/3: a t-test over the two seeds, t = 1 with one degree of freedom
    assert placebo["seed_differences"] == pytest.approx([1 / 3, 0.0])
    assert placebo["seeds_p"] == pytest.approx(0.5)
    clone = by_pair[("rl", "clone-x")]
    assert clone["seeds"] == [0] and (clone["gained"], clone["lost"]) == (1, 0)
    assert clone["seeds_p"] is None  # one seed: no test over runs
    assert pooled_comparisons(results, [["rl-placebo", "rl"]])[0]["gained"] == 1


@pytest.mark.slow
@requires_libero
def test_rl_recipe_study_clone_control_and_rl_from_it(tmp_path, capsys):
    """A clone-* control is imitation alone on the prior data (trainers.bc, stopped by max_minutes);
    a variant with start_from starts from that clone of the same seed, trained first if needed."""
    from benchmarks.rl_recipe_study import main

    recipe, out = _tiny_recipe(tmp_path), tmp_path / "study"
    demos = str(CHECKPOINT.parent.parent / "data" / "libero_spatial_expert_train.h5")
    clone = {"algo": "bc", "run": {"policy": "auto", "max_minutes": 1e-4},
             "bc": {"demos": demos, "epochs": 3, "batch_size": 512}}  # fmt: skip
    rl = {"start_from": "clone-tiny", "grpo": {"learning_rate": 1e-6}}
    define = json.dumps({"clone-tiny": clone, "rl-from-clone": rl})
    split = ["--train-init-states", "0", "--eval-init-states", "1", "--sampled-init-states", "0"]  # selection
    summary = main(["--recipe", str(recipe), "--out", str(out), "--eval-envs", "2", "--sampled-every", "-1",
                    "--variants", "rl-from-clone", "--define", define, "--placebo", *split])  # fmt: skip
    rows = {r["variant"]: r for r in summary["results"]}
    assert list(rows) == ["clone-tiny", "rl-from-clone", "rl-from-clone-placebo"]
    bc = json.loads((out / "clone-tiny-s0" / "config.json").read_text())
    assert bc["bc"]["demos"] == demos and bc["run"]["init_policy"] == str(CHECKPOINT)
    assert rows["clone-tiny"]["env_steps"] > 0 and len(rows["clone-tiny"]["after"]) == 1  # (task 0, state 1)
    assert rows["rl-from-clone"]["start"] == str(out / "clone-tiny-s0")
    rl = json.loads((out / "rl-from-clone-s0" / "config.json").read_text())["run"]
    assert rl["env_kwargs"]["init_states"] == [0]
    pairs = {(c["a"], c["b"]) for c in summary["comparisons"]}
    assert pairs == {("rl-from-clone", "rl-from-clone-placebo"), ("rl-from-clone", "clone-tiny")}
    assert "pooled over seeds" in capsys.readouterr().out


def _study_runs(folder: Path, variant: str, successes: list[int], states: list[int], trials: int = 100):
    """Study runs in rl_recipe_study's layout: ``folder/<variant>-s<seed>/result.json`` with
    ``successes[seed]`` of ``trials`` held-out episodes, and the invocation's ``rl_recipe_study.json``."""
    for seed, k in enumerate(successes):
        run = folder / f"{variant}-s{seed}"
        run.mkdir(parents=True)
        after = [{"frame": i, "success": i < k} for i in range(trials)]
        result = {"variant": variant, "seed": seed, "algo": "sil", "env_steps": 1000 + seed, "after": after}
        (run / "result.json").write_text(json.dumps(result))
    (folder / "rl_recipe_study.json").write_text(json.dumps({"args": {"eval_init_states": states}}))


def test_over_runs_takes_each_run_as_one_number(tmp_path, capsys):
    from scipy import stats

    from benchmarks.over_runs import main
    from nets.errors import BadInput

    split = list(range(30, 40))
    _study_runs(tmp_path / "a", "sil", [56, 52, 62], split)
    _study_runs(tmp_path / "b", "sil-old-name", [48], split)  # the same recipe under an older name
    _study_runs(tmp_path / "c", "clone-x", [46, 45, 51], split)
    folders = [str(tmp_path / f) for f in "abc"]
    found = main([*folders, "--alias", "sil-old-name=sil", "--out", str(tmp_path / "over.json")])
    sil, clone = ([56, 52, 62, 48], [46, 45, 51])
    assert found["variants"]["sil"]["points"] == pytest.approx(sil)
    summary = found["variants"]["sil"]
    half = stats.t.ppf(0.975, 3) * np.std(sil, ddof=1) / 2
    assert summary["mean"] == pytest.approx(54.5) and summary["sd"] == pytest.approx(np.std(sil, ddof=1))
    assert summary["ci95"] == pytest.approx([54.5 - half, 54.5 + half])
    (c,) = found["comparisons"]  # by default each variant against the clone-* controls
    assert (c["a"], c["b"]) == ("sil", "clone-x") and c["difference"] == pytest.approx(54.5 - 142 / 3)
    # Welch by hand: the variances of the two means, Welch-Satterthwaite's degrees of freedom
    va, vb = np.var(sil, ddof=1) / 4, np.var(clone, ddof=1) / 3
    df = (va + vb) ** 2 / (va**2 / 3 + vb**2 / 2)
    se = np.sqrt(va + vb)
    assert c["df"] == pytest.approx(df) and c["p"] == pytest.approx(2 * stats.t.sf(c["difference"] / se, df))
    half = stats.t.ppf(0.975, df) * se
    assert c["ci95"] == pytest.approx([c["difference"] - half, c["difference"] + half])
    assert json.loads((tmp_path / "over.json").read_text())["comparisons"][0]["p"] == pytest.approx(c["p"])
    printed = capsys.readouterr().out
    interval = re.escape(f"[{c['ci95'][0]:+.1f}, {c['ci95'][1]:+.1f}]")
    assert re.search(rf"^sil +clone-x +\+7\.2 +{interval} ", printed, re.M), printed
    # one run on a side: the difference, no test
    one = main([folders[1], folders[2]])["comparisons"][0]
    assert one["p"] is None and one["ci95"] is None and one["difference"] == pytest.approx(48 - 142 / 3)
    # runs judged on other pairs are not counted together
    _study_runs(tmp_path / "d", "clone-y", [40], list(range(40, 50)))
    with pytest.raises(BadInput, match="expected runs on the same pairs"):
        main([folders[0], str(tmp_path / "d")])
    _study_runs(tmp_path / "e", "clone-z", [10], split, trials=20)
    with pytest.raises(BadInput, match="judged on 20 episodes"):
        main([folders[0], str(tmp_path / "e")])
    with pytest.raises(BadInput, match=r"no runs: \['nope'\]"):
        main([folders[0], "--compare", "sil", "nope"])
    with pytest.raises(BadInput, match="--alias expects OLD=NEW, got 'sil'"):
        main([folders[0], "--alias", "sil"])
    with pytest.raises(BadInput, match="expected a folder of rl_recipe_study runs"):
        main([str(tmp_path / "missing")])
    (tmp_path / "f" / "x").mkdir(parents=True)
    (tmp_path / "f" / "x" / "result.json").write_text("{}")
    with pytest.raises(BadInput, match="not an rl_recipe_study result"):
        main([str(tmp_path / "f")])


def test_rl_recipe_study_placebo_variants():
    from benchmarks.rl_recipe_study import VARIANTS, placebo_of

    grpo, sac = placebo_of(VARIANTS["recipe"]), placebo_of(VARIANTS["sac-rlpd-weak"])
    assert grpo["grpo"] == {"placebo": True} and grpo["about"].startswith("placebo of: ")
    assert sac["sac"] == {**VARIANTS["sac-rlpd-weak"]["sac"], "placebo": True} and sac["algo"] == "sac"
    assert "placebo" not in VARIANTS["sac-rlpd-weak"]["sac"]  # the variant itself is unchanged


def test_few_demo_priors_are_the_first_episodes_of_the_shipped_demos():
    """data/libero_spatial_expert_10.h5 and _20.h5 hold the first 1 and 2 episodes of every task (by
    initial frame) of the shipped expert demos, bit for bit; the one-demo pilot's start is the 20-demo
    start's policy (its checkpoint verified)."""
    import numpy as np

    from trainers.checkpoint import load_checkpoint
    from trainers.datasets.demos import read_demos

    root = Path(__file__).resolve().parents[1]
    full = read_demos(root / "data" / "libero_spatial_expert_train.h5").episodes
    frames: dict[str, list[int]] = {}  # each task's initial frames
    for ep in full:
        frames.setdefault(ep.task, []).append(ep.initial_frame)
    for name, per_task in (("libero_spatial_expert_10.h5", 1), ("libero_spatial_expert_20.h5", 2)):
        few = read_demos(root / "data" / name).episodes
        expected = [ep for ep in full if ep.initial_frame in sorted(frames[ep.task])[:per_task]]
        assert len(few) == len(expected) == 10 * per_task
        by_frame = {(e.task, e.initial_frame): e for e in expected}
        assert sorted(by_frame) == sorted((e.task, e.initial_frame) for e in few)
        for ep in few:
            twin = by_frame[(ep.task, ep.initial_frame)]
            assert np.array_equal(ep.actions, twin.actions) and ep.success
            assert all(np.array_equal(ep.obs[k], twin.obs[k]) for k in twin.obs)
    starts = [root / "checkpoints" / f"flow_libero_spatial_{n}demos_e6000.pt" for n in (10, 20)]
    one, two = (load_checkpoint(path) for path in starts)
    assert one["policy"]["name"] == two["policy"]["name"] == "policies.flow:FlowPolicy"
    assert one["policy"]["kwargs"] == two["policy"]["kwargs"]  # the same policy, cloned from fewer demos


def test_rl_recipe_study_self_imitation_variants_are_complete():
    """The few-demo self-imitation variant and its longer clone: shipped files, settings that their
    configs take, and a placebo that keeps as many episodes chosen without the reward."""
    from benchmarks.rl_recipe_study import VARIANTS, placebo_of
    from trainers.bc import BCConfig
    from trainers.sil import SILConfig

    root = Path(__file__).resolve().parents[1]
    for sil_name, clone_name in [("sil-20demos", "clone-20demos-30min"),
                                 ("sil-20demos-e6000", "clone-20demos-e6000-30min"),
                                 ("sil-20demos-e6000-prior25", "clone-20demos-e6000-30min"),
                                 ("sil-20demos-e6000-prior0", "clone-20demos-e6000-30min"),
                                 ("sil-20demos-e6000-prior25-async", "clone-20demos-e6000-30min"),
                                 ("sil-10demos-e6000-prior25-async", "clone-10demos-e6000-30min"),
                                 ("sil-recipe", "clone-sil-recipe"),
                                 ("sil-recipe-sync", "clone-sil-recipe"),
                                 ("sil-recipe-warmup", "clone-sil-recipe")]:  # fmt: skip
        sil, clone = VARIANTS[sil_name], VARIANTS[clone_name]
        assert sil["run"]["init_policy"] == clone["run"]["init_policy"]  # the same start
        for spec in (sil, clone):
            assert (root / spec["run"]["init_policy"]).is_file() and 0 < spec["run"]["max_minutes"] <= 30.0
        assert clone["run"]["max_minutes"] == sil["run"]["max_minutes"]  # the same wall time
        assert (root / sil["sil"]["prior_data"]).is_file()
        assert clone["bc"]["demos"] == sil["sil"]["prior_data"]
        SILConfig(**sil["sil"])
        BCConfig(**clone["bc"])
        assert placebo_of(sil)["sil"] == {**sil["sil"], "placebo": True}
    shipped = json.loads((root / "configs" / "libero_spatial_sil.json").read_text())
    assert VARIANTS["sil-20demos-e6000-prior25-async"]["run"]["loop"] == "async"
    assert VARIANTS["sil-recipe"]["sil"] == shipped["sil"]
    assert all(shipped["run"][k] == v for k, v in VARIANTS["sil-recipe"]["run"].items())
    assert VARIANTS["sil-recipe"]["run"]["loop"] == shipped["run"]["loop"] == "async"  # the main job's loop
    sync = VARIANTS["sil-recipe-sync"]  # the earlier main job: the sync loop at 64 updates per iteration
    assert sync["run"]["loop"] == "sync" and sync["sil"] == {**shipped["sil"], "updates_per_iteration": 64}
    from benchmarks.rl_recipe_study import recipe_variant

    sac_recipe = json.loads((root / "configs" / "libero_spatial_sac.json").read_text())
    _, run, settings = recipe_variant(sac_recipe, VARIANTS["sil-failure-restarts-async"])
    assert run["env_kwargs"] == {**sac_recipe["run"]["env_kwargs"], "restart_frames_in_info": True}  # added
    assert SILConfig(**settings).failure_restarts == 0.5
    failed_starts = VARIANTS["sil-failed-starts-async"]  # the same, one chunk into the failed episodes
    assert failed_starts["run"] == VARIANTS["sil-failure-restarts-async"]["run"]
    assert failed_starts["sil"] == {**VARIANTS["sil-failure-restarts-async"]["sil"], "restart_depth": 0.0}
    warm = VARIANTS["sil-recipe-warmup"]["sil"]
    assert warm == {**shipped["sil"], "warmup_updates": warm["warmup_updates"]} and warm["warmup_updates"] > 0
    from_clone = VARIANTS["sil-recipe-from-clone"]
    assert from_clone["start_from"] == "clone-sil-recipe" and "init_policy" not in from_clone["run"]


def test_rl_recipe_study_dsrl_variant_is_the_dsrl_recipe():
    """A variant that names its policy takes none of the GRPO recipe's policy options (its
    log-std bounds would reach DSRL's noise actor): the residual one states its own."""
    from benchmarks.rl_recipe_study import DSRL_RECIPE, VARIANTS, recipe_variant

    recipe = json.loads(
        (Path(__file__).resolve().parents[1] / "configs" / "libero_spatial_grpo.json").read_text()
    )
    algo, run, sac = recipe_variant(recipe, VARIANTS["dsrl-flow"])
    assert (
        algo == "sac"
        and sac == DSRL_RECIPE["sac"]
        and run["policy_kwargs"] == DSRL_RECIPE["run"]["policy_kwargs"]
    )
    for key in ("env_kwargs", "eval_env_kwargs", "num_envs", "init_policy", "policy"):
        assert run[key] == DSRL_RECIPE["run"][key], key
    assert (
        recipe_variant(recipe, VARIANTS["residual-lr3e-4"])[1]["policy_kwargs"]
        == recipe["run"]["policy_kwargs"]
    )


def test_code_paths_follows_each_call_edge_once():
    from benchmarks.code_paths import PathRecorder, measure

    # a hand-made path: a.py calls b.py twice in a loop (read once), b.py calls back into a.py
    recorder = PathRecorder(Path("/r"), ("a.py", "f", None), ("a.py", "f"))
    recorder.files = ["a.py", "b.py", "a.py", "b.py", "a.py"]
    assert recorder.summary() == {"files": 2, "switches": 4, "returns": 3}
    root = Path(__file__).resolve().parent.parent
    measured = measure(root)
    counts, files = measured["evaluation"]
    assert "trainers/evaluation.py" in files and "trainers/callbacks.py" in files
    assert counts["files"] == len(files) and 0 < counts["returns"] <= counts["switches"]
    counts, files = measured["GRPO iteration"]
    assert {"trainers/grpo/train.py", "trainers/grpo/algorithm.py", "trainers/run.py"} <= set(files)


def test_actor_learner_table_rows_and_core_time(tmp_path, capsys):
    """Each row of benchmarks.actor_learner on a tiny SAC recipe: the shares are fractions of the
    machine's core-time, the loops count their updates and chunks, the async row records them too."""
    import sac_envs  # noqa: F401  (the actor process imports it by the env's module name)

    from benchmarks.actor_learner import main

    recipe = {
        "run": {"env": "sac_envs:SacClock-v0", "num_envs": 2, "policy_kwargs": {"hidden_sizes": [16]},
                "torch_threads": 1},
        "sac": {"learning_starts": 8, "batch_size": 16, "gradient_steps": 2, "critic_hidden_sizes": [16]},
    }  # fmt: skip
    path = tmp_path / "recipe.json"
    path.write_text(json.dumps(recipe))
    nice = '{"nice 5": {"sac": {"actor_nice": 5}}}'
    rows = main(["--recipe", str(path), "--seconds", "1", "--iterations", "3", "--learner-threads", "1",
                 "--out", str(tmp_path / "out"), "--async-variants", nice])  # fmt: skip
    learner = [f"learner alone, 1 thread, actor_every {n}" for n in (1, 2)]
    assert [r["row"] for r in rows] == [
        "env alone",
        *learner,
        "sync loop",
        "async loop",
        "async loop, nice 5",
    ]
    for r in rows:
        assert 0 <= r["busy_share"] <= 1.05 and r["wall_s"] > 0
    assert rows[0]["env_steps_per_s"] > 0 and rows[0]["updates_per_s"] == 0
    assert rows[1]["ms_per_update"] > 0 and rows[1]["env_steps_per_s"] == 0
    sync = rows[3]
    assert sync["updates_per_chunk"] == pytest.approx(1.0)  # 2 updates per vector step of 2 envs
    # async: 2 per vector step too, give or take the updates owed at either end of the window (at most
    # max_actor_lead + 1 vector steps' worth, 6 of the window's 24)
    assert 0.7 <= rows[4]["updates_per_chunk"] <= 1.3
    assert "core-time shares" in capsys.readouterr().out
    assert json.loads((tmp_path / "out" / "actor_learner.json").read_text())["rows"][3]["row"] == "sync loop"


def test_actor_learner_rows_of_a_self_imitation_recipe(tmp_path):
    """The same rows for a recipe with a ``sil`` entry: its update timed alone, and both loops
    counting updates per kept chunk-step (on SacClock every episode succeeds, so every chunk-step
    is kept: sync does 6 updates per 12)."""
    import sac_envs  # noqa: F401

    from benchmarks.actor_learner import main

    recipe = {
        "run": {"env": "sac_envs:SacClock-v0", "num_envs": 2, "policy": "gaussian", "torch_threads": 1,
                "policy_kwargs": {"hidden_sizes": [16], "squash": True}},
        "sil": {"steps_per_iteration": 6, "updates_per_iteration": 6, "batch_size": 16},
    }  # fmt: skip
    path = tmp_path / "recipe.json"
    path.write_text(json.dumps(recipe))
    rows = main(["--recipe", str(path), "--seconds", "1", "--iterations", "3", "--learner-threads", "1",
                 "--out", str(tmp_path / "out")])  # fmt: skip
    assert [r["row"] for r in rows] == ["env alone", "learner alone, 1 thread", "sync loop", "async loop"]
    assert rows[1]["ms_per_update"] > 0
    assert rows[2]["updates_per_chunk"] == pytest.approx(0.5)
    assert 0 < rows[3]["updates_per_chunk"] <= 0.5 and rows[3]["env_steps_per_s"] > 0
    with pytest.raises(ValueError, match="one of the entries 'sac' or 'sil'"):
        (tmp_path / "bad.json").write_text(json.dumps({"run": recipe["run"]}))
        main(["--recipe", str(tmp_path / "bad.json"), "--out", str(tmp_path / "out")])


@requires_libero
def test_evaluate_sweeps_libero_pro_categories_resumes_and_compares(tmp_path, capsys, monkeypatch):
    import benchmarks.evaluate as evaluate

    state_only = '{"chunk_size": null, "cameras": [], "task_state": true}'
    args = ["--policy", "libero_expert", "--categories", "standard", "lan", "--tasks", "0",
            "--init-states", "1", "--env-kwargs", state_only, "--num-envs", "1"]  # fmt: skip
    first = evaluate.main([*args, "--out", str(tmp_path / "a.json")])
    assert [c["trials"] for c in first["categories"].values()] == [1, 1] and first["pooled"]["trials"] == 2
    assert "by LIBERO-Pro category" in capsys.readouterr().out
    calls = []
    monkeypatch.setattr(evaluate, "run_frames", lambda *a, **k: calls.append(a) or [])
    again = evaluate.main([*args, "--out", str(tmp_path / "a.json"), "--against", str(tmp_path / "a.json")])
    assert calls == [] and again["pooled"] == first["pooled"]  # resumed: nothing run again
    assert again["against"][-1] == ("pooled", 2, "+0 -0", "1")
    with pytest.raises(SystemExit):  # refused before any simulator starts
        evaluate.main([*args[:3], "nope", "--out", str(tmp_path / "b.json")])
    assert "unknown categories ['nope']" in capsys.readouterr().err


def test_an_interrupted_sweep_resumes_episode_by_episode_and_sweeps_libero_plus(
    tmp_path, capsys, monkeypatch
):
    import benchmarks.evaluate as evaluate

    state_only = '{"chunk_size": null, "cameras": [], "task_state": true}'
    out = str(tmp_path / "plus.json")
    args = ["--policy", "libero_expert", "--benchmark", "plus", "--categories", "robot", "--tasks", "0", "1",
            "--env-kwargs", state_only, "--num-envs", "1", "--out", out]  # fmt: skip
    real = evaluate.run_frames

    def stopped_after_one(env, policy, ids, **kw):
        kw["on_episode"](real(env, policy, ids[:1], **{**kw, "on_episode": None})[0])
        raise KeyboardInterrupt  # the sweep is killed after its first episode

    monkeypatch.setattr(evaluate, "run_frames", stopped_after_one)
    with pytest.raises(KeyboardInterrupt):
        evaluate.main(args)
    ran = []
    monkeypatch.setattr(
        evaluate, "run_frames", lambda env, policy, ids, **kw: ran.append(ids) or real(env, policy, ids, **kw)
    )
    result = evaluate.main(args)
    assert len(ran) == 1 and len(ran[0]) == 1  # only the episode not yet saved
    robot = result["categories"]["robot"]
    assert robot["trials"] == 2 and sorted(e["frame"] for e in robot["episodes"]) == [0, 1]
    assert "by LIBERO-Plus category" in capsys.readouterr().out and "partial" not in json.loads(
        Path(out).read_text()
    )


def test_rl_recipe_study_knows_a_finished_clone(tmp_path):
    """A BC variant's finished run is recognised by its settings (``trainers.bc`` writes
    ``total_steps`` as the samples its epochs take), so a variant started from it does not train it
    again; another BC setting still counts as another run."""
    from benchmarks.rl_recipe_study import VARIANTS, ran_with, recipe_variant

    recipe = json.loads(
        (Path(__file__).resolve().parents[1] / "configs" / "libero_spatial_sil.json").read_text()
    )
    algo, run, settings = recipe_variant(recipe, VARIANTS["clone-sil-recipe"])
    assert recipe["run"]["loop"] == "async" and run["loop"] == "sync"  # BC has no actor: the sync loop
    run.update(seed=0)
    saved = {"run": {**run, "total_steps": 1_651_200_000}, "bc": {**settings, "weight_decay": 0.0}}
    (tmp_path / "config.json").write_text(json.dumps(saved))
    assert algo == "bc" and ran_with(tmp_path, algo, run, settings)
    assert not ran_with(tmp_path, algo, run, {**settings, "learning_rate": 3e-4})

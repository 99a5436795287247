"""Training the world models' reward model from simulator rollouts (trainers.reward_model).

Most tests use the counting env (tests/counting_env.py: its image shows the position, success when
it reaches the goal), where every label can be checked against the picture; one runs the whole
command on the real LIBERO simulator at a small size, and its model in a tiny world model.
"""

from __future__ import annotations

import json
import shutil

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import requires_libero
from counting_env import ConstantPolicy, CountingVectorEnv, counting_frames

import envs  # noqa: F401  (registers the world-model and LIBERO ids)
from envs.world_models.tiny import write_tiny_bundle
from nets.resnet_rm import NUM_KEYS, ResnetRewardModel
from trainers.demos import collect_episodes
from trainers.reward_model import __main__ as cli
from trainers.reward_model.collect import (
    FrameSet,
    episode_frames,
    parse_policy_spec,
    read_frames,
    write_frames,
)
from trainers.reward_model.train import (
    RewardModelConfig,
    episode_metrics,
    frame_metrics,
    run,
    split_episodes,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")
COUNTING = "RMCounting-v0"
if COUNTING not in gym.registry:
    gym.register(COUNTING, vector_entry_point="counting_env:CountingVectorEnv")


def counting_config(tmp_path, **overrides) -> RewardModelConfig:
    """The whole command on the counting env: tiny net, 16x16 frames, a few steps."""
    settings = dict(
        env=COUNTING, env_kwargs={"chunk_size": 2}, num_envs=2, out=str(tmp_path / "out"), width=2,
        frame_size=(16, 16), steps=6, batch_size=8, eval_every=3, held_out=0.4, progress=False,
        policy=["counting_env:ConstantPolicy,episodes=6", "counting_env:ConstantPolicy,value=-1,episodes=4"],
    )  # fmt: skip
    settings.update(overrides)
    return RewardModelConfig(**settings)


def goal_of(frame_id: int) -> int:
    return counting_frames()[frame_id].meta["goal"]


# ---------------------------------------------------------------------------- the network
def test_width_keeps_the_key_layout_and_is_read_from_the_file(tmp_path):
    wide, narrow = ResnetRewardModel(), ResnetRewardModel(width=8)
    assert list(narrow.state_dict()) == list(wide.state_dict()) and len(narrow.state_dict()) == NUM_KEYS
    assert narrow.state_dict()["net.7.weight"].shape == (1, 64) and narrow.width == 8
    torch.save(narrow.state_dict(), tmp_path / "rm.pth")
    loaded = ResnetRewardModel.from_checkpoint(tmp_path / "rm.pth")
    x = torch.rand(2, 3, 32, 32) * 2 - 1
    assert loaded.width == 8 and torch.equal(loaded.probability(x), narrow.probability(x))
    with pytest.raises(ValueError, match="reward model of width 8, expected width 16"):
        ResnetRewardModel.from_checkpoint(tmp_path / "rm.pth", width=16)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="expected a positive int"):
            ResnetRewardModel(width=bad)
    assert not narrow.train().training  # frozen by default (the envs' use)
    assert ResnetRewardModel(width=2, frozen=False).train().training


# ---------------------------------------------------------------------------- specs, labels, split
def test_policy_specs_parse_and_bad_ones_are_named():
    spec = parse_policy_spec("libero_expert,episodes=12,noise=0.3,pos_gain=2.5")
    assert (spec.name, spec.episodes, spec.noise, spec.kwargs) == (
        "libero_expert",
        12,
        0.3,
        {"pos_gain": 2.5},
    )
    for text, match in [("libero_expert", "episodes=<int >= 1>"), ("x,episodes=0", "episodes=<int >= 1>"),
                        ("x,episodes=2,noise=-1", "noise=<float >= 0>"), ("x,episodes", "key=value"),
                        ("", "NAME")]:  # fmt: skip
        with pytest.raises(ValueError, match=match):
            parse_policy_spec(text)


@pytest.mark.parametrize("mode", ["Disabled", "NextStep", "SameStep"])
def test_frames_are_labelled_with_the_envs_success_in_every_autoreset_mode(mode):
    env = CountingVectorEnv(num_envs=2, chunk_size=2, autoreset_mode=mode)
    policy = ConstantPolicy(env.single_observation_space, env.single_action_space)
    episodes = list(collect_episodes(env, policy, 5, frame_ids=range(5), info_keys=["chunk_success"]))
    for ep in episodes:
        frames, labels = episode_frames(ep, "image", sub_steps=False, env_name="counting")
        position = frames[:, 0, 0, 0].astype(int)  # the image shows the position
        assert position[0] == 0 and position[-1] == min(goal_of(ep.initial_frame), 10)
        assert labels.tolist() == (position >= goal_of(ep.initial_frame)).tolist()
        assert labels[-1] == ep.success and labels.sum() == int(ep.success)  # the episode ends at success
    assert [ep.success for ep in episodes] == [True] * 4 + [False]  # goal 20 is out of reach


class FramedCounting(CountingVectorEnv):
    """The counting env with ``record_frames``: ``info["frames"]`` holds the image after each sub-step."""

    record_frames = False

    def _step_envs(self, env_ids, actions, max_steps):
        before = self.pos[env_ids].copy()
        result = super()._step_envs(env_ids, actions, max_steps)
        if self.record_frames:
            shots = np.empty(len(env_ids), dtype=object)
            for p in range(len(env_ids)):
                moved = np.cumsum(actions[p, : result.valid[p].sum(), 0] > 0)  # position after each sub-step
                shape = (len(moved), 2, 2, 3)
                shots[p] = np.broadcast_to((before[p] + moved)[:, None, None, None], shape).astype(np.uint8)
            result.info["frames"] = shots
        return result


def test_sub_step_frames_carry_the_success_of_their_own_sub_step():
    from trainers.reward_model.collect import collect_frames

    env = FramedCounting(num_envs=2, chunk_size=4, autoreset_mode="Disabled")
    spec = parse_policy_spec("counting_env:ConstantPolicy,episodes=5")
    for _, ep, frames, labels in collect_frames(env, [spec], sub_steps=True, progress=False):
        position, goal = frames[:, 0, 0, 0].astype(int), goal_of(ep.initial_frame)
        assert position.tolist() == list(range(len(position)))  # the reset frame, then every sub-step
        assert labels.tolist() == (position >= goal).tolist() and len(labels) == 1 + ep.length


def test_split_keeps_start_frames_together_and_both_labels_on_each_side():
    rng = np.random.default_rng(0)
    n, per = 20, 5
    starts = np.repeat(np.arange(10), 2)  # two episodes per start frame
    solved = np.arange(n) % 4 != 0
    labels = np.concatenate([[False] * 3 + [s] * 2 for s in solved])
    fs = FrameSet(rng.integers(0, 255, (n * per, 4, 4, 3), np.uint8), labels,
                  np.repeat(np.arange(n), per), np.tile(np.arange(per), n),
                  {"initial_frame": starts, "success_once": solved}, {})  # fmt: skip
    train, held = split_episodes(fs, 0.3, seed=1)
    assert set(train).isdisjoint(held) and sorted([*train, *held]) == list(range(n))
    assert set(starts[train]).isdisjoint(starts[held])
    assert solved[held].any() and solved[train].any() and not solved[held].all()
    few = FrameSet(fs.frames[:10], labels[:10], fs.episode[:10], fs.step[:10],
                   {"initial_frame": starts[:2], "success_once": solved[:2]}, {})  # fmt: skip
    with pytest.raises(ValueError, match="too few to hold out"):
        split_episodes(few, 0.3, seed=1)


def test_metrics_agree_with_their_confusion_counts():
    labels = np.array([0, 0, 1, 1, 1, 0, 0, 0, 1, 1], bool)
    pred = np.array([0, 1, 1, 1, 0, 0, 0, 0, 0, 1], bool)
    m = frame_metrics(labels, pred)
    assert (m["tp"], m["fp"], m["fn"], m["tn"]) == (3, 1, 2, 4)
    assert (
        m["precision"] == 3 / 4 and m["recall"] == 3 / 5 and m["f1"] == pytest.approx(2 * 0.75 * 0.6 / 1.35)
    )
    episode = np.array([0] * 5 + [1] * 5)
    e = episode_metrics(episode, labels, pred)
    # episode 0: both say success, the model one frame early; episode 1: both too, one frame late
    assert e["any_agreement"] == 1.0 and e["any_tp"] == 2 and e["final_agreement"] == 0.5
    assert (
        e["onset_mean_abs_frames"] == 1.0
        and e["onset_within_1_frame"] == 1.0
        and e["onset_early_episodes"] == 1
    )


def test_one_sided_labels_leave_no_file_behind(tmp_path):
    frames = np.zeros((3, 4, 4, 3), np.uint8)
    path = tmp_path / "new" / "frames.h5"

    def episodes(labels):
        from trainers.datasets.demos import Episode

        ep = Episode({}, np.zeros((2, 1, 1)), np.ones((2, 1), bool), np.zeros((2, 1)), success=labels[-1])
        yield 0, ep, frames, np.array(labels, bool)

    for labels, match in (([False] * 3, "no positive frames"), ([True] * 3, "no negative frames")):
        with pytest.raises(ValueError, match=match):
            write_frames(path, episodes(labels), {"policies": ["p"]})
        assert not (tmp_path / "new").exists()


# ---------------------------------------------------------------------------- the command
def test_the_command_on_the_counting_env_writes_a_loadable_model_and_a_consistent_report(tmp_path):
    report = cli.main([
        "--env", COUNTING, "--env-kwargs", '{"chunk_size": 2}', "--out", str(tmp_path / "out"),
        "--width", "2", "--frame-size", "[16, 16]", "--steps", "6", "--batch-size", "8", "--eval-every", "3",
        "--held-out", "0.4", "--no-progress", "--policy", "counting_env:ConstantPolicy,episodes=6",
        "--policy", "counting_env:ConstantPolicy,value=-1,episodes=4",
    ])  # fmt: skip
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["frames.h5", "metrics.jsonl", "report.json", "report.md",
                                                      "resnet_rm.pth", "tb"]  # fmt: skip
    state = torch.load(out / "resnet_rm.pth", weights_only=True)
    assert len(state) == NUM_KEYS and state["net.0.0.weight"].shape == (2, 3, 7, 7)
    assert ResnetRewardModel.from_checkpoint(out / "resnet_rm.pth").width == 2
    fs = read_frames(out / "frames.h5")
    for ep in range(fs.num_episodes):  # every label is the picture's position against the goal
        frames = fs.frames[fs.episode == ep]
        assert (
            fs.labels[fs.episode == ep].tolist()
            == (frames[:, 0, 0, 0] >= goal_of(fs.episodes["initial_frame"][ep])).tolist()
        )
    assert fs.meta["policies"] == [
        "counting_env:ConstantPolicy,episodes=6",
        "counting_env:ConstantPolicy,value=-1,episodes=4",
    ]
    m, d = report["held_out_frames"], report["data"]
    assert m["tp"] + m["fp"] + m["fn"] + m["tn"] == m["frames"] == d["held_out"]["frames"]
    assert m["tp"] + m["fn"] == m["positives"] == d["held_out"]["positives"]
    if m["tp"]:
        assert m["precision"] == m["tp"] / (m["tp"] + m["fp"]) and m["recall"] == m["tp"] / m["positives"]
    assert d["train"]["frames"] + d["held_out"]["frames"] == len(fs.labels)
    assert report["held_out_episodes"]["episodes"] == d["held_out"]["episodes"]
    saved = json.loads((out / "report.json").read_text())["held_out_frames"]
    assert {k: saved[k] for k in ("tp", "fp", "fn", "tn", "f1")} == {
        k: m[k] for k in ("tp", "fp", "fn", "tn", "f1")
    }
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("train/loss" in r for r in rows) and any(r["step"] == 3 and "eval/f1" in r for r in rows)
    # retraining from the saved frames collects nothing; the same split, another width
    again = run(
        counting_config(tmp_path, frames=str(out / "frames.h5"), out=str(tmp_path / "again"), width=3)
    )
    assert again["data"]["held_out"] == d["held_out"] and again["training"]["width"] == 3
    assert not (tmp_path / "again" / "frames.h5").exists()


class NoSuccessEnv(gym.Env):
    """Images, but no success in its info."""

    observation_space = gym.spaces.Dict(image=gym.spaces.Box(0, 255, (4, 4, 3), np.uint8))
    action_space = gym.spaces.Box(-1, 1, (2,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return {"image": np.zeros((4, 4, 3), np.uint8)}, {}

    def step(self, action):
        return {"image": np.ones((4, 4, 3), np.uint8)}, 0.0, False, False, {}


@pytest.mark.parametrize(
    "overrides, error, match",
    [
        ({"env": "envs:NoSuchEnv-v0"}, ValueError, "unknown env 'envs:NoSuchEnv-v0'"),
        ({"policy": ["no_such_policy,episodes=2"]}, ValueError, "unknown policy 'no_such_policy'"),
        ({"env": "RMNoSuccess-v0", "env_kwargs": {}, "policy": ["random,episodes=2"]}, ValueError,
         "reports no success signal"),
        ({"policy": ["counting_env:ConstantPolicy,value=-1,episodes=4"]}, ValueError, "no positive frames"),
        ({"sub_steps": True}, ValueError, "sub_steps needs an env with record_frames"),
        ({"width": 0}, ValueError, "expected a positive int"),
        ({"frames": "/nonexistent/frames.h5"}, FileNotFoundError, "no frame file at /nonexistent"),
        ({"init_from": "/nonexistent/rm.pth"}, FileNotFoundError, "no reward model file at /nonexistent"),
        ({"held_out": 1.0}, ValueError, "held_out: expected a fraction"),
        ({"frame_size": (8, 16)}, ValueError, "frame_size"),
    ],
)  # fmt: skip
def test_bad_input_is_named_and_leaves_nothing_behind(tmp_path, overrides, error, match):
    if "RMNoSuccess-v0" not in gym.registry:
        gym.register("RMNoSuccess-v0", entry_point=NoSuccessEnv, max_episode_steps=3)
    with pytest.raises(error, match=match):
        run(counting_config(tmp_path, **overrides))
    assert not (tmp_path / "out").exists()


def test_a_width_that_does_not_match_the_starting_model(tmp_path):
    torch.save(ResnetRewardModel(width=4).state_dict(), tmp_path / "start.pth")
    with pytest.raises(ValueError, match="reward model of width 4, expected width 2"):
        run(counting_config(tmp_path, init_from=str(tmp_path / "start.pth"), width=2))
    report = run(counting_config(tmp_path, init_from=str(tmp_path / "start.pth"), width=None))
    assert report["training"]["width"] == 4


def _nan_model(path, value=float("nan")):
    model = ResnetRewardModel(width=2)
    with torch.no_grad():
        model.net[-1].weight.fill_(value)
    torch.save(model.state_dict(), path)
    return path


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_start_of_non_finite_weights_is_refused_before_any_collection(tmp_path, value):
    """Issue 32 item 8: a reward model started from NaN weights used to train and write a NaN model."""
    start = _nan_model(tmp_path / "nan.pth", value)
    with pytest.raises(
        ValueError,
        match=r"init_from: .*nan.pth: expected a reward model with finite weights, got NaN or inf in "
        r"\['net.7.weight'\]",
    ):
        run(counting_config(tmp_path, init_from=str(start), width=None))
    assert not (tmp_path / "out").exists()  # refused before the frames were collected
    with pytest.raises(ValueError, match="finite weights"):  # also where the envs load it
        ResnetRewardModel.from_checkpoint(start)


def test_a_model_that_diverges_is_never_written(tmp_path, monkeypatch):
    from trainers.reward_model import train as train_module

    with pytest.raises(
        ValueError,
        match=r"resnet_rm.pth: not written: .*finite weights, got NaN or inf in \['net.7.weight'\]",
    ):
        model = ResnetRewardModel(width=2)
        with torch.no_grad():
            model.net[-1].weight.fill_(float("nan"))
        train_module.save_reward_model(model, tmp_path / "resnet_rm.pth")
    assert not (tmp_path / "resnet_rm.pth").exists()
    real = train_module.F.binary_cross_entropy_with_logits
    monkeypatch.setattr(
        train_module.F, "binary_cross_entropy_with_logits", lambda *a, **k: real(*a, **k) * np.nan
    )
    with pytest.raises(FloatingPointError, match=r"the loss of step 0 is nan .*no model is written"):
        run(counting_config(tmp_path))
    assert not (tmp_path / "out" / "resnet_rm.pth").exists()


# ---------------------------------------------------------------------------- in a world model
def test_world_model_envs_take_a_reward_model_path(tmp_path):
    bundle = write_tiny_bundle("opensora", tmp_path / "bundle")  # its own model never says success
    always = ResnetRewardModel(width=4)
    with torch.no_grad():
        always.net[-1].bias.fill_(30.0)
    torch.save(always.state_dict(), tmp_path / "always.pth")
    shutil.copytree(bundle, tmp_path / "no_rm")
    (tmp_path / "no_rm" / "resnet_rm.pth").unlink()
    kwargs = dict(num_envs=2, image_size=(32, 32), model_options={"num_steps": 1}, autoreset_mode="Disabled")
    actions = np.zeros((2, 8, 7), np.float32)
    cases = [(bundle, None, False), (bundle, tmp_path / "always.pth", True),
             (tmp_path / "no_rm", str(tmp_path / "always.pth"), True)]  # fmt: skip
    for model_dir, reward_model, succeeds in cases:
        env = gym.make_vec(
            "OpenSoraWM-LiberoSpatial-v0", model_dir=model_dir, reward_model=reward_model, **kwargs
        )
        env.reset(seed=0)
        *_, term, _, info = env.step(actions)
        assert env.reward_model.width == (4 if reward_model else 64)
        assert term.all() == succeeds and (info["reward_model_scores"][:, 0] == float(succeeds)).all()
        env.close()
    with pytest.raises(FileNotFoundError, match="reward_model='/nonexistent/rm.pth' is not a file"):
        gym.make_vec(
            "OpenSoraWM-LiberoSpatial-v0", model_dir=bundle, reward_model="/nonexistent/rm.pth", **kwargs
        )
    with pytest.raises(FileNotFoundError, match="missing resnet_rm.pth"):
        gym.make_vec("OpenSoraWM-LiberoSpatial-v0", model_dir=tmp_path / "no_rm", **kwargs)


# ---------------------------------------------------------------------------- the real simulator
@requires_libero
@pytest.mark.slow
def test_libero_frames_train_a_model_that_a_world_model_loads(tmp_path):
    """Expert episodes (successes) and a noisy one (failure), 64x64, 2 steps past the success."""
    env_kwargs = {"image_size": [64, 64], "cameras": ["agentview"], "proprio": False,
                  "include_instruction": False, "task_state": True, "chunk_size": 2,
                  "steps_after_success": 6, "task_ids": [0], "max_episode_steps": 150}  # fmt: skip
    cfg = RewardModelConfig(
        env_kwargs=env_kwargs, policy=["libero_expert,episodes=3", "libero_expert,noise=1.0,episodes=1"],
        num_envs=2, out=str(tmp_path / "rm"), width=4, frame_size=(64, 64), steps=4, batch_size=4,
        eval_every=0, held_out=0.5, progress=False,
    )  # fmt: skip
    report = run(cfg)
    fs = read_frames(tmp_path / "rm" / "frames.h5")
    assert fs.frames.shape[1:] == (64, 64, 3) and fs.meta["env_kwargs"] == env_kwargs
    assert fs.episodes["success"].tolist() == [True, True, True, False]
    for ep in range(fs.num_episodes):
        labels = fs.labels[fs.episode == ep]
        if fs.episodes["success"][ep]:  # unsolved, then solved from the success on (the expert holds still)
            first = int(np.argmax(labels))  # frame f follows sub-step 2f, or is the episode's last
            assert not labels[:first].any() and labels[first:].all() and labels.sum() == 4
            # the simulator's first success was sub-step 2 * first - 1 or 2 * first, 6 before the end
            assert fs.episodes["length"][ep] - 6 in (2 * first - 1, 2 * first)
        else:
            assert not labels.any() and len(labels) == 150 // 2 + 1
    train, held_eps = split_episodes(fs, cfg.held_out, cfg.seed)  # the split the run used
    starts = fs.episodes["initial_frame"]
    assert set(starts[train]).isdisjoint(starts[held_eps])
    held = report["data"]["held_out"]
    assert held["episodes"] == len(held_eps) and held["frames"] == int(np.isin(fs.episode, held_eps).sum())
    m = report["held_out_frames"]
    assert m["tp"] + m["fp"] + m["fn"] + m["tn"] == held["frames"]
    path = tmp_path / "rm" / "resnet_rm.pth"
    assert ResnetRewardModel.from_checkpoint(path, width=4).width == 4
    bundle = write_tiny_bundle("cosmos", tmp_path / "cosmos")
    env = gym.make_vec("CosmosWM-LiberoSpatial-v0", num_envs=1, model_dir=bundle, reward_model=str(path),
                       image_size=(32, 48), model_options={"num_steps": 1})  # fmt: skip
    env.reset(seed=0)
    *_, info = env.step(np.zeros((1, 8, 7), np.float32))
    assert env.reward_model.width == 4 and info["reward_model_scores"].shape == (1, 8)
    env.close()


def test_the_same_seed_trains_the_same_model(tmp_path):
    frames = run(counting_config(tmp_path, collect_only=True, out=str(tmp_path / "data")))["frames"]
    weights = []
    for name in ("a", "b"):
        run(counting_config(tmp_path, frames=frames, out=str(tmp_path / name)))
        weights.append(torch.load(tmp_path / name / "resnet_rm.pth", weights_only=True))
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])

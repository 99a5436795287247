"""Every file vla-gym reads is loaded without running code from it: a crafted payload planted in each
load path is refused with a clear error and never runs (the payload would create a marker file)."""

from __future__ import annotations

import io
import pickle

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import requires_libero

import envs  # noqa: F401
import trainers.checkpoint as ckpt
from benchmarks.robustness import Payload, crafted_checkpoint, plant_payload
from envs.core.frames import InitialFrame, load_initial_frames, save_initial_frames
from envs.world_models.tiny import write_tiny_bundle
from nets.errors import BadInput
from nets.safe_load import UnsafeFileError, load_npy, restricted_unpickle, torch_load


@pytest.fixture
def marker(tmp_path):
    path = tmp_path / "payload_ran"
    yield path
    assert not path.exists(), "the payload ran"


def refused():
    return pytest.raises(
        UnsafeFileError, match=r"refused to load: the file asks for the global '(builtins|io)\.open'"
    )


# ---------------------------------------------------------------------- the loaders themselves
def test_plain_data_loads_and_anything_else_is_refused(tmp_path, marker):
    data = {
        "w": torch.randn(2, 3).to(torch.bfloat16),
        "a": np.arange(3.0),
        "s": np.float32(1.5),
        "t": ("x", 1),
    }
    torch.save(data, tmp_path / "ok.pt")
    back = torch_load(tmp_path / "ok.pt", numpy=True)
    assert (
        torch.equal(back["w"], data["w"]) and np.array_equal(back["a"], data["a"]) and back["t"] == ("x", 1)
    )
    with open(tmp_path / "ok.pkl", "wb") as f:
        pickle.dump(data, f)
    back = restricted_unpickle(tmp_path / "ok.pkl")
    assert torch.equal(back["w"], data["w"]) and back["s"] == np.float32(1.5)
    record = np.empty(1, dtype=object)
    record[0] = {"image": np.zeros((2, 2, 3), np.uint8), "text": "hi"}
    np.save(tmp_path / "ok.npy", record, allow_pickle=True)
    assert load_npy(tmp_path / "ok.npy")[0]["text"] == "hi"

    torch.save({"w": Payload(marker)}, tmp_path / "bad.pt")
    with refused():
        torch_load(tmp_path / "bad.pt", numpy=True)
    with open(tmp_path / "bad.pkl", "wb") as f:
        pickle.dump({"w": Payload(marker)}, f)
    with refused():
        restricted_unpickle(tmp_path / "bad.pkl")
    record[0] = {"image": Payload(marker)}
    np.save(tmp_path / "bad.npy", record, allow_pickle=True)
    with refused():
        load_npy(tmp_path / "bad.npy")
    with pytest.raises(UnsafeFileError, match="pass trust_pickle=True"):
        torch_load(tmp_path / "bad.pt")


def test_the_named_opt_in_loads_a_full_pickle(tmp_path):
    ran = tmp_path / "ran"
    torch.save({"w": Payload(ran)}, tmp_path / "trusted.pt")
    torch_load(tmp_path / "trusted.pt", trust_pickle=True)
    assert ran.exists()  # exactly what trust_pickle=True means: the file's code runs


# ---------------------------------------------------------------------- threads
def _in_threads(work, items, threads=3):
    """Run ``work(item)`` for every item, spread over ``threads`` threads started together;
    the exceptions raised."""
    import threading

    errors, start = [], threading.Barrier(threads)

    def run(part):
        start.wait()
        for item in part:
            try:
                work(item)
            except Exception as e:  # noqa: BLE001  (collected for the assertion)
                errors.append(e)

    pool = [threading.Thread(target=run, args=(items[i::threads],)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return errors


def test_loads_in_several_threads_at_once_are_safe(tmp_path):
    """Each load carries its own allow list: no process-wide switch (torch's safe_globals)
    is flipped, so threads loading files with different needs never refuse each other's."""
    safe_before = list(torch.serialization.get_safe_globals())
    frame = InitialFrame(instruction="pick", image=np.zeros((4, 4, 3), np.uint8))
    torch.save({"a": np.arange(5.0), "s": np.float32(2)}, tmp_path / "numpy.pt")
    torch.save({"frame": frame, "w": torch.ones(3)}, tmp_path / "frame.pt")
    torch.save({"w": torch.ones(3)}, tmp_path / "plain.pt")
    jobs = [("numpy", {"numpy": True}), ("frame", {"numpy": True, "allow": [InitialFrame]}), ("plain", {})]

    def load(job):
        name, kwargs = job
        torch_load(tmp_path / f"{name}.pt", **kwargs)

    assert _in_threads(load, jobs * 60) == []
    # what one call allows is not allowed to the others
    with pytest.raises(UnsafeFileError, match="numpy"):
        torch_load(tmp_path / "numpy.pt")
    with pytest.raises(UnsafeFileError, match="InitialFrame"):
        torch_load(tmp_path / "frame.pt", numpy=True)
    assert list(torch.serialization.get_safe_globals()) == safe_before  # never touched


@requires_libero
def test_libero_init_files_load_from_three_threads():
    """The issue's reproduction: LIBERO's own init files, read from three threads at once."""
    from pathlib import Path

    from envs.libero import suites

    folder = Path(suites._init_states_path("libero_spatial", "x")).parents[1]
    paths = sorted(str(p) for p in folder.glob("*/*.pruned_init"))
    assert len(paths) >= 130
    suites._load_init_states_file.cache_clear()
    try:
        assert _in_threads(suites._load_init_states_file.__wrapped__, paths) == []
    finally:
        suites._load_init_states_file.cache_clear()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_torchscript_archive_is_refused(tmp_path):
    """``torch.load`` hands a TorchScript archive to ``torch.jit.load``: refused, not run."""
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), tmp_path / "scripted.pt")
    with pytest.raises(UnsafeFileError, match="TorchScript"):
        torch_load(tmp_path / "scripted.pt")
    with pytest.raises(UnsafeFileError, match="TorchScript"):
        torch_load(io.BytesIO((tmp_path / "scripted.pt").read_bytes()))


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")
def test_a_tensor_with_backward_hooks_is_refused(tmp_path):
    """Hooks would be called on a later backward pass: even an allowed function is refused."""
    import codecs
    import collections

    class Hooked:  # pickles as a tensor rebuilt with a hook (torch.save itself never writes one)
        def __reduce__(self):
            hooks = collections.OrderedDict({0: codecs.encode})
            return torch._utils._rebuild_tensor_v2, (torch.ones(2).storage(), 0, (2,), (1,), False, hooks)

    hooked = Hooked()
    torch.save({"w": hooked}, tmp_path / "hooked.pt")
    with pytest.raises(UnsafeFileError, match="a tensor with backward hooks"):
        torch_load(tmp_path / "hooked.pt")


def test_zero_size_numpy_arrays_load_and_bytes_with_a_size_is_refused(tmp_path):
    """A zero-size array pickles its data as ``bytes()``: that alone is rebuilt; ``bytes(n)`` (n bytes
    allocated for a few in the file) is refused."""
    empty = {"obs": np.zeros((0, 3), np.float32), "flags": np.zeros(0, bool)}
    torch.save(empty, tmp_path / "empty.pt")
    back = torch_load(tmp_path / "empty.pt", numpy=True)
    assert back["obs"].shape == (0, 3) and back["obs"].dtype == np.float32 and back["flags"].shape == (0,)

    class Allocates:
        def __reduce__(self):
            return bytes, (2**40,)

    torch.save({"x": Allocates()}, tmp_path / "big.pt")
    with pytest.raises(UnsafeFileError, match="bytes"):
        torch_load(tmp_path / "big.pt", numpy=True)


# ---------------------------------------------------------------------- trainer checkpoints
def test_resume_init_policy_and_load_policy_refuse_a_payload(tmp_path, marker):
    from trainers.__main__ import main

    run = tmp_path / "run"
    path = crafted_checkpoint(run / "checkpoints" / "iter_000001.pt", marker)
    env = gym.make("CartPole-v1")
    spaces = (env.observation_space, env.action_space)
    with refused():
        ckpt.load_policy(run, *spaces)
    with refused():
        ckpt.load_policy(path, *spaces)
    with refused():
        ckpt.build_policy("mlp", {}, *spaces, init_policy=path)
    with refused():
        main(["--env", "CartPole-v1", "--resume", str(run), "--no-progress", "--no-tensorboard"])
    with refused():
        main(["--env", "CartPole-v1", "--init-policy", str(path), "--run-dir", str(tmp_path / "r2")])


def test_checkpoint_checksum_catches_flipped_bytes(tmp_path):
    weights = torch.linspace(-1, 1, 4096)
    path = ckpt.save_checkpoint(tmp_path / "iter_000001.pt", {"policy": {"state_dict": {"w": weights}}})
    assert torch.equal(ckpt.load_checkpoint(path)["policy"]["state_dict"]["w"], weights)
    raw = bytearray(path.read_bytes())
    start = raw.index(weights.numpy().tobytes()[:64])  # inside the tensor's bytes
    raw[start + 100 : start + 164] = bytes(b ^ 0xFF for b in raw[start + 100 : start + 164])
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="corrupt checkpoint"):
        ckpt.load_checkpoint(path)


def test_a_save_removes_partial_files_of_killed_saves(tmp_path):
    (tmp_path / ".iter_000003.pt.partial").write_bytes(b"half a file")
    ckpt.save_checkpoint(tmp_path / "iter_000004.pt", {"counters": {}})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_000004.pt"]


def test_a_corrupt_config_json_on_resume_names_the_file(tmp_path):
    from trainers.__main__ import main

    run = tmp_path / "run"
    ckpt.save_checkpoint(run / "checkpoints" / "iter_000001.pt", {"counters": {}})
    (run / "config.json").write_text('{"run": {"env_id": ')
    with pytest.raises(
        BadInput, match=r"config .*run/config.json: expected JSON, got a file that does not parse"
    ):
        main(["--resume", str(run)])


# ---------------------------------------------------------------------- env files
def test_initial_frames_refuse_a_payload(tmp_path, marker):
    frame = InitialFrame(instruction="pick", image=np.zeros((4, 4, 3), np.uint8))
    folder = save_initial_frames([frame, frame], tmp_path)
    plant_payload(folder / "frame_00001.npy", marker)
    with refused():
        load_initial_frames(tmp_path)


BUNDLE_FILES = {
    "reward model": "resnet_rm.pth",
    "dataset": "dataset/seed_0_traj_0.npy",
    "VAE tokenizer": "tokenizer/tokenizer.pth",
    "DiT": "libero-spatial-2b-19k.pt",
}


@pytest.mark.parametrize("part", list(BUNDLE_FILES))
def test_world_model_bundle_files_refuse_a_payload(tmp_path, marker, part):
    root = write_tiny_bundle("cosmos", tmp_path / "bundle")
    plant_payload(root / BUNDLE_FILES[part], marker)
    with refused():
        gym.make_vec("CosmosWM-LiberoSpatial-v0", num_envs=1, model_dir=root, image_size=(32, 48))


def test_world_model_state_refuses_a_payload(tmp_path, marker):
    root = write_tiny_bundle("cosmos", tmp_path / "bundle")
    env = gym.make_vec("CosmosWM-LiberoSpatial-v0", num_envs=1, model_dir=root, image_size=(32, 48))
    env.reset(seed=0)
    state = env.unwrapped.get_state()
    env.unwrapped.load_state(state)  # a real snapshot (numpy arrays, frames, tensors) loads
    buffer = io.BytesIO()
    torch.save({"episode": Payload(marker), "previous": torch.zeros(1), "generator": torch.zeros(1)}, buffer)
    with refused():
        env.unwrapped.load_state(buffer.getvalue())
    with pytest.raises(ValueError, match="state: expected the bytes get_state returned"):
        env.unwrapped.load_state(b"junk")
    env.close()


def test_hub_downloads_are_opt_in_and_pinned(tmp_path):
    with pytest.raises(ValueError, match="download=True needs revision="):
        gym.make_vec("CosmosWM-LiberoSpatial-v0", num_envs=1, download=True)


def test_cosmos_policy_t5_embeddings_refuse_a_payload(tmp_path, marker):
    from policies.cosmos_policy.checkpoint import load_text_embeddings
    from policies.cosmos_policy.tiny import write_tiny_cosmos_policy

    folder = write_tiny_cosmos_policy(tmp_path / "ckpt")
    path = folder / "libero_t5_embeddings.pkl"
    assert len(load_text_embeddings(path)) > 0  # the real format (pickled bf16 tensors) loads
    with open(path, "wb") as f:
        pickle.dump({"pick": Payload(marker)}, f)
    with refused():
        load_text_embeddings(path)


def test_readme_says_what_is_trusted():
    from pathlib import Path

    text = (Path(__file__).parents[1] / "README.md").read_text()
    assert "trust_pickle=True" in text and "weights_only" in text


# ---------------------------------------------------------------------- trust comes from the user
def _policy_checkpoint(path, name, kwargs, state_dict=None, iteration=1):
    """A valid trainer checkpoint (correct SHA-256) whose policy spec is ``name``/``kwargs``."""
    spec = {"name": name, "kwargs": kwargs, "state_dict": state_dict or {}, "omitted": []}
    payload = {"algo": "bc", "policy": spec, "counters": {"iteration": iteration}, "config": {}}
    return ckpt.save_checkpoint(path, payload)


def test_a_checkpoints_kwargs_cannot_grant_trust_pickle(tmp_path, marker):
    """The issue's case: a valid checkpoint whose saved kwargs say trust_pickle=True for a folder
    whose .pkl runs code. The opt-in is dropped with a warning: the .pkl is read safely, refused."""
    from gymnasium import spaces

    from envs.core.spaces import FieldBox
    from policies.cosmos_policy.tiny import write_tiny_cosmos_policy

    image = spaces.Box(0, 255, (32, 32, 3), np.uint8)
    proprio = FieldBox(-10, 10, (("eef_pos", 3), ("eef_axis_angle", 3), ("gripper_qpos", 2)))
    obs_space = {"image": image, "wrist_image": image, "proprio": proprio, "instruction": spaces.Text(200)}
    OBS_SPACE, ACT_SPACE = spaces.Dict(obs_space), spaces.Box(-1, 1, (8, 7), np.float32)  # noqa: N806
    folder = write_tiny_cosmos_policy(tmp_path / "ckpt")
    with open(folder / "libero_t5_embeddings.pkl", "wb") as f:
        pickle.dump({"pick": Payload(marker)}, f)
    kwargs = {"model_path": str(folder), "image_size": 32, "num_steps": 3, "trust_pickle": True}
    path = _policy_checkpoint(tmp_path / "p.pt", "policies.cosmos_policy:CosmosPolicy", kwargs)
    for load in (
        lambda: ckpt.load_policy(path, OBS_SPACE, ACT_SPACE),
        lambda: ckpt.build_policy("auto", {}, OBS_SPACE, ACT_SPACE, init_policy=path),
    ):
        with pytest.warns(RuntimeWarning, match=r"ignored \{'trust_pickle': True\}"), refused():
            load()
    # the user's own call is where the opt-in comes from
    with pytest.warns(RuntimeWarning), pytest.raises(Exception):  # noqa: B017,PT011  (whatever the payload's result raises)
        ckpt.load_policy(path, OBS_SPACE, ACT_SPACE, policy_kwargs={"trust_pickle": True})
    assert marker.exists()
    marker.unlink()


def test_a_checkpoints_kwargs_lose_download_and_revision(tmp_path):
    spec = {
        "name": "policies.openvla_oft:OpenVLAOFTPolicy",
        "kwargs": {
            "model_path": "owner/repo@0123abcd",
            "download": True,
            "revision": "main",
            "options": {"trust_pickle": True, "lora_rank": 1},
        },
    }
    with pytest.warns(RuntimeWarning) as caught:
        checked = ckpt.checked_policy_spec(spec, "ckpt.pt")
    assert checked["kwargs"] == {"model_path": "owner/repo@0123abcd", "options": {"lora_rank": 1}}
    messages = [str(w.message) for w in caught]
    assert any("ignored {'download': True, 'revision': 'main'}" in m for m in messages)
    assert any("ignored {'trust_pickle': True}" in m for m in messages)
    quiet = ckpt.checked_policy_spec({"name": "gaussian", "kwargs": {"download": False}}, "ckpt.pt")
    assert quiet["kwargs"] == {}  # a harmless False is dropped without a word


def test_load_policy_drops_the_files_opt_ins_and_still_loads(tmp_path):
    env = gym.make("CartPole-v1")
    spaces = (env.observation_space, env.action_space)
    policy, built = ckpt.build_policy("categorical", {"hidden_sizes": [8]}, *spaces)
    kwargs = {**built["kwargs"], "trust_pickle": True}  # CategoricalPolicy would reject the key
    path = _policy_checkpoint(tmp_path / "p.pt", built["name"], kwargs, policy.state_dict())
    with pytest.warns(RuntimeWarning, match="trust_pickle"):
        back = ckpt.load_policy(path, *spaces)
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), policy.state_dict().values()))


def test_the_callers_opt_ins_reach_only_a_policy_that_takes_them(tmp_path):
    """Issue 32: ``policy_kwargs={"trust_pickle": False}`` for a policy without that argument was
    its TypeError. False or None asks for nothing and is left out; a value that asks for something
    is a ValueError naming it and the policy; the pretrained policies take theirs."""
    from nets.file_settings import OPT_IN_KEYS
    from policies.cosmos_policy import CosmosPolicy
    from policies.registry import accepted_arguments

    env = gym.make("CartPole-v1")
    spaces = (env.observation_space, env.action_space)
    policy, built = ckpt.build_policy("categorical", {"hidden_sizes": [8]}, *spaces)
    path = _policy_checkpoint(tmp_path / "p.pt", built["name"], built["kwargs"], policy.state_dict())
    ckpt.load_policy(path, *spaces, policy_kwargs={"trust_pickle": False, "download": None})
    refusal = (
        r"policy_kwargs download=True: the policy of .*p.pt \(policies.categorical:CategoricalPolicy\) "
        r"has no download argument \(of the opt-ins .* it takes none\); leave download out"
    )
    with pytest.raises(ValueError, match=refusal):
        ckpt.load_policy(path, *spaces, policy_kwargs={"download": True})
    with pytest.raises(ValueError, match=refusal):
        ckpt.build_policy("auto", {"download": True}, *spaces, resume=path)
    assert accepted_arguments(CosmosPolicy) & OPT_IN_KEYS == {"download", "trust_pickle"}


def test_a_frozen_bases_opt_ins_come_from_the_callers_base_kwargs(tmp_path):
    """Issue 32: a DSRL / residual checkpoint's base loses its opt-ins like the top level; the
    caller gives them back as ``{"base": {"kwargs": {...}}}``, checked against the base's class."""
    saved = {"max_noise": 1.0, "base": {"name": "cosmos_policy", "kwargs": {"model_path": "m"}}}  # takes both
    given = {"base": {"kwargs": {"trust_pickle": True, "download": None}}}
    found = ckpt.given_opt_ins(given, "dsrl", "ckpt.pt", saved=saved)
    opt_ins = {"model_path": "m", "trust_pickle": True, "download": None}
    assert found == {"base": {"name": "cosmos_policy", "kwargs": opt_ins}}
    saved_flow = {"base": {"name": "flow", "kwargs": {"num_steps": 3}}}
    with pytest.raises(
        ValueError, match=r"trust_pickle=True: the policy of ckpt.pt \(policies.flow:FlowPolicy\)"
    ):
        ckpt.given_opt_ins(given, "dsrl", "ckpt.pt", saved=saved_flow)
    assert (
        ckpt.given_opt_ins({"base": {"kwargs": {"trust_pickle": False}}}, "dsrl", "c", saved=saved_flow) == {}
    )
    with pytest.raises(ValueError, match="has no frozen base to give opt-ins to"):
        ckpt.given_opt_ins(given, "gaussian", "ckpt.pt", saved={"hidden_sizes": [8]})
    # through load_policy: a base without a name carries opt-ins only
    env = gym.make("Pendulum-v1")
    spaces = (env.observation_space, env.action_space)
    flow, built = ckpt.build_policy(
        "flow", {"hidden_sizes": [8], "velocity_hidden": [8], "use_critic": False}, *spaces
    )
    base_path = _policy_checkpoint(tmp_path / "flow.pt", built["name"], built["kwargs"], flow.state_dict())
    dsrl, spec = ckpt.build_policy("dsrl", {"hidden_sizes": [8]}, *spaces, init_policy=base_path)
    path = _policy_checkpoint(tmp_path / "dsrl.pt", spec["name"], spec["kwargs"], dsrl.state_dict())
    with pytest.raises(ValueError, match=r"opt-ins only .* got \['num_steps'\]"):
        ckpt.load_policy(path, *spaces, policy_kwargs={"base": {"kwargs": {"num_steps": 2}}})
    back = ckpt.load_policy(path, *spaces, policy_kwargs={"base": {"kwargs": {"trust_pickle": False}}})
    assert torch.equal(back.base.velocity_out.weight, flow.velocity_out.weight)


def test_dsrl_from_a_checkpoint_takes_additions_to_its_base(tmp_path):
    """``--policy dsrl --init-policy FLOW --policy-kwargs '{"base": {"kwargs": {...}}}'`` adds to
    the checkpoint's base arguments (a ``base`` with a ``name`` replaces it, as before)."""
    env = gym.make("Pendulum-v1")
    spaces = (env.observation_space, env.action_space)
    flow, built = ckpt.build_policy(
        "flow", {"hidden_sizes": [8], "velocity_hidden": [8], "use_critic": False}, *spaces
    )
    path = _policy_checkpoint(tmp_path / "flow.pt", built["name"], built["kwargs"], flow.state_dict())
    extra = {"base": {"kwargs": {"deterministic_init": "zeros"}}}
    dsrl, spec = ckpt.build_policy("dsrl", extra, *spaces, init_policy=path)
    assert dsrl.base.deterministic_init == "zeros" and spec["kwargs"]["base"]["kwargs"]["hidden_sizes"] == [8]
    assert torch.equal(dsrl.base.velocity_out.weight, flow.velocity_out.weight)


def test_a_resumed_dsrl_run_takes_its_frozen_bases_opt_ins_from_the_command(tmp_path):
    """``--resume RUN --policy-kwargs '{"base": {"kwargs": {opt-ins}}}'`` gives the frozen base
    opt-ins (checked against the base's class, as ``load_policy`` does); any other base key is a
    changed setting, refused before anything is written."""
    import json

    from test_trainers_sac import FAST, _flow_checkpoint, sac_train

    _flow_checkpoint(tmp_path / "flow.pt")
    run = str(tmp_path / "run")
    sac_train.main(["--env", "SacReach-v0", "--num-envs", "2", "--total-steps", "20",
                    "--steps-per-iteration", "10", "--learning-starts", "10", "--batch-size", "8",
                    "--policy", "dsrl", "--init-policy", str(tmp_path / "flow.pt"),
                    "--policy-kwargs", '{"hidden_sizes": [8]}', "--critic-hidden-sizes", "[8]",
                    "--eval-every", "-1", "--run-dir", run, *FAST])  # fmt: skip

    def resume(kwargs: dict) -> dict:
        return sac_train.main(
            ["--resume", run, "--total-steps", "40", "--policy-kwargs", json.dumps(kwargs), *FAST]
        )

    assert resume({"base": {"kwargs": {"trust_pickle": False}}})["iteration"] == 2  # asks for nothing
    config = (tmp_path / "run" / "config.json").read_text()
    with pytest.raises(ValueError, match="FlowPolicy\\) has no trust_pickle argument"):
        resume({"base": {"kwargs": {"trust_pickle": True}}})
    with pytest.raises(ValueError, match="the run in .* has policy_kwargs"):
        resume({"base": {"kwargs": {"num_steps": 7}}})
    assert (tmp_path / "run" / "config.json").read_text() == config  # refusals wrote nothing


@pytest.fixture
def evil_module(tmp_path, monkeypatch):
    """A module on sys.path whose import creates a marker file."""
    import sys

    folder = tmp_path / "modules"
    folder.mkdir()
    ran = tmp_path / "imported"
    (folder / "vla_gym_evil.py").write_text(f"open({str(ran)!r}, 'w').close()\nclass Policy: pass\n")
    monkeypatch.syspath_prepend(str(folder))
    yield ran
    sys.modules.pop("vla_gym_evil", None)


def test_a_checkpoints_module_name_is_checked_before_import(tmp_path, evil_module):
    env = gym.make("CartPole-v1")
    spaces = (env.observation_space, env.action_space)
    path = _policy_checkpoint(tmp_path / "p.pt", "vla_gym_evil:Policy", {})
    refusal = r"names the policy 'vla_gym_evil:Policy', which is not one of vla-gym's policies"
    with pytest.raises(ValueError, match=refusal):
        ckpt.load_policy(path, *spaces)
    with pytest.raises(ValueError, match=refusal):
        ckpt.build_policy("auto", {}, *spaces, init_policy=path)
    # a residual policy's base names a class too
    base = {"base": {"name": "vla_gym_evil:Policy", "kwargs": {}}}
    nested = _policy_checkpoint(tmp_path / "r.pt", "residual", base)
    with pytest.raises(ValueError, match=r"base.name: 'vla_gym_evil:Policy' imports a module that is not"):
        ckpt.load_policy(nested, *spaces)
    assert not evil_module.exists()
    # named by the user: imported (and then checked for its type)
    with pytest.raises(ValueError, match="is not an ActionChunkPolicy subclass"):
        ckpt.load_policy(path, *spaces, allow_policies=["vla_gym_evil:Policy"])
    assert evil_module.exists()


def test_resume_config_json_cannot_grant_trust(tmp_path, marker):
    """The issue's case: a run folder whose config.json says trust_pickle for a bundle with a
    payload (and a checkpoint to resume: a resume is checked before any env is built). --resume
    builds the env from it: the opt-in is dropped with a warning, the bundle's resnet_rm.pth is read
    safely and refused."""
    import json

    from trainers.__main__ import main

    root = write_tiny_bundle("cosmos", tmp_path / "bundle")
    plant_payload(root / "resnet_rm.pth", marker)
    run = tmp_path / "run"
    run.mkdir()
    env_kwargs = {"trust_pickle": True, "model_dir": str(root), "image_size": [32, 48]}
    config = {
        "run": {"env": "envs:CosmosWM-LiberoSpatial-v0", "env_kwargs": env_kwargs, "num_envs": 1},
        "ppo": {},
    }
    (run / "config.json").write_text(json.dumps(config))
    ckpt.save_checkpoint(
        run / "checkpoints" / "iter_000001.pt", {"algo": "ppo", "config": config, "optimizer": {}}
    )
    with pytest.warns(RuntimeWarning, match=r"config.json: run.env_kwargs: ignored \{'trust_pickle': True\}"):
        with refused():
            main(["--resume", str(run), "--no-progress", "--no-tensorboard"])


def test_resume_config_json_cannot_name_a_module(tmp_path, evil_module):
    import json

    from trainers.__main__ import main

    run = tmp_path / "run"
    run.mkdir()
    for field, value in (("env", "vla_gym_evil:Env-v0"), ("policy", "vla_gym_evil:Policy")):
        (run / "config.json").write_text(json.dumps({"run": {field: value}, "ppo": {}}))
        with pytest.raises(ValueError, match=rf"run.{field} is '{value}'.*pass --{field} {value}"):
            main(["--resume", str(run)])
    assert not evil_module.exists()


def test_untrusted_settings_keep_what_the_command_line_gives():
    from trainers.config import untrusted_settings

    sections = {"run": {"env_kwargs": {"trust_pickle": True}, "env": "envs:Libero-Spatial-v0", "seed": 3}}
    with pytest.warns(RuntimeWarning):
        assert untrusted_settings(sections, {}, "c.json") == {
            "run": {"env_kwargs": {}, "env": "envs:Libero-Spatial-v0", "seed": 3}
        }
    # flags given again on the command line are the user's: the file's values are not read
    assert untrusted_settings(sections, {"env_kwargs": {"trust_pickle": True}}, "c.json") == {
        "run": {"env": "envs:Libero-Spatial-v0", "seed": 3}
    }


# ---------------------------------------------------------------------- crafted checkpoints
def _raw_checkpoint(path, payload, version=ckpt.VERSION):
    """``payload`` with a checkpoint's tags and a made-up SHA-256, written as it is (no walk)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"format": ckpt.FORMAT, "version": version, **payload, "sha256": "0" * 64}, path)
    return path


def _deep_pickle_checkpoint(path, depth):
    """A real torch zip whose pickle nests lists ``depth`` deep (written opcode by opcode: the
    pickler itself cannot go that deep)."""
    import struct
    import zipfile

    def text(s):
        data = s.encode()
        return b"X" + struct.pack("<I", len(data)) + data

    pickled = (
        b"\x80\x02}("
        + text("format")
        + text(ckpt.FORMAT)
        + text("version")
        + b"K"
        + bytes([ckpt.VERSION])
        + text("sha256")
        + text("0" * 64)
        + text("policy")
        + b"]" * depth
        + b"a" * (depth - 1)
        + b"u."
    )
    template = io.BytesIO()
    torch.save({}, template)
    with zipfile.ZipFile(template) as src, zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as out:
        for info in src.infolist():
            out.writestr(info.filename, pickled if info.filename.endswith("/data.pkl") else src.read(info))
    return path


def test_shared_references_cannot_make_verification_hang(tmp_path):
    import time

    nested = []
    for _ in range(64):  # 2**64 paths through 64 lists
        nested = [nested, nested]
    path = _raw_checkpoint(tmp_path / "iter_000001.pt", {"policy": nested})
    start = time.perf_counter()
    with pytest.raises(ValueError, match="cannot verify the checkpoint's SHA-256: .*shared references"):
        ckpt.load_checkpoint(path)
    # 1.5 s alone here; 13 s once on 2 cores shared with 3 other jobs. A walk of the 2**64 paths
    # would never end, so any generous bound tells the two apart
    assert time.perf_counter() - start < 120


def test_a_view_cannot_expand_past_the_file(tmp_path):
    """A tensor view with stride 0 names 2**40 elements over one stored number."""
    path = _raw_checkpoint(tmp_path / "iter_000001.pt", {"w": torch.zeros(1).expand(2**40)})
    with pytest.raises(ValueError, match="whose elements overlap in memory"):  # refused as it is read
        ckpt.load_checkpoint(path)


@pytest.mark.parametrize("depth", [500, 100_000])
def test_deep_nesting_is_refused_and_falls_back(tmp_path, depth):
    run = tmp_path / "run"
    good = ckpt.save_checkpoint(run / "checkpoints" / "iter_000001.pt", {"counters": {"iteration": 1}})
    deep = _deep_pickle_checkpoint(run / "checkpoints" / "iter_000002.pt", depth)
    with pytest.raises(ValueError, match="nested deeper than"):
        ckpt.load_checkpoint(deep)
    with pytest.warns(RuntimeWarning, match="skipping unreadable checkpoint"):
        path, data = ckpt.latest_checkpoint(run)
    assert path == good and data["counters"] == {"iteration": 1}


def test_a_version_rewritten_to_1_is_refused_unless_allowed(tmp_path):
    run = tmp_path / "run"
    good = _policy_checkpoint(run / "checkpoints" / "iter_000001.pt", "gaussian", {})
    data = ckpt.load_checkpoint(good)
    data.update(version=1, counters={"iteration": 2})  # altered, and the SHA-256 check skipped
    forged = run / "checkpoints" / "iter_000002.pt"
    torch.save(data, forged)
    with pytest.raises(ValueError, match="version-1 checkpoint, which carries no SHA-256"):
        ckpt.load_checkpoint(forged)
    with pytest.warns(RuntimeWarning, match="skipping unreadable checkpoint"):
        assert ckpt.latest_checkpoint(run)[0] == good
    with pytest.raises(ValueError, match="version-1"):
        ckpt.latest_checkpoint(forged)
    assert ckpt.load_checkpoint(forged, allow_unverified=True)["counters"] == {"iteration": 2}
    # a trusted version-1 file is re-saved verified by an explicit export
    ckpt.main([str(forged), str(tmp_path / "verified.pt"), "--allow-unverified"])
    assert ckpt.load_checkpoint(tmp_path / "verified.pt")["version"] == ckpt.VERSION
    with pytest.raises(ValueError, match="version-1"):
        ckpt.main([str(forged), str(tmp_path / "nope.pt")])


@pytest.mark.parametrize("version", ["2", 2.0, True, None])
def test_a_version_of_another_type_is_refused(tmp_path, version):
    path = _raw_checkpoint(tmp_path / "iter_000001.pt", {}, version=version)
    with pytest.raises(ValueError, match="checkpoint version"):
        ckpt.load_checkpoint(path)


def test_readers_refuse_fifos_and_devices_at_once(tmp_path):
    """A FIFO (or a device, a folder) where a file is expected is a ValueError naming it, raised
    before anything opens it: opening a FIFO would wait for a writer forever."""
    import os
    import signal

    from trainers.config import read_json
    from trainers.datasets import load_demos
    from trainers.safe_hdf5 import SafeHDF5

    frames = tmp_path / "frames" / "dataset"
    frames.mkdir(parents=True)
    fifo = frames / "frame_00000.npy"
    os.mkfifo(fifo)
    previous = signal.signal(signal.SIGALRM, lambda *_: pytest.fail("a reader blocked on a FIFO"))
    signal.alarm(30)
    try:
        with pytest.raises(ValueError, match=r"frame_00000.npy is a FIFO \(named pipe\), not a regular file"):
            load_initial_frames(tmp_path / "frames")
        for name in ("config.json", "demos.h5", "ckpt.pt", "embeddings.pkl"):
            os.mkfifo(tmp_path / name)
        with pytest.raises(ValueError, match="config.json is a FIFO"):
            read_json(tmp_path / "config.json")
        with pytest.raises(ValueError, match="demos.h5 is a FIFO"):
            SafeHDF5(tmp_path / "demos.h5")
        with pytest.raises(ValueError, match="demos.h5 is a FIFO"):
            load_demos(tmp_path / "demos.h5")
        with pytest.raises(ValueError, match="ckpt.pt is a FIFO"):
            torch_load(tmp_path / "ckpt.pt")
        with pytest.raises(ValueError, match="embeddings.pkl is a FIFO"):
            restricted_unpickle(tmp_path / "embeddings.pkl")
        with pytest.raises(ValueError, match="/dev/null is a character device"):
            load_npy("/dev/null")
        with pytest.raises(ValueError, match="is a folder, not a regular file"):
            torch_load(tmp_path)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_sizes_a_file_declares_are_checked_before_memory(tmp_path):
    """A 100 KB checkpoint whose saved arguments ask for a 14 GB network, a tensor of a few bytes
    that reads as a million (zero strides), an .npy header declaring 10^12 elements: each refused,
    naming the file, before anything that size is allocated."""
    import resource

    env = gym.make("CartPole-v1")
    spaces = (env.observation_space, env.action_space)
    policy, built = ckpt.build_policy("categorical", {"hidden_sizes": [8]}, *spaces)
    huge = {**built["kwargs"], "hidden_sizes": [60000, 60000]}  # 3.6e9 weights in the middle layer
    path = _policy_checkpoint(tmp_path / "small.pt", built["name"], huge, policy.state_dict())
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(
        ValueError, match=r"small.pt: the saved arguments build .* refused before building it"
    ):
        ckpt.load_policy(path, *spaces)
    with pytest.raises(ValueError, match=r"refused before building it"):
        ckpt.build_policy("auto", {}, *spaces, init_policy=path)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 500_000  # KiB: nothing near 14 GB

    torch.save({"w": torch.zeros(1).expand(1000, 1000)}, tmp_path / "strided.pt")
    with pytest.raises(UnsafeFileError, match=r"strides \(0, 0\), whose elements overlap"):
        torch_load(tmp_path / "strided.pt")
    torch.save({"t": torch.arange(6.0).reshape(2, 3).t(), "s": torch.zeros(4)[1:]}, tmp_path / "views.pt")
    assert torch_load(tmp_path / "views.pt")["t"].shape == (3, 2)  # transposed and offset views load

    np.save(tmp_path / "a.npy", np.zeros(4, np.float32))
    raw = (tmp_path / "a.npy").read_bytes()
    header = raw[:128].replace(b"(4,), }", b"(10**12,),}".replace(b"10**12", b"1000000000000"))
    (tmp_path / "big.npy").write_bytes(header[:127].ljust(127) + b"\n" + raw[128:])
    with pytest.raises(ValueError, match=r"big.npy: its header declares a \(1000000000000,\) float32 array"):
        load_npy(tmp_path / "big.npy")

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


def test_a_torchscript_archive_is_refused(tmp_path):
    """``torch.load`` hands a TorchScript archive to ``torch.jit.load``: refused, not run."""
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), tmp_path / "scripted.pt")
    with pytest.raises(UnsafeFileError, match="TorchScript"):
        torch_load(tmp_path / "scripted.pt")
    with pytest.raises(UnsafeFileError, match="TorchScript"):
        torch_load(io.BytesIO((tmp_path / "scripted.pt").read_bytes()))


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
    with pytest.raises(ValueError, match=r"run/config.json: cannot read the config as JSON"):
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
    from policies.cosmos_policy.checkpoint import load_t5_embeddings
    from policies.cosmos_policy.tiny import write_tiny_cosmos_policy

    folder = write_tiny_cosmos_policy(tmp_path / "ckpt")
    path = folder / "libero_t5_embeddings.pkl"
    assert len(load_t5_embeddings(path)) > 0  # the real format (pickled bf16 tensors) loads
    with open(path, "wb") as f:
        pickle.dump({"pick": Payload(marker)}, f)
    with refused():
        load_t5_embeddings(path)


def test_readme_says_what_is_trusted():
    from pathlib import Path

    text = (Path(__file__).parents[1] / "README.md").read_text()
    assert "trust_pickle=True" in text and "weights_only" in text

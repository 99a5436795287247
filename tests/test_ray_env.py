"""Envs on Ray actors (envs/ray) against the local vector env: same frames and actions give
the same observations, rewards, infos and episode statistics; an actor that is killed, or stopped
past its deadline, is restarted and its envs truncated with worker_restarted (this project's ids and
Ray-v0); bad input (Ray-v0's actions too) is refused before any actor is called. A local Ray cluster
with 2 CPUs."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings

import gymnasium as gym
import numpy as np
import pytest
from conftest import requires_libero

import envs  # noqa: F401
from envs.ray.actors import import_ray
from envs.ray.ray_env import RayVectorEnv
from envs.world_models.tiny import write_tiny_bundle

ray = import_ray()
# Ray gives each 1-CPU actor one torch thread; the local env must sum in the same order to be equal
pytestmark = pytest.mark.usefixtures("one_torch_thread")
MODES = ["NextStep", "SameStep", "Disabled"]
STATE = dict(chunk_size=4, cameras=(), init_states=range(3), max_episode_steps=8)


@pytest.fixture(scope="module", autouse=True)
def local_cluster():
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def assert_same(a, b, where="") -> None:
    """Deep equality of observations / infos: dicts, tuples, arrays (object arrays element-wise)."""
    if isinstance(a, dict):
        assert set(a) == set(b), f"{where}: keys {sorted(a)} != {sorted(b)}"
        for key in a:
            assert_same(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, list | tuple):
        assert type(a) is type(b) and len(a) == len(b), f"{where}: {a!r} != {b!r}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, np.ndarray) and a.dtype == object:
        assert a.shape == b.shape, where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, np.ndarray | np.generic):
        np.testing.assert_array_equal(a, b, err_msg=where)
        assert np.asarray(a).dtype == np.asarray(b).dtype, where
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def run_both(ray_env, local_env, resets, steps, seed=0) -> None:
    """Drive both envs with the same resets and random actions; every return must be equal."""
    rng = np.random.default_rng(seed)
    assert_same(ray_env.reset(seed=seed, options=resets[0]), local_env.reset(seed=seed, options=resets[0]))
    for t in range(steps):
        actions = rng.uniform(-1, 1, ray_env.action_space.shape).astype(np.float32)
        out_ray, out_local = ray_env.step(actions), local_env.step(actions)
        assert_same(out_ray, out_local, f"step {t}")
        if t + 1 < len(resets) and resets[t + 1] is not None:
            options = resets[t + 1]
            assert_same(ray_env.reset(options=options), local_env.reset(options=options), f"reset {t}")
    assert_same(
        [f.__dict__ for f in ray_env.current_frames()], [f.__dict__ for f in local_env.current_frames()]
    )


@requires_libero
@pytest.mark.slow
def test_libero_equals_local():
    """Disabled mode: partial resets by mask, frame ids and InitialFrame objects; a camera. The
    autoreset modes are the driver's own code, the same for every backend: the world-model and
    CartPole tests below run all three (each LIBERO mode cost about 25 s of env builds)."""
    kwargs = dict(STATE, cameras=("agentview",), image_size=32, autoreset_mode="Disabled")
    remote = gym.make_vec("Libero-Spatial-v0", num_envs=3, ray_actors=2, **kwargs)
    local = gym.make_vec("Libero-Spatial-v0", num_envs=3, **kwargs)
    try:
        assert isinstance(remote, RayVectorEnv) and remote.num_actors == 2
        assert remote.single_observation_space == local.single_observation_space
        assert remote.action_space == local.action_space and remote.metadata == local.metadata
        assert len(remote.initial_frames) == len(local.initial_frames) == 30
        # episodes end every 2 steps (8 sub-steps); partial resets by mask, ids and InitialFrame objects
        frame = local.initial_frames[11]
        resets = [{"initial_frames": [0, 4, 7]}, None]
        resets += [{"initial_frames": [2, frame], "reset_mask": np.array([True, False, True])}, None]
        resets += [{"initial_frames": [1, 2, 3]}]
        run_both(remote, local, resets, steps=6)
        np.testing.assert_array_equal(np.stack(remote.render()), np.stack(local.render()))
    finally:
        remote.close()
        local.close()


@pytest.fixture(scope="module")
def cosmos_bundle(tmp_path_factory):
    return write_tiny_bundle("cosmos", tmp_path_factory.mktemp("cosmos"))


def make_world_model(bundle, num_envs, **kwargs):
    kwargs = {"image_size": (32, 48), "model_options": {"num_steps": 2}, "max_episode_steps": 16, **kwargs}
    return gym.make_vec("CosmosWM-LiberoSpatial-v0", num_envs=num_envs, model_dir=bundle, **kwargs)


@pytest.mark.slow
def test_world_model_one_actor_equals_local(cosmos_bundle):
    """One actor: its noise is seeded exactly as the local env's (the autoreset modes are the
    driver's own code: the CartPole tests below run all three)."""
    remote = make_world_model(cosmos_bundle, 2, ray_actors=1, autoreset_mode="NextStep")
    local = make_world_model(cosmos_bundle, 2, autoreset_mode="NextStep")
    try:
        run_both(remote, local, [{"initial_frames": [0, 1]}], steps=4)
    finally:
        remote.close()
        local.close()


@pytest.mark.slow
def test_world_model_two_actors_equal_two_local_envs(cosmos_bundle):
    """Actor j's noise follows seed + j: two actors are two local envs seeded 5 and 6, side by side."""
    remote = make_world_model(cosmos_bundle, 4, ray_actors=2, autoreset_mode="Disabled")
    halves = [make_world_model(cosmos_bundle, 2, autoreset_mode="Disabled") for _ in range(2)]
    try:
        frames = [0, 1, 2, 3]
        obs, _ = remote.reset(seed=5, options={"initial_frames": frames})
        parts = [
            h.reset(seed=5 + j, options={"initial_frames": frames[2 * j : 2 * j + 2]})
            for j, h in enumerate(halves)
        ]
        np.testing.assert_array_equal(obs["image"], np.concatenate([p[0]["image"] for p in parts]))
        actions = np.random.default_rng(1).uniform(-1, 1, remote.action_space.shape).astype(np.float32)
        _, reward, _, _, info = remote.step(actions)
        local = [h.step(actions[2 * j : 2 * j + 2]) for j, h in enumerate(halves)]
        np.testing.assert_array_equal(reward, np.concatenate([out[1] for out in local]))
        np.testing.assert_array_equal(
            info["reward_model_scores"], np.concatenate([out[4]["reward_model_scores"] for out in local])
        )
        assert remote.call("offload") == [None, None]  # a backend method on every actor
    finally:
        remote.close()
        for h in halves:
            h.close()


@pytest.mark.slow
def test_a_failed_reset_loses_only_the_envs_it_reset(cosmos_bundle):
    """A reset that raises in an actor leaves its envs lost (truncated with worker_restarted at the
    next step); the actor's other envs and the other actors go on."""
    env = make_world_model(cosmos_bundle, 4, ray_actors=2, autoreset_mode="Disabled", max_episode_steps=64)
    try:
        env.reset(seed=0, options={"initial_frames": [0, 1, 2, 3]})
        ray.get(env._hosts[0].set_attr.remote("_seed_backend", None))  # actor 0's next seeded reset raises
        first = np.array([True, False, False, False])
        with pytest.raises(TypeError):
            env.reset(seed=1, options={"reset_mask": first, "initial_frames": [2]})
        zeros = np.zeros(env.action_space.shape, np.float32)
        _, _, terminated, truncated, info = env.step(zeros)
        assert truncated.tolist() == first.tolist() and not terminated.any()
        assert info["worker_restarted"].tolist() == first.tolist()
        assert info["chunk_valid"][1:].all() and not info["chunk_valid"][0].any()  # env 1 (actor 0) ran
        env.reset(options={"reset_mask": first, "initial_frames": [2]})  # unseeded: works, env 0 is back
        _, _, _, truncated, info = env.step(zeros)
        assert not truncated.any() and info["chunk_valid"].all()
    finally:
        env.close()


@requires_libero
@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGKILL", "SIGSTOP"])
def test_killed_actor_is_restarted_and_its_envs_truncated(how):
    """LIBERO on 2 actors: a killed actor, or one stopped with SIGSTOP (the step returns at the
    driver's deadline: LIBERO's step_timeout_s=3 plus 10 s), is restarted and its envs truncated."""
    kwargs = dict(STATE, max_episode_steps=100, autoreset_mode="NextStep", step_timeout_s=3.0)
    env = gym.make_vec("Libero-Spatial-v0", num_envs=2, ray_actors=2, **kwargs)
    assert env.step_timeout_s == 13.0
    old = env.actor_pids()
    try:
        env.reset(seed=0, options={"initial_frames": [0, 1]})
        zeros = np.zeros(env.action_space.shape, np.float32)
        env.step(zeros)
        os.kill(old[1], getattr(signal, how))
        began = time.monotonic()
        what = "(died|became unavailable)" if how == "SIGKILL" else "did not answer within 13 s"
        with pytest.warns(RuntimeWarning, match=f"Ray actor 1 .* {what} .*during step"):
            _, _, terminated, truncated, info = env.step(zeros)
        assert time.monotonic() - began < 13.0 + 10.0
        assert truncated.tolist() == [False, True] and not terminated.any()
        assert info["worker_restarted"].tolist() == [False, True]
        assert info["_episode"].tolist() == [False, True]
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the next steps run normally: no more warnings
            _, _, _, truncated, info = env.step(zeros)  # NEXT_STEP: env 1 starts again, on the new actor
            assert info["_initial_frame_id"].tolist() == [False, True] and not truncated.any()
            env.step(zeros)
        new = env.actor_pids()
        assert new[0] == old[0] and new[1] != old[1]
    finally:
        resume(old[1])
        env.close()


# ---------------------------------------------------------------------- lost actors: died, killed, stopped
COUNTING = "tests.counting_env:CountingVectorEnv"
FAR = 4  # the counting env's frame walking 20 cells: no episode ends in these tests


def stop(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)


def resume(pid: int) -> None:
    """SIGCONT for a stopped actor process that Ray may not have killed yet (a failed test)."""
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


def kill(env, j: int) -> int:
    """``ray.kill`` actor j (Ray restarts it) and wait until its process is gone; its pid."""
    pid = env.actor_pids()[j]
    ray.kill(env.unwrapped.actors.hosts[j], no_restart=False)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return pid
        except FileNotFoundError:
            return pid
        time.sleep(0.1)
    raise AssertionError(f"actor process {pid} still there")


def test_stopped_actor_is_killed_restarted_and_its_envs_truncated_within_the_deadline():
    """The local workers' promise on Ray: an actor that does not answer a step within its deadline
    (stopped with SIGSTOP) is killed and restarted; the step returns at the deadline with its envs
    truncated (worker_restarted) and the other actor's results; the next steps work."""
    kwargs = {"autoreset_mode": "NextStep", "chunk_size": 2}  # 2 cells a step, 10 at most
    env = RayVectorEnv(COUNTING, 3, num_actors=2, step_timeout_s=3.0, env_kwargs=kwargs)
    ones = np.ones(env.action_space.shape, np.float32)
    pids = env.actor_pids()
    try:
        obs, _ = env.reset(seed=0, options={"initial_frames": [FAR] * 3})
        env.step(ones)  # every env at cell 2
        stop(pids[0])
        began = time.monotonic()
        with pytest.warns(
            RuntimeWarning, match=r"Ray actor 0 \(envs 0-1\) did not answer within 3 s .*during step"
        ):
            obs, rewards, terminated, truncated, info = env.step(ones)
        assert time.monotonic() - began < 3.0 + 5.0  # the deadline, not the restart
        assert truncated.tolist() == [True, True, False] and not terminated.any()
        assert info["worker_restarted"].tolist() == [True, True, False]
        assert info["_episode"].tolist() == [True, True, False]
        assert obs["proprio"][:, 0].tolist() == [2, 2, 4]  # lost envs keep their last obs; env 2 walked on
        assert info["chunk_valid"].tolist() == [[False] * 2, [False] * 2, [True] * 2]
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the next steps run normally: no more warnings
            _, _, _, truncated, info = env.step(ones)  # NextStep: envs 0 and 1 start again, on the new actor
            assert info["_initial_frame_id"].tolist() == [True, True, False] and not truncated.any()
            obs, *_, info = env.step(ones)
        assert info["chunk_valid"].all() and obs["proprio"][:, 0].tolist() == [2, 2, 8]
        new = env.actor_pids()
        assert new[0] != pids[0] and new[1] == pids[1]
    finally:
        resume(pids[0])
        env.close()


def test_actor_killed_with_ray_kill_is_restarted_and_its_envs_truncated():
    """ray.kill on an actor: the step reports its envs lost (Disabled: they wait for a reset)."""
    kwargs = {"autoreset_mode": "Disabled", "chunk_size": 2}
    env = RayVectorEnv(COUNTING, 3, num_actors=2, step_timeout_s=10.0, env_kwargs=kwargs)
    ones = np.ones(env.action_space.shape, np.float32)
    try:
        env.reset(seed=0, options={"initial_frames": [FAR] * 3})
        old = env.actor_pids()
        kill(env, 1)  # Ray restarts it: the fresh actor refuses the step (FreshActor)
        with pytest.warns(RuntimeWarning, match=r"Ray actor 1 \(envs 2-2\) .* during step"):
            obs, _, terminated, truncated, info = env.step(ones)
        assert truncated.tolist() == [False, False, True] and not terminated.any()
        assert info["worker_restarted"].tolist() == [False, False, True]
        assert obs["proprio"][:, 0].tolist() == [2, 2, 0]
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            obs, *_, info = env.step(ones)  # Disabled: env 2 stays ended until it is reset
            assert not info["chunk_valid"][2].any() and obs["proprio"][:, 0].tolist() == [4, 4, 0]
            env.reset(options={"reset_mask": np.array([False, False, True]), "initial_frames": [FAR]})
            obs, *_, info = env.step(ones)
        assert info["chunk_valid"].all() and obs["proprio"][:, 0].tolist() == [6, 6, 2]
        new = env.actor_pids()
        assert new[0] == old[0] and new[1] != old[1]
    finally:
        env.close()


def test_deadlines_follow_the_backends_own():
    """By default the driver allows the backend's own deadline (LIBERO's step_timeout_s for its
    workers) plus half of it; without one, 120 s for a step and 600 s for the rest."""
    from envs.ray.ray_env import _deadline

    assert _deadline(10.0, 120.0, 10.0) == 20.0 and _deadline(24.0, 120.0, 10.0) == 36.0
    assert _deadline(None, 120.0, 10.0) == 120.0
    with pytest.raises(ValueError, match="ray_step_timeout_s"):
        gym.make_vec("Libero-Spatial-v0", num_envs=1, ray_actors=1, ray_step_timeout_s=0)


@pytest.mark.slow
def test_bad_input_is_refused_before_any_actor_is_called(cosmos_bundle):
    env = make_world_model(cosmos_bundle, 2, ray_actors=2, autoreset_mode="Disabled")
    try:
        obs, _ = env.reset(seed=0, options={"initial_frames": [0, 1]})
        for bad in (np.zeros((2, 8, 6), np.float32), np.full((2, 8, 7), np.nan, np.float32)):
            with pytest.raises(ValueError, match="CosmosWM-LiberoSpatial-v0: bad actions"):
                env.step(bad)
        with pytest.raises(ValueError, match="initial frame id"):
            env.reset(options={"initial_frames": [0, 10_000]})
        with pytest.raises(ValueError, match="a frame with an image"):  # the backend's check, one call
            env.reset(options={"initial_frames": [0, envs.InitialFrame(instruction="x", task="t")]})
        with pytest.raises(ValueError, match="reset option"):
            env.reset(options={"initial_frame": [0, 1]})
        with pytest.raises(ValueError, match=r"bad seed: expected an int in \[0, 2\*\*64 - 2\]"):
            env.reset(seed=2**64 - 1)  # actor 1 would be seeded with 2**64: no torch generator takes it
        assert_same(env.current_frames()[0].__dict__, env.current_frames()[0].__dict__)
        np.testing.assert_array_equal(env._obs["image"], obs["image"])  # nothing moved
    finally:
        env.close()
    with pytest.raises(envs.ClosedEnvError):
        env.step(np.zeros(env.action_space.shape, np.float32))


# ---------------------------------------------------------------------- get_state / load_state
def steps(env, actions) -> list:
    return [env.step(a) for a in actions]


@pytest.mark.slow
def test_world_model_state_round_trip_through_actors(cosmos_bundle):
    """3 envs over 2 actors (2 + 1): after load_state, the same env and a fresh one built with the
    same settings replay the saved continuation exactly: observations, rewards, infos, episode
    statistics and the initial frames autoreset draws (episodes end every 2 steps)."""
    kwargs = dict(ray_actors=2, autoreset_mode="NextStep")
    actions = np.random.default_rng(3).uniform(-1, 1, (7, 3, 8, 7)).astype(np.float32)
    env = make_world_model(cosmos_bundle, 3, **kwargs)
    try:
        env.reset(seed=7)
        steps(env, actions[:3])  # the first episodes ended at step 2 and restarted at step 3
        saved = env.get_state()
        first = steps(env, actions[3:])
        assert any("episode" in out[4] for out in first) and any(
            "initial_frame_id" in out[4] for out in first
        )
        env.load_state(saved)
        assert env.get_state() == saved
        assert_same(steps(env, actions[3:]), first, "same env")
    finally:
        env.close()
    fresh = make_world_model(cosmos_bundle, 3, **kwargs)
    try:
        fresh.load_state(saved)  # no reset needed: the state holds the episodes
        assert_same(steps(fresh, actions[3:]), first, "fresh env")
    finally:
        fresh.close()


@pytest.mark.slow
def test_bad_state_is_refused_and_changes_nothing(cosmos_bundle):
    """Wrong type, garbage, a state of another split or of a local env, a state whose second actor's
    part does not load (the first actor's loads and is rolled back): a ValueError naming the env,
    and the env goes on exactly as if load_state had not been called."""
    import io

    import torch

    from nets.safe_load import UnsafeFileError, torch_load

    other = make_world_model(cosmos_bundle, 2, ray_actors=2)  # 2 envs over 2 actors (1 + 1)
    try:
        other.reset(seed=0)
        other_split = other.get_state()
    finally:
        other.close()
    local = make_world_model(cosmos_bundle, 3)
    local.reset(seed=0)
    local_state = local.get_state()
    local.close()

    actions = np.random.default_rng(4).uniform(-1, 1, (4, 3, 8, 7)).astype(np.float32)
    env = make_world_model(cosmos_bundle, 3, ray_actors=2, autoreset_mode="NextStep")
    try:
        env.reset(seed=1)
        env.step(actions[0])
        old = env.get_state()
        env.step(actions[1])
        now = env.get_state()
        undisturbed = steps(env, actions[2:])
        env.load_state(now)

        state = torch_load(io.BytesIO(old), numpy=True, allow=[envs.InitialFrame])
        state["actors"][1] = torch.frombuffer(bytearray(b"junk"), dtype=torch.uint8)
        half_good = io.BytesIO()
        torch.save(state, half_good)
        state = torch_load(io.BytesIO(old), numpy=True, allow=[envs.InitialFrame])
        state["episode"]["_frame_ids"][0] = 10_000
        bad_id = io.BytesIO()
        torch.save(state, bad_id)
        payload = io.BytesIO()
        # a callable (eval: print may be Ray's tqdm-safe print once Ray ran): refused unread
        torch.save({"kind": "RayVectorEnv", "episode": eval}, payload)
        cases = [
            ("state", "received str"),
            (None, "received NoneType"),
            (b"junk", "unreadable"),
            (other_split, r"3 envs over 2 actors of sizes \[2, 1\], received actor sizes \[1, 1\]"),
            (local_state, "a local env's state"),
            (half_good.getvalue(), "actor 1's part does not load .*unreadable.*nothing was loaded"),
            (bad_id.getvalue(), r"\['episode'\]\['_frame_ids'\]: expected ints in \[-1, 4\)"),
        ]
        for data, match in cases:
            with pytest.raises(ValueError, match="CosmosWM-LiberoSpatial-v0: bad state.*" + match):
                env.load_state(data)
        refused = "refused to load: the file asks for the global '(builtins.)?eval'"
        with pytest.raises(UnsafeFileError, match=refused):
            env.load_state(payload.getvalue())
        assert env.get_state() == now
        assert_same(steps(env, actions[2:]), undisturbed)
    finally:
        env.close()


def test_backend_without_state_says_it_cannot_save():
    """The counting env (tests/counting_env.py) has no get_state, as LIBERO and B1K have none."""
    env = RayVectorEnv("tests.counting_env:CountingVectorEnv", 2, num_actors=2)
    try:
        env.reset(seed=0)
        for call, args in (("get_state", ()), ("load_state", (b"",))):
            match = rf"Counting-v0: {call}\(\) .*tests\.counting_env\.CountingVectorEnv cannot save its state"
            with pytest.raises(NotImplementedError, match=match):
                getattr(env, call)(*args)
        *_, info = env.step(np.ones(env.action_space.shape, np.float32))
        assert info["chunk_valid"].any(1).all()  # still usable
    finally:
        env.close()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"ray_actors": 3}, "at most num_envs=2 actors"),
        ({"ray_actors": 0}, "ray_actors"),
        ({"ray_actors": 1, "ray_options": {"num_gpus": 1}}, "cannot meet 1 actors of .*GPU"),
        ({"ray_actors": 2, "ray_options": {"num_cpus": 2}}, "cannot meet 2 actors"),
        ({"ray_actors": 1, "ray_options": {"cpus": 1}}, "ray_options"),
        ({"ray_actors": 1, "ray_placement": "tight"}, "ray_placement"),
        ({"ray_options": {"num_cpus": 1}}, "need ray_actors"),
        pytest.param(  # the backend's own check, from the actor
            {"ray_actors": 1, "image_size": -3}, "image_size", marks=pytest.mark.slow
        ),
    ],
)
def test_bad_arguments_give_clear_errors(cosmos_bundle, kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_world_model(cosmos_bundle, 2, **kwargs)


def test_unanswering_address_and_missing_ray_give_clear_errors():
    code = (
        "import gymnasium as gym, envs\n"
        "try:\n"
        "    gym.make_vec('Libero-Spatial-v0', num_envs=1, ray_actors=1, ray_address='127.0.0.1:9')\n"
        "except ConnectionError as e:\n"
        "    print('refused:', e)\n"
        "import sys; sys.modules['ray'] = None\n"
        "try:\n"
        "    gym.make_vec('Libero-Spatial-v0', num_envs=1, ray_actors=1)\n"
        "except ImportError as e:\n"
        "    print('missing:', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "refused: Libero-Spatial-v0: no Ray cluster answers at '127.0.0.1:9'" in out.stdout, out.stderr
    missing = "missing: ray_actors asks for envs on Ray actors, which need Ray: pip install"
    assert missing in out.stdout, out.stderr


@pytest.mark.slow
def test_joins_a_cluster_started_with_ray_start():
    """The multi-node recipe on one node: `ray start --head`, then envs placed by its address (CartPole
    through Ray-v0: joining is the same for every backend, and LIBERO on actors is tested above)."""
    port = 6391
    temp = tempfile.mkdtemp(prefix="vgr", dir="/tmp")  # short (socket paths) and its own: no stale
    head = subprocess.Popen(  # "current cluster" file in /tmp/ray once the head is stopped
        [os.path.join(os.path.dirname(sys.executable), "ray"), "start", "--head", "--block",
         f"--port={port}", "--num-cpus=2", "--include-dashboard=false", f"--temp-dir={temp}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    code = (
        "import numpy as np, gymnasium as gym, envs\n"
        "env = gym.make_vec('Ray-v0', num_envs=3, env='CartPole-v1', ray_actors=2,\n"
        f"                   ray_address='127.0.0.1:{port}')\n"
        "obs, _ = env.reset(seed=0)\n"
        "env.step(np.zeros(3, np.int64))\n"
        "print('actors', len(set(env.actor_pids())), 'obs', obs.shape)\n"
        "env.close()\n"
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the head's port opens once it is up
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.5)
        env = {**os.environ, "RAY_AUTH_MODE": "token"}  # `ray start` (Ray 2.60) issues a token
        run = [sys.executable, "-c", code]
        out = subprocess.run(run, capture_output=True, text=True, timeout=180, env=env)
        assert "actors 2 obs (3, 4)" in out.stdout, out.stderr[-2000:]
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        head.wait(timeout=60)
        shutil.rmtree(temp, ignore_errors=True)


# ---------------------------------------------------------------------- any gymnasium id: "Ray-v0"
@pytest.mark.parametrize("mode", MODES)
def test_any_gymnasium_id_on_ray_actors_equals_its_local_vector_env(mode):
    """CartPole over 2 actors (2 + 1 envs) against gymnasium's own sync vector env: same seeds
    (actor j gets seed + its first env), so the same observations, rewards, flags and infos."""
    remote = gym.make_vec("Ray-v0", num_envs=3, env="CartPole-v1", ray_actors=2, autoreset_mode=mode)
    local = gym.make_vec("CartPole-v1", 3, vectorization_mode="sync", vector_kwargs={"autoreset_mode": mode})
    try:
        assert remote.single_observation_space == local.single_observation_space
        assert remote.metadata["autoreset_mode"] == local.metadata["autoreset_mode"]
        assert_same(remote.reset(seed=4), local.reset(seed=4))
        rng = np.random.default_rng(0)
        ended = 0
        for t in range(40):
            actions = rng.integers(0, 2, 3)
            out = remote.step(actions)
            assert_same(out, local.step(actions), f"step {t}")
            done = out[2] | out[3]
            ended += int(done.sum())
            if mode == "Disabled" and done.any():
                options = {"reset_mask": done}
                assert_same(remote.reset(options=options), local.reset(options=options), f"reset {t}")
        assert ended > 0  # episodes ended, so autoreset (or the masked reset) was exercised
    finally:
        remote.close()
        local.close()


def test_ray_v0_stopped_actor_truncates_its_envs_within_the_deadline():
    """Ray-v0 as this project's ids: a stopped actor's envs are truncated with worker_restarted at
    the deadline (NextStep: last obs now, a new episode at the next step, reward 0 there)."""
    env = gym.make_vec("Ray-v0", num_envs=3, env="CartPole-v1", ray_actors=2, ray_step_timeout_s=3.0)
    zeros = np.zeros(3, np.int64)
    pids = env.actor_pids()
    try:
        env.reset(seed=0)
        last, *_ = env.step(zeros)
        stop(pids[1])
        began = time.monotonic()
        with pytest.warns(RuntimeWarning, match=r"Ray actor 1 \(envs 2-2\) did not answer within 3 s"):
            obs, rewards, terminated, truncated, info = env.step(zeros)
        assert time.monotonic() - began < 3.0 + 5.0
        assert truncated.tolist() == [False, False, True] and not terminated.any()
        assert info["worker_restarted"].tolist() == [False, False, True] and info["_worker_restarted"][2]
        assert rewards.tolist() == [1.0, 1.0, 0.0]
        np.testing.assert_array_equal(obs[2], last[2])  # its last observation
        assert not np.array_equal(obs[:2], last[:2])
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            obs, rewards, _, truncated, _ = env.step(zeros)  # env 2 starts again: reward 0, action ignored
            assert rewards.tolist() == [1.0, 1.0, 0.0] and not truncated.any()
            assert np.abs(obs[2]).max() <= 0.05  # CartPole's first observations
            obs, rewards, *_ = env.step(zeros)
        assert rewards.tolist() == [1.0, 1.0, 1.0]
        assert env.actor_pids()[1] != pids[1]
    finally:
        resume(pids[1])
        env.close()


@pytest.mark.parametrize("mode", ["SameStep", "Disabled"])
def test_ray_v0_killed_actor_truncates_its_envs(mode):
    """SameStep: the lost envs' new episode starts at once (final_obs their last obs, worker_restarted
    in final_info too); Disabled: they must be reset first, as gymnasium requires after an end."""
    env = gym.make_vec("Ray-v0", num_envs=3, env="CartPole-v1", ray_actors=2, autoreset_mode=mode)
    zeros = np.zeros(3, np.int64)
    try:
        env.reset(seed=0)
        last, *_ = env.step(zeros)
        kill(env, 0)
        with pytest.warns(RuntimeWarning, match=r"Ray actor 0 \(envs 0-1\) .* during step"):
            obs, rewards, terminated, truncated, info = env.step(zeros)
        assert truncated.tolist() == [True, True, False] and not terminated.any()
        assert info["worker_restarted"].tolist() == [True, True, False]
        assert rewards.tolist() == [0.0, 0.0, 1.0]
        if mode == "SameStep":
            assert info["_final_obs"].tolist() == [True, True, False]
            np.testing.assert_array_equal(np.stack(info["final_obs"][:2]), last[:2])
            assert info["final_info"]["worker_restarted"].tolist() == [True, True, False]
            assert np.abs(obs[:2]).max() <= 0.05  # their new episodes' first observations
        else:
            np.testing.assert_array_equal(obs[:2], last[:2])
            with pytest.raises(ValueError, match=r"envs \[0, 1\] have ended .* reset them"):
                env.step(zeros)
            env.reset(options={"reset_mask": truncated})
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            _, rewards, _, truncated, _ = env.step(zeros)
        assert rewards.tolist() == [1.0, 1.0, 1.0] and not truncated.any()
    finally:
        env.close()


def test_ray_v0_checks_actions_before_any_actor_is_called(monkeypatch):
    """Shape, dtype, range and NaN are refused here with a ValueError naming the env; Box actions
    are clipped to the bounds, as this project's envs do."""
    cart = gym.make_vec("Ray-v0", num_envs=2, env="CartPole-v1", ray_actors=1)
    pendulum = gym.make_vec("Ray-v0", num_envs=2, env="Pendulum-v1", ray_actors=1)
    try:
        cart.reset(seed=0)
        pendulum.reset(seed=0)

        def no_actor(j):
            raise AssertionError("an actor was called")

        for env in (cart, pendulum):
            monkeypatch.setattr(env.unwrapped.actors, "host", no_actor)
        bad = {
            r"shape \(2,\) \(one action per env\), received array of shape \(3,\)": (cart, np.zeros(3, int)),
            r"values in \[0, 1\], received 2 at index \[1\]": (cart, np.array([0, 2])),
            r"an integer array for Discrete\(2\)": (cart, np.zeros(2, np.float32)),
            r"shape \(2, 1\)": (pendulum, np.zeros(2, np.float32)),
            r"finite values, received NaN/inf at index \[1, 0\]": (pendulum, np.array([[0.0], [np.nan]])),
            r"a float array \(float32\)": (pendulum, np.array([["a"], ["b"]])),
        }
        for match, (env, actions) in bad.items():
            with pytest.raises(ValueError, match=rf"bad actions: expected {match}"):
                env.step(actions)
        monkeypatch.undo()
        assert cart.step(np.array([0, 1]))[1].tolist() == [1.0, 1.0]  # still usable
        clipped = pendulum.unwrapped._check_actions(np.array([[5.0], [-0.5]]))
        assert clipped.dtype == np.float32 and clipped.tolist() == [[2.0], [-0.5]]
        pendulum.step(np.array([[5.0], [-0.5]]))
    finally:
        cart.close()
        pendulum.close()


def test_trainer_runs_any_gymnasium_id_on_ray_actors(tmp_path):
    """Ray-v0 has gymnasium's vector-env semantics (DISABLED: a finished env must be reset before it
    is stepped again), so the trainers run it in SAME_STEP, as for gymnasium's own vector envs."""
    import json

    from trainers.ppo import train as ppo_train

    args = [
        "--env", "envs:Ray-v0", "--env-kwargs", json.dumps({"env": "CartPole-v1", "ray_actors": 2}),
        "--num-envs", "4", "--total-steps", "256", "--n-steps", "32", "--eval-episodes", "2",
        "--autoreset-mode", "same_step", "--no-video",
        "--run-dir", str(tmp_path), "--no-progress", "--torch-threads", "1",
    ]  # fmt: skip
    final = ppo_train.main(args)
    assert final["iteration"] == 2 and np.isfinite(final["eval/return"])


@pytest.mark.parametrize("loop", ["sync", "async"])
def test_sac_runs_on_ray_actors(tmp_path, loop):
    """SAC reaches Ray actors as PPO does, through the env id (the trainers never import envs); in the
    async loop the actor process makes the Ray env."""
    import json

    from trainers.sac import train as sac_train

    args = [
        "--env", "envs:Ray-v0", "--env-kwargs", json.dumps({"env": "Pendulum-v1", "ray_actors": 2}),
        "--num-envs", "2", "--total-steps", "64", "--steps-per-iteration", "16", "--learning-starts", "16",
        "--batch-size", "16", "--eval-episodes", "2", "--autoreset-mode", "same_step", "--no-video",
        "--policy-kwargs", '{"hidden_sizes": [16]}', "--critic-hidden-sizes", "[16]",
        "--run-dir", str(tmp_path), "--no-progress", "--torch-threads", "1", "--loop", loop,
    ]  # fmt: skip
    final = sac_train.main(args)
    assert final["iteration"] == 2 and np.isfinite(final["eval/return"]) and final["train/buffer_size"] == 64

"""How vla-gym takes bad input, faults, untrusted files, damaged checkpoints, run folders, dataset
files that declare sizes or paths they do not hold, and files cut short or of the wrong shape: cases
tried and handled as README promises, per category, as one table.

    python -m benchmarks.robustness                         # every category (~3 min on 2 cores)
    python -m benchmarks.robustness --categories checkpoints "untrusted files"

A case is handled when the promise holds: bad input raises a ``ValueError`` that names the
parameter; a file that asks to run code raises ``UnsafeFileError`` and the code never runs; a closed
env raises ``ClosedEnvError``; a failed worker or Ray actor is detected (a stopped one within its
deadline), its envs truncated with ``worker_restarted`` and reset later; a damaged checkpoint is
refused or skipped for the one before it, never loaded wrong; a run folder is left as it was by a
refused start, holds whole files only, one run at a time, and is never written through a link; a
dataset file that declares sizes or paths it does not hold is refused with a ``ValueError`` naming
the file, before anything large is allocated or anything outside it is read; a file cut short or of
the wrong shape is a ``ValueError`` naming it, what was expected and what came, and a reward model of
NaN weights is neither trained from nor written. Each failing case is printed with what happened
instead.
(Every case is also a test under ``tests/``; this script keeps the figures re-measurable.)
"""

from __future__ import annotations

import argparse
import io
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.report import table, write_json
from nets.errors import BadInput, program_name, run_cli


class Payload:
    """Unpickling this creates ``marker``: a harmless stand-in for an attacker's code."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple:
        return (open, (self.marker, "w"))


def raises(exc: type[BaseException], *words: str) -> Callable[[Callable[[], Any]], None]:
    """A check: the call must raise ``exc`` whose message contains every one of ``words``."""

    def check(call: Callable[[], Any]) -> None:
        try:
            call()
        except exc as e:
            missing = [w for w in words if w not in str(e)]
            if missing:
                raise AssertionError(f"{type(e).__name__} without {missing}: {str(e)[:200]}") from None
            return
        except Exception as e:  # the wrong kind of error
            raise AssertionError(f"{type(e).__name__} instead of {exc.__name__}: {str(e)[:200]}") from None
        raise AssertionError(f"no error (expected {exc.__name__})")

    return check


class Probe:
    """The shared pieces the cases use, built once: a scratch folder, envs, a tiny bundle."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.marker = root / "payload_ran"
        self._libero = None
        self._bundle = None
        self._state_env: tuple[Any, bytes] | None = None  # a world model after reset, and its state

    def libero(self, **kwargs: Any) -> Any:
        import gymnasium as gym

        import envs  # noqa: F401

        kw = {"num_envs": 2, "cameras": [], "chunk_size": 4, "autoreset_mode": "Disabled", **kwargs}
        return gym.make_vec("Libero-Spatial-v0", **kw)

    @property
    def shared_libero(self) -> Any:
        if self._libero is None:
            self._libero = self.libero()
        return self._libero

    @property
    def bundle(self) -> Path:
        if self._bundle is None:
            from envs.world_models.tiny import write_tiny_bundle

            self._bundle = write_tiny_bundle("cosmos", self.root / "bundle")
        return self._bundle

    def world_model(self, bundle: Path | None = None, **kwargs: Any) -> Any:
        import gymnasium as gym

        import envs  # noqa: F401

        kwargs = {"num_envs": 1, "image_size": (32, 48), **kwargs}
        return gym.make_vec("CosmosWM-LiberoSpatial-v0", model_dir=bundle or self.bundle, **kwargs)

    def close(self) -> None:
        if self._libero is not None:
            self._libero.close()
        if self._state_env is not None:
            self._state_env[0].close()


# ---------------------------------------------------------------------- untrusted files
def _refused(probe: Probe, call: Callable[[], Any]) -> None:
    from nets.safe_load import UnsafeFileError

    raises(UnsafeFileError, "refused to load")(call)
    if probe.marker.exists():
        raise AssertionError("the payload ran")


def crafted_checkpoint(path: Path, marker: Path) -> Path:
    """A file at ``path`` with every tag of a trainer checkpoint and a payload where the policy's
    arguments go."""
    import torch

    import trainers.checkpoint as ckpt

    path.parent.mkdir(parents=True, exist_ok=True)
    spec = {"name": "mlp", "kwargs": {"hidden": Payload(marker)}}
    torch.save({"format": ckpt.FORMAT, "version": ckpt.VERSION, "policy": spec, "counters": {}}, path)
    return path


def plant_payload(path: Path, marker: Path) -> None:
    """Rewrite a real ``.npy`` frame record (its ``meta``) or ``torch.save`` dict (its first entry)
    with a payload inside: what an attacker would publish. The file is read safely first."""
    import torch

    from nets.safe_load import load_npy, torch_load

    if path.suffix == ".npy":
        record = load_npy(path)
        record[0]["meta"] = {"x": Payload(marker)}
        np.save(path, record, allow_pickle=True)
    else:
        data = torch_load(path, numpy=True, allow=[io.BytesIO, bytes])  # TE extra state in DiT files
        data[next(iter(data))] = Payload(marker)
        torch.save(data, path)


def _crafted_checkpoint(probe: Probe) -> Path:
    return crafted_checkpoint(probe.root / "crafted" / "checkpoints" / "iter_000001.pt", probe.marker)


def _cartpole_spaces() -> tuple[Any, Any]:
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    return env.observation_space, env.action_space


def _bundle_with_payload(probe: Probe, rel: str) -> Path:
    import shutil

    root = probe.root / f"bad-{rel.replace('/', '-')}"
    if not root.exists():
        shutil.copytree(probe.bundle, root)
    plant_payload(root / rel, probe.marker)
    return root


def untrusted_files(probe: Probe) -> dict[str, Callable[[], None]]:
    import torch

    import trainers.checkpoint as ckpt
    from envs.core.frames import InitialFrame, load_initial_frames, save_initial_frames

    def resume() -> None:
        from trainers.__main__ import main

        path = _crafted_checkpoint(probe)
        _refused(
            probe,
            lambda: main(["--env", "CartPole-v1", "--resume", str(path.parent.parent), "--no-progress"]),
        )

    def frames() -> None:
        folder = save_initial_frames(
            [InitialFrame("pick", image=np.zeros((4, 4, 3), np.uint8))], probe.root / "f"
        )
        plant_payload(folder / "frame_00000.npy", probe.marker)
        _refused(probe, lambda: load_initial_frames(folder))

    def load_state() -> None:
        env = probe.world_model()
        env.reset(seed=0)
        buffer = io.BytesIO()
        torch.save({"episode": Payload(probe.marker)}, buffer)
        _refused(probe, lambda: env.unwrapped.load_state(buffer.getvalue()))
        env.close()

    def t5() -> None:
        from policies.cosmos_policy.checkpoint import load_text_embeddings

        path = probe.root / "t5_embeddings.pkl"
        with open(path, "wb") as f:
            pickle.dump({"pick": Payload(probe.marker)}, f)
        _refused(probe, lambda: load_text_embeddings(path))

    def init_states() -> None:
        from envs.libero.suites import _load_init_states_file

        path = probe.root / "bad.pruned_init"
        torch.save(Payload(probe.marker), path)
        _refused(probe, lambda: _load_init_states_file(str(path)))

    cases = {
        "trainer --resume": resume,
        "trainer --init-policy": lambda: _refused(
            probe,
            lambda: ckpt.build_policy("mlp", {}, *_cartpole_spaces(), init_policy=_crafted_checkpoint(probe)),
        ),
        "load_policy": lambda: _refused(
            probe, lambda: ckpt.load_policy(_crafted_checkpoint(probe), *_cartpole_spaces())
        ),
        "load_initial_frames": frames,
        "world-model load_state": load_state,
        "Cosmos Policy T5 .pkl": t5,
        "LIBERO init states": init_states,
    }
    for part, rel in {
        "reward model .pth": "resnet_rm.pth",
        "dataset/*.npy": "dataset/seed_0_traj_0.npy",
        "VAE tokenizer.pth": "tokenizer/tokenizer.pth",
        "DiT .pt": "libero-spatial-2b-19k.pt",
    }.items():
        cases[f"bundle {part}"] = lambda rel=rel: _refused(
            probe, lambda: probe.world_model(_bundle_with_payload(probe, rel))
        )
    return cases


# ---------------------------------------------------------------------- bad input
def constructor_arguments(probe: Probe) -> dict[str, Callable[[], None]]:
    libero = {
        "max_episode_steps": 0,
        "settle_steps": -1,
        "scene_seed": "x",
        "max_cached_scenes": 0,
        "chunk_size": 2.5,
        "image_size": (0, 0),
        "autoreset_mode": "sometimes",
        "step_timeout_s": -1.0,
    }
    cases = {
        f"LIBERO {k}={v!r}": lambda k=k, v=v: raises(BadInput, f"bad {k}: expected")(
            lambda: probe.libero(**{k: v})
        )
        for k, v in libero.items()
    }
    cases["LIBERO max_episode_steps=-5"] = lambda: raises(BadInput, "bad max_episode_steps")(
        lambda: probe.libero(max_episode_steps=-5)
    )
    cases["LIBERO chunk_size='4'"] = lambda: raises(BadInput, "bad chunk_size")(
        lambda: probe.libero(chunk_size="4")
    )
    cases["LIBERO task_ids=[99]"] = lambda: raises(BadInput, "task_ids must be in")(
        lambda: probe.libero(task_ids=[99])
    )
    # a bool is an int to Python: num_envs=True used to make one env (issue 32 item 8)
    cases["LIBERO num_envs=True"] = lambda: raises(BadInput, "bad num_envs: expected an int >= 1", "True")(
        lambda: probe.libero(num_envs=True)
    )
    cases["LIBERO task_ids=[True]"] = lambda: raises(BadInput, "task_ids must be in", "[True]")(
        lambda: probe.libero(task_ids=[True])
    )
    # was Python's TypeError from inside the constructor (issue 32): named, with the closest one
    cases["LIBERO unknown keyword"] = lambda: raises(
        ValueError, "bad argument 'camera': expected one of", "did you mean 'cameras'"
    )(lambda: probe.libero(camera=[]))
    world_model = {
        "image_size": (0, 0),
        "success_threshold": "x",
        "max_episode_steps": 0,
        "reward_coef": float("nan"),
    }
    for k, v in world_model.items():
        cases[f"world model {k}={v!r}"] = lambda k=k, v=v: raises(BadInput, f"bad {k}: expected")(
            lambda: probe.world_model(**{k: v})
        )
    cases["world model image_size=(-32, 48)"] = lambda: raises(BadInput, "bad image_size")(
        lambda: probe.world_model(image_size=(-32, 48))
    )
    cases["world model num_envs=True"] = lambda: raises(BadInput, "bad num_envs", "True")(
        lambda: probe.world_model(num_envs=True)
    )
    # chunk_size was Python's TypeError once the weights had loaded (issue 32): now LIBERO's meaning
    cases["world model chunk_size=0"] = lambda: raises(BadInput, "bad chunk_size: expected an int >= 1")(
        lambda: probe.world_model(chunk_size=0)
    )
    cases["world model chunk_size=4 (LIBERO's K)"] = lambda: _chunked_world_model(probe)
    cases["world model unknown keyword"] = lambda: raises(
        ValueError, "bad argument 'chunk_sizes': expected one of", "chunk_size, ", "received chunk_sizes=4"
    )(lambda: probe.world_model(chunk_sizes=4))
    return cases


def _chunked_world_model(probe: Probe) -> None:
    """``chunk_size=4``: 4 actions per step and as many imagined frames, as LIBERO's chunks."""
    env = probe.world_model(chunk_size=4, model_options={"num_steps": 1})
    try:
        if env.single_action_space.shape != (4, 7) or env.unwrapped.sim_env_kwargs()["chunk_size"] != 4:
            raise AssertionError(f"action space {env.single_action_space}")
        env.reset(seed=0)
        info = env.step(np.zeros(env.action_space.shape, np.float32))[-1]
        if info["chunk_valid"].shape != (1, 4):
            raise AssertionError(f"chunk_valid of shape {info['chunk_valid'].shape}")
    finally:
        env.close()


def _with_state(env: Any, value: float) -> Any:
    from envs.core.frames import InitialFrame

    frame = env.initial_frames[1]
    state = frame.sim_state.copy()
    state[5] = value
    return InitialFrame(frame.instruction, task=frame.task, sim_state=state)


def libero_object_frame(image: bool = False) -> Any:
    """Init state 0 of LIBERO-Object's first task as an ``InitialFrame`` (``image``: with a black
    32 x 48 image, as a frame exported to a world model)."""
    from envs.core.frames import InitialFrame
    from envs.libero.env import task_key
    from envs.libero.suites import load_init_states, suite_tasks

    task = suite_tasks("object")[0]
    return InitialFrame(
        task.instruction,
        task=task_key(task),
        sim_state=load_init_states(task)[0],
        image=np.zeros((32, 48, 3), np.uint8) if image else None,
    )


def _world_model_refuses_another_suite(probe: Probe) -> None:
    wm = probe.world_model()
    try:
        wm.reset(seed=0)
        before = wm.unwrapped.get_state()
        raises(BadInput, "bad initial frame", "a libero_spatial task", "got a libero_object frame")(
            lambda: wm.reset(options={"initial_frames": [libero_object_frame(image=True)]})
        )
        if wm.unwrapped.get_state() != before:
            raise AssertionError("the env changed")
    finally:
        wm.close()


def call_arguments(probe: Probe) -> dict[str, Callable[[], None]]:
    from envs.core.frames import InitialFrame

    def unchanged(call: Callable[[Any], Any], *words: str) -> Callable[[], None]:
        def case() -> None:
            env = probe.shared_libero
            obs, _ = env.reset(options={"initial_frames": [2, 52]})
            raises(BadInput, *words)(lambda: call(env))
            if not np.array_equal(env.unwrapped._observations()["proprio"], obs["proprio"]):
                raise AssertionError("the env changed")

        return case

    zeros = np.zeros((2, 4, 7), np.float32)
    return {
        "reset options='abc'": unchanged(lambda e: e.reset(options="abc"), "bad reset options"),
        "initial_frames=3.5": unchanged(
            lambda e: e.reset(options={"initial_frames": 3.5}), "bad initial_frames"
        ),
        "frame id out of range": unchanged(
            lambda e: e.reset(options={"initial_frames": [0, 500]}), "initial frame id"
        ),
        "unknown reset option": unchanged(lambda e: e.reset(options={"ids": [0]}), "bad reset option"),
        "reset_mask of the wrong shape": unchanged(
            lambda e: e.reset(options={"reset_mask": np.ones(3, bool)}), "bad reset_mask"
        ),
        "seed=-1": unchanged(lambda e: e.reset(seed=-1), "bad seed"),
        "NaN actions": unchanged(lambda e: e.step(np.full_like(zeros, np.nan)), "finite values"),
        "actions of the wrong shape": unchanged(lambda e: e.step(zeros[:, :3]), "bad actions"),
        "sim_state with NaN": unchanged(
            lambda e: e.reset(options={"initial_frames": [0, _with_state(e, np.nan)]}), "finite"
        ),
        "sim_state with 1e308": unchanged(
            lambda e: e.reset(options={"initial_frames": [0, _with_state(e, 1e308)]}), "within"
        ),
        "frame image 0x0": lambda: raises(BadInput, "H, W >= 1")(
            lambda: InitialFrame("pick", image=np.zeros((0, 0, 3), np.uint8))
        ),
        "world-model load_state(b'junk')": lambda: raises(BadInput, "bad state")(
            lambda: probe.world_model().unwrapped.load_state(b"junk")
        ),
        "Ray-v0 action out of range": _ray_v0_bad_action,
        "LIBERO-Object frame to a Spatial env": unchanged(
            lambda e: e.reset(options={"initial_frames": [0, libero_object_frame()]}),
            "a libero_spatial task",
            "got a libero_object frame",
        ),
        "LIBERO-Object frame to a Spatial world model": lambda: _world_model_refuses_another_suite(probe),
    }


def _ray_v0_bad_action() -> None:
    """Checked by the driver, before any actor is called: a clear ValueError, the env usable after."""
    import gymnasium as gym

    import envs  # noqa: F401  (registers Ray-v0)

    env = gym.make_vec("Ray-v0", num_envs=2, env="CartPole-v1", ray_actors=1)
    try:
        env.reset(seed=0)
        raises(BadInput, "bad actions", "values in [0, 1]")(lambda: env.step(np.array([0, 2])))
        env.step(np.array([0, 1]))
    finally:
        env.close()


def closed_envs(probe: Probe) -> dict[str, Callable[[], None]]:
    from envs import ClosedEnvError

    def closed(make: Callable[[], Any], call: Callable[[Any], Any]) -> Callable[[], None]:
        def case() -> None:
            env = make()
            env.reset(seed=0)
            env.close()
            raises(ClosedEnvError, "on a closed env")(lambda: call(env))

        return case

    def lib() -> Any:
        return probe.libero(num_envs=1)

    return {
        "LIBERO step": closed(lib, lambda e: e.step(np.zeros(e.action_space.shape, np.float32))),
        "LIBERO reset": closed(lib, lambda e: e.reset(seed=0)),
        "LIBERO current_frames": closed(lib, lambda e: e.current_frames()),
        "world model step": closed(
            probe.world_model, lambda e: e.step(np.zeros(e.action_space.shape, np.float32))
        ),
        "world model reset": closed(probe.world_model, lambda e: e.reset(seed=0)),
        "world model get_state": closed(probe.world_model, lambda e: e.unwrapped.get_state()),
    }


def env_states(probe: Probe) -> dict[str, Callable[[], None]]:
    """World-model ``load_state`` and ``reset(seed=)`` (issue 32 item 5): a state or a seed the env
    cannot use is refused with a ``ValueError`` naming the entry before anything changes."""
    import torch

    from envs.core.frames import InitialFrame
    from nets.safe_load import torch_load

    def env() -> tuple[Any, bytes]:
        if probe._state_env is None:
            wm = probe.world_model(model_options={"num_steps": 2})
            wm.reset(seed=0)
            probe._state_env = wm, wm.unwrapped.get_state()
        return probe._state_env

    def edited(change: Callable[[dict], Any]) -> Callable[[Any, bytes], Any]:
        def call(wm: Any, good: bytes) -> Any:
            state = torch_load(io.BytesIO(good), numpy=True, allow=[InitialFrame])
            change(state)
            buffer = io.BytesIO()
            torch.save(state, buffer)
            return wm.unwrapped.load_state(buffer.getvalue())

        return call

    def unchanged(call: Callable[[Any, bytes], Any], *words: str) -> Callable[[], None]:
        def case() -> None:
            wm, good = env()
            wm.unwrapped.load_state(good)
            before = wm.unwrapped.get_state()
            numpy_rng = wm.unwrapped.np_random.bit_generator.state
            raises(BadInput, *words)(lambda: call(wm, good))
            if wm.unwrapped.get_state() != before or wm.unwrapped.np_random.bit_generator.state != numpy_rng:
                raise AssertionError("the env changed")

        return case

    def frame_with(**fields: Any) -> Callable[[dict], None]:
        def change(state: dict) -> None:
            state["episode"]["_frames"][0].__dict__.update(fields)

        return change

    def episode(name: str, index: int, value: Any) -> Callable[[dict], None]:
        return lambda state: state["episode"][name].__setitem__(index, value)

    def entry(name: str, value: Any) -> Callable[[dict], None]:
        return lambda state: state.__setitem__(name, value)

    garbage = torch.randint(0, 256, (5056,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    return {
        "previous as a numpy array": unchanged(edited(entry("previous", np.zeros(1))), "state['previous']"),
        "previous of the wrong shape": unchanged(
            edited(entry("previous", torch.zeros(5))), "state['previous']", "shape (1,)"
        ),
        "garbage RNG state": unchanged(edited(entry("generator", garbage)), "state['generator']", "unusable"),
        "empty model state": unchanged(edited(entry("model_state", {})), "state['model_state']"),
        "frame id out of range": unchanged(edited(episode("_frame_ids", 0, 99)), "['_frame_ids']"),
        "step limit 0": unchanged(edited(episode("_limit", 0, 0)), "['_limit']"),
        "length past the limit": unchanged(edited(episode("_length", 0, 10**6)), "['_length']"),
        "InitialFrame with an int instruction": unchanged(edited(frame_with(instruction=7)), "instruction"),
        "InitialFrame with a float image": unchanged(
            edited(frame_with(image=np.zeros((4, 4, 3), np.float32))), "image must be uint8"
        ),
        "a state of another env id": unchanged(edited(entry("env_id", "CosmosWM-LiberoGoal-v0")), "env_id"),
        "world model reset(seed=2**100)": unchanged(lambda wm, _: wm.reset(seed=2**100), "bad seed"),
        "world model reset(seed=[-1])": unchanged(lambda wm, _: wm.reset(seed=[-1]), "bad seed"),
    }


# ---------------------------------------------------------------------- faults
def faults(probe: Probe) -> dict[str, Callable[[], None]]:
    def killed_mid_episode() -> None:
        env = probe.libero()
        env.reset(options={"initial_frames": [0, 50]})
        os.kill(env.pool.pids()[1], signal.SIGKILL)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            _, _, _, trunc, info = env.step(np.zeros(env.action_space.shape, np.float32))
        env.close()
        if trunc.tolist() != [False, True] or not info["worker_restarted"][1]:
            raise AssertionError(f"truncated {trunc.tolist()}")

    def killed_twice_in_reset() -> None:
        env = probe.libero()
        pool, start = env.pool, env.pool._start

        def start_and_kill(worker: int) -> None:
            start(worker)
            if worker == 1:
                pool._procs[worker].kill()
                pool._procs[worker].join()

        env.reset(options={"initial_frames": [0, 50]})
        os.kill(pool.pids()[1], signal.SIGKILL)
        pool._start = start_and_kill
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            raises(RuntimeError, "died twice in reset")(
                lambda: env.reset(options={"initial_frames": [1, 51]})
            )
            pool._start = start
            _, _, _, trunc, info = env.step(np.zeros(env.action_space.shape, np.float32))
        env.close()
        if not trunc.all() or not info["worker_restarted"].all():
            raise AssertionError("envs of the failed reset not reported lost")

    def stopped() -> None:
        env = probe.libero(step_timeout_s=3.0)
        env.reset(options={"initial_frames": [0, 50]})
        os.kill(env.pool.pids()[1], signal.SIGSTOP)
        began = time.monotonic()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            _, _, _, trunc, _ = env.step(np.zeros(env.action_space.shape, np.float32))
        took = time.monotonic() - began
        env.close()
        if not trunc[1] or took > 20:
            raise AssertionError(f"stopped worker: truncated {trunc.tolist()} after {took:.0f} s")

    def ray_stopped_libero() -> None:
        """Issue 32's case: LIBERO on 2 Ray actors, one stopped; the driver's deadline is LIBERO's
        step_timeout_s (3 s) plus 10 s."""
        env = probe.libero(ray_actors=2, step_timeout_s=3.0)
        pids = env.unwrapped.actor_pids()
        try:
            env.reset(options={"initial_frames": [0, 50]})
            os.kill(pids[1], signal.SIGSTOP)
            _lost_in_time(env, np.zeros(env.action_space.shape, np.float32), [False, True], 13.0)
        finally:
            _resume(pids[1])
            env.close()

    def ray_v0(how: str) -> Callable[[], None]:
        def case() -> None:
            import gymnasium as gym

            import envs  # noqa: F401  (registers Ray-v0)

            env = gym.make_vec("Ray-v0", num_envs=3, env="CartPole-v1", ray_actors=2, ray_step_timeout_s=3.0)
            pids = env.unwrapped.actor_pids()
            try:
                env.reset(seed=0)
                if how == "stop":
                    os.kill(pids[1], signal.SIGSTOP)
                else:
                    os.kill(pids[1], signal.SIGKILL)
                _lost_in_time(env, np.zeros(3, np.int64), [False, False, True], 3.0)
            finally:
                _resume(pids[1])
                env.close()

        return case

    return {
        "worker killed mid-episode": killed_mid_episode,
        "worker killed twice in one reset": killed_twice_in_reset,
        "worker stopped (SIGSTOP)": stopped,
        "Ray actor stopped (SIGSTOP), LIBERO on 2 actors": ray_stopped_libero,
        "Ray-v0 actor stopped (SIGSTOP)": ray_v0("stop"),
        "Ray-v0 actor killed": ray_v0("kill"),
    }


def _lost_in_time(env: Any, actions: np.ndarray, lost: list[bool], deadline_s: float) -> None:
    """One step: back within the deadline (plus 10 s) with exactly ``lost`` truncated and flagged
    ``worker_restarted``; then two more steps without a loss."""
    began = time.monotonic()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        _, _, _, trunc, info = env.step(actions)
    took = time.monotonic() - began
    flagged = info.get("worker_restarted", np.zeros(len(lost), bool)).tolist()
    if trunc.tolist() != lost or flagged != lost or took > deadline_s + 10:
        raise AssertionError(f"truncated {trunc.tolist()}, worker_restarted {flagged} after {took:.0f} s")
    for _ in range(2):
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            _, _, _, trunc, info = env.step(actions)
        if "worker_restarted" in info:
            raise AssertionError("a loss after the restart")


def _resume(pid: int) -> None:
    """SIGCONT for a stopped actor process Ray has not killed (a case that failed)."""
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


def checkpoints(probe: Probe) -> dict[str, Callable[[], None]]:
    import torch

    import trainers.checkpoint as ckpt

    def run(name: str) -> Path:
        run_dir = probe.root / name
        for i in (1, 2):
            weights = {"w": torch.linspace(-1, 1, 4096) * i}
            ckpt.save_checkpoint(
                run_dir / "checkpoints" / f"iter_{i:06d}.pt", {"counters": {"iteration": i}, **weights}
            )
        return run_dir

    def flipped() -> None:
        path = run("flipped") / "checkpoints" / "iter_000002.pt"
        raw = bytearray(path.read_bytes())
        start = raw.index((torch.linspace(-1, 1, 4096) * 2).numpy().tobytes()[:64]) + 100
        raw[start : start + 64] = bytes(b ^ 0xFF for b in raw[start : start + 64])
        path.write_bytes(bytes(raw))
        raises(BadInput, "corrupt checkpoint")(lambda: ckpt.load_checkpoint(path))

    def older_one_used(damage: Callable[[Path], None]) -> Callable[[], None]:
        def case() -> None:
            run_dir = run(f"damaged-{id(damage)}")
            damage(run_dir / "checkpoints" / "iter_000002.pt")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                path, _ = ckpt.latest_checkpoint(run_dir)
            if path.name != "iter_000001.pt":
                raise AssertionError(f"loaded {path.name}")

        return case

    def stale_partial() -> None:
        folder = probe.root / "partial"
        folder.mkdir()
        (folder / ".iter_000003.pt.partial").write_bytes(b"half")
        ckpt.save_checkpoint(folder / "iter_000004.pt", {})
        if sorted(p.name for p in folder.iterdir()) != ["iter_000004.pt"]:
            raise AssertionError("stale partial kept")

    def corrupt_config() -> None:
        from trainers.__main__ import main

        run_dir = run("config")
        (run_dir / "config.json").write_text("{")
        raises(BadInput, "config.json: expected JSON, got a file that does not parse")(
            lambda: main(["--resume", str(run_dir)])
        )

    def foreign() -> None:
        torch.save({"weights": 1}, probe.root / "other.pt")
        raises(BadInput, "not a vla-gym checkpoint")(lambda: ckpt.load_checkpoint(probe.root / "other.pt"))

    return {
        "64 flipped bytes in a tensor": flipped,
        "truncated newest file": older_one_used(
            lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
        ),
        "garbage newest file": older_one_used(lambda p: p.write_bytes(b"garbage")),
        "stale .partial of a killed save": stale_partial,
        "corrupt config.json on --resume": corrupt_config,
        "a torch file that is no checkpoint": foreign,
    }


def run_folders(probe: Probe) -> dict[str, Callable[[], None]]:
    """A run folder is written only after its checks pass, each whole file atomically, by one run at
    a time, never mixed with another run's files and never through a symbolic link (issue 32)."""
    import contextlib
    import errno
    import json
    import shutil

    from trainers.__main__ import main
    from trainers.files import write_atomic
    from trainers.metrics import read_metrics
    from trainers.ppo import PPOConfig
    from trainers.ppo import train as ppo_train
    from trainers.run import Run, RunConfig

    fast = ["--no-progress", "--no-tensorboard", "--no-video", "--torch-threads", "1"]

    def train(argv: list[str]) -> None:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the torn lines dropped, on purpose
            ppo_train.main([*argv, *fast])

    def run(name: str, *extra: str) -> Path:
        """A 2-iteration PPO run on CartPole (with ``extra`` flags)."""
        folder = probe.root / "runs" / name
        sizes = ["--num-envs", "2", "--n-steps", "32", "--batch-size", "64", "--total-steps", "128"]
        train(["--env", "CartPole-v1", *sizes, "--checkpoint-every", "1", "--eval-every", "-1",
               "--run-dir", str(folder), *extra])  # fmt: skip
        return folder

    def files(folder: Path) -> dict[str, bytes]:
        return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}

    def untouched(folder: Path, call: Callable[[], Any], exc: type[BaseException], *words: str) -> None:
        before = files(folder)
        raises(exc, *words)(call)
        if files(folder) != before:
            raise AssertionError(f"{folder} changed")

    def resumed(folder: Path, iterations: int) -> None:
        train(["--resume", str(folder), "--total-steps", str(64 * iterations)])
        got = [int(r["iteration"]) for r in read_metrics(folder) if "train/loss" in r]
        if got != list(range(1, iterations + 1)):
            raise AssertionError(f"iterations {got} after the resume")

    def other_env() -> None:
        folder = run("env")
        untouched(
            folder,
            lambda: main(["--resume", str(folder), "--env", "Pendulum-v1"]),
            ValueError,
            "not 'Pendulum-v1'",
        )
        resumed(folder, 4)

    def other_algo() -> None:
        folder = run("algo")
        call = lambda: main(["--resume", str(folder), "--algo", "grpo", "--group-size", "2"])  # noqa: E731
        untouched(folder, call, ValueError, "is a ppo checkpoint, not grpo")
        resumed(folder, 4)

    def loose_checkpoint() -> None:
        loose = probe.root / "loose" / "deep"
        loose.mkdir(parents=True)
        shutil.copy(run("loose") / "checkpoints" / "iter_000002.pt", loose)
        call = lambda: main(["--algo", "ppo", "--resume", str(loose / "iter_000002.pt")])  # noqa: E731
        untouched(loose.parent, call, ValueError, "resumes the run folder it belongs to")

    def missing() -> None:
        path = probe.root / "missing"
        raises(FileNotFoundError, "no such run folder")(
            lambda: main(["--algo", "ppo", "--resume", str(path)])
        )
        if path.exists():
            raise AssertionError("created")

    def torn(name: str, text: str, *extra: str) -> Callable[[], None]:
        def case() -> None:
            folder = run(f"torn-{name}", *extra)
            with open(folder / name, "a") as f:
                f.write(text)
            resumed(folder, 4)
            [json.loads(line) for line in (folder / name).read_text().splitlines()]  # every line whole

        return case

    def damaged_middle() -> None:
        folder = run("middle")
        lines = (folder / "metrics.jsonl").read_text().splitlines()
        (folder / "metrics.jsonl").write_text("\n".join([lines[0], "{garbage", *lines[1:]]) + "\n")
        call = lambda: main(["--resume", str(folder), "--total-steps", "256"])  # noqa: E731
        untouched(folder, call, ValueError, "metrics.jsonl, line 2", "damaged before its last line")

    def full_disk() -> None:
        path = probe.root / "config.json"
        path.write_text("old")

        def half(f: Any) -> None:
            f.write(b"half of the new")
            raise OSError(errno.ENOSPC, "No space left on device")

        raises(OSError, "No space left")(lambda: write_atomic(path, half))
        left = sorted(p.name for p in probe.root.glob(".config.json*"))
        if path.read_text() != "old" or left:
            raise AssertionError(f"{path.read_text()!r}, temporary files {left}")

    def second_writer() -> None:
        folder = probe.root / "runs" / "locked"
        config = RunConfig(env="CartPole-v1", num_envs=2, run_dir=str(folder), progress=False)
        first = Run("ppo", config, PPOConfig())
        try:
            raises(RuntimeError, "is in use", "another run")(lambda: Run("ppo", config, PPOConfig()))
        finally:
            first.close()

    def new_run_in_old_folder() -> None:
        folder = run("old")
        untouched(folder, lambda: run("old", "--seed", "1"), ValueError, "already holds a run", "--overwrite")

    def overwrite() -> None:
        folder = run("overwrite")
        run("overwrite", "--seed", "1", "--total-steps", "64", "--overwrite")
        names = sorted(p.name for p in (folder / "checkpoints").iterdir())
        if names != ["iter_000001.pt"] or len(read_metrics(folder)) != 1:
            raise AssertionError(f"old files kept: {names}")

    def link(name: str) -> Callable[[], None]:
        def case() -> None:
            folder = run(f"link-{name}")
            outside = probe.root / f"outside-{name}"
            (folder / name).rename(outside)
            (folder / name).symlink_to(outside)
            before = outside.read_bytes()
            raises(BadInput, "is a symbolic link")(
                lambda: main(["--resume", str(folder), "--total-steps", "256"])
            )
            if outside.read_bytes() != before:
                raise AssertionError(f"{outside} written through the link")

        return case

    return {
        "refused --resume (other --env) writes nothing": other_env,
        "refused --resume (--algo grpo on ppo) writes nothing": other_algo,
        "--resume of a checkpoint outside a run folder": loose_checkpoint,
        "--resume of a missing path": missing,
        "torn last line of metrics.jsonl": torn("metrics.jsonl", '{"step": 192, "itera'),
        "garbage last line of eval_episodes.jsonl": torn(
            "eval_episodes.jsonl", "garbage", "--eval-every", "0", "--eval-episodes", "2"
        ),
        "damaged line inside metrics.jsonl": damaged_middle,
        "full disk while writing config.json": full_disk,
        "second run on a folder in use": second_writer,
        "new run in an old run's folder": new_run_in_old_folder,
        "--overwrite clears the old run": overwrite,
        "config.json is a symbolic link": link("config.json"),
        "summary.md is a symbolic link": link("summary.md"),
    }


def process_traps(probe: Probe) -> dict[str, Callable[[], None]]:
    script = (
        "import gymnasium as gym, envs\n"
        "env = gym.make_vec('Libero-Spatial-v0', num_envs=2, cameras=[])\n"
        "obs, _ = env.reset(seed=0)\nprint('ok', obs['proprio'].shape)\nenv.close()\n"
    )

    def stdin() -> None:
        done = subprocess.run(
            [sys.executable, "-"], input=script, text=True, capture_output=True, timeout=600
        )
        if "ok (2, 8)" not in done.stdout:
            raise AssertionError(done.stderr[-300:])

    def threads() -> None:
        import threading

        from envs.libero import suites

        stdout = sys.stdout
        suites._benchmark_tasks.cache_clear()
        names = ["libero_spatial", "libero_object", "libero_goal"]
        workers = [threading.Thread(target=suites._benchmark_tasks, args=(n,)) for n in names]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        if sys.stdout is not stdout:
            raise AssertionError("sys.stdout was swapped")

    return {"script on standard input": stdin, "three threads load suites": threads}


# ---------------------------------------------------------------------- declared sizes and paths
def tiny_demos(episodes: int = 2, steps: int = 6, size: int = 16) -> Any:
    """Demos recorded one action per step, with images that differ from frame to frame."""
    from trainers.datasets.demos import Demos, Episode

    rng = np.random.default_rng(0)
    return Demos(
        {"env": "envs:Libero-Spatial-v0"},
        [
            Episode(
                obs={
                    "image": rng.integers(0, 256, (steps, size, size, 3), dtype=np.uint8),
                    "proprio": rng.normal(size=(steps, 8)).astype(np.float32),
                },
                actions=rng.uniform(-1, 1, (steps, 1, 7)).astype(np.float32),
                valid=np.ones((steps, 1), bool),
                rewards=np.zeros((steps, 1), np.float32),
                instruction="pick up the bowl",
                success=True,
            )
            for _ in range(episodes)
        ],
    )


def lerobot_declaring(root: Path, size: int, video: bool = True) -> Path:
    """A LeRobot v3 folder of 16 x 16 images whose ``info.json`` declares them ``size`` x ``size``."""
    import json

    from trainers.datasets import write_lerobot

    out = write_lerobot(tiny_demos(), root, video=video, progress=False)
    info_path = out / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    feature = info["features"]["observation.images.image"]
    feature["shape"] = [size, size, 3]
    if "info" in feature:
        feature["info"].update({"video.height": size, "video.width": size})
    info_path.write_text(json.dumps(info, indent=2))
    return out


def lerobot_reaching_out(root: Path, how: str) -> Path:
    """A LeRobot v3 folder that names a file outside itself, which does exist there: ``how`` is
    "data_path ../" or "video_path absolute" (a template of ``info.json``), or "symlinked data file"
    or "symlinked info.json" (a link out of the folder); "data_path 900 MB wide" is a template whose
    field width would fill 900 MB."""
    import json
    import shutil

    from trainers.datasets import write_lerobot

    out = write_lerobot(tiny_demos(), root / "dataset", progress=False)
    outside = root / "outside"
    outside.mkdir()
    info_path = out / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    data = out / "data" / "chunk-000" / "file-000.parquet"
    video = out / "videos" / "observation.images.image" / "chunk-000" / "file-000.mp4"
    if how == "data_path ../":
        shutil.copy(data, outside / "file-000.parquet")
        info["data_path"] = "../outside/file-{file_index:03d}.parquet"
    elif how == "video_path absolute":
        shutil.copy(video, outside / "observation.images.image.mp4")
        info["video_path"] = str(outside.resolve()) + "/{video_key}.mp4"
    elif how == "data_path 900 MB wide":
        info["data_path"] = "data/chunk-{chunk_index:0900000000d}/file-{file_index:03d}.parquet"
    elif how == "symlinked data file":
        data.replace(outside / "file-000.parquet")
        data.symlink_to(outside / "file-000.parquet")
    elif how == "symlinked info.json":
        (outside / "info.json").write_text(json.dumps(info))
        info_path.unlink()
        info_path.symlink_to(outside / "info.json")
        return out
    else:
        raise BadInput(f"unknown case {how!r}")
    info_path.write_text(json.dumps(info, indent=2))
    return out


def demos_file_with(path: Path, how: str) -> Path:
    """A vla-gym demos file whose first episode's actions (or images) are replaced: ``how`` is
    "external link", "external storage", "virtual dataset" (data in another file, which exists),
    "4 GiB compressed" (a chunked gzip dataset declaring 4 GiB, one chunk written) or
    "800 MB contiguous" (declared, never written: it would read as fill values)."""
    import h5py

    from trainers.datasets.demos import write_demos

    demos = tiny_demos()
    write_demos(path, demos.episodes, {"env": "envs:Libero-Spatial-v0"})
    actions = demos.episodes[0].actions
    other = path.with_name(path.stem + "-other.h5")
    raw = path.with_name(path.stem + "-raw.bin")
    with h5py.File(path, "a") as f:
        g = f["episodes/000000"]
        if how in ("external link", "virtual dataset"):
            with h5py.File(other, "w") as o:
                o["actions"] = actions
        if how == "external link":
            del g["actions"]
            g["actions"] = h5py.ExternalLink(str(other), "/actions")
        elif how == "external storage":
            raw.write_bytes(actions.tobytes())
            del g["actions"]
            external = [(str(raw), 0, actions.nbytes)]
            g.create_dataset("actions", actions.shape, actions.dtype, external=external)
        elif how == "virtual dataset":
            layout = h5py.VirtualLayout(actions.shape, actions.dtype)
            layout[...] = h5py.VirtualSource(str(other), "actions", shape=actions.shape)
            del g["actions"]
            g.create_virtual_dataset("actions", layout)
        elif how == "4 GiB compressed":
            del g["obs/image"]
            big = g.create_dataset(
                "obs/image",
                (2**22, 16, 16, 4),
                np.uint8,
                chunks=(1, 16, 16, 4),
                maxshape=(None, 16, 16, 4),
                compression="gzip",
            )
            big[0] = 1
        elif how == "800 MB contiguous":
            g.create_dataset("sim_states", (10**5, 1000), np.float64)
        else:
            raise BadInput(f"unknown case {how!r}")
    return path


def libero_file(path: Path, demos: int = 1, steps: int = 20, size: int = 64, linked: int = 0) -> Path:
    """A LIBERO (robomimic layout) demonstration file of ``demos`` demos, and ``linked`` more names
    (``demo_<i>``) that are hard links to ``demo_0``: each is read again from the same bytes."""
    import json

    import h5py

    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        data.attrs["problem_info"] = json.dumps({"language_instruction": "pick up the bowl"})
        for i in range(demos):
            g = data.create_group(f"demo_{i}")
            g["obs/agentview_rgb"] = rng.integers(0, 256, (steps, size, size, 3), dtype=np.uint8)
            g["obs/ee_pos"], g["obs/ee_ori"] = rng.normal(size=(steps, 3)), rng.normal(size=(steps, 3))
            g["obs/gripper_states"] = rng.normal(size=(steps, 2))
            g["actions"], g["states"] = rng.uniform(-1, 1, (steps, 7)), rng.normal(size=(steps, 9))
            g["rewards"] = g["dones"] = np.r_[np.zeros(steps - 1), 1.0]
        for i in range(demos, demos + linked):
            data[f"demo_{i}"] = data["demo_0"]
    return path


def frame_set_declaring(path: Path) -> Path:
    """A reward-model frame set (``trainers.reward_model``) whose frames declare 4 GiB, one written."""
    import h5py

    from trainers.reward_model.collect import EPISODE_COLUMNS, FORMAT, VERSION

    with h5py.File(path, "w") as f:
        f.attrs["format"], f.attrs["version"] = FORMAT, VERSION
        for column in EPISODE_COLUMNS:
            f[f"episodes/{column}"] = np.zeros(1, np.int32)
        for name in ("labels", "episode", "step"):
            f[name] = np.zeros(1, np.int32)
        frames = f.create_dataset(
            "frames", (2**22, 32, 32, 1), np.uint8, chunks=(1, 32, 32, 1), compression="lzf"
        )
        frames[0] = 1
    return path


def declared_sizes(probe: Probe) -> dict[str, Callable[[], None]]:
    """Files that declare sizes or paths they do not hold: every one refused with a ValueError that
    names the file and what it declares, before anything large is allocated or anything outside the
    file or folder is read."""
    from trainers.datasets import load_demos

    root = probe.root / "declared"

    def folder(name: str) -> Path:
        path = root / name
        path.mkdir(parents=True)
        return path

    def lerobot(size: int, video: bool) -> Callable[[], None]:
        words = ("16x16", f"not the {size}x{size}", "meta/info.json")
        return lambda: raises(BadInput, *words)(
            lambda: load_demos(
                lerobot_declaring(folder(f"lr-{size}-{video}") / "ds", size, video), progress=False
            )
        )

    def outside(how: str) -> Callable[[], None]:
        return lambda: raises(BadInput, "outside the dataset folder")(
            lambda: load_demos(lerobot_reaching_out(folder(how.replace(" ", "-")), how), progress=False)
        )

    def demos(how: str, *words: str) -> Callable[[], None]:
        return lambda: raises(BadInput, *words)(
            lambda: load_demos(demos_file_with(folder(how.replace(" ", "-")) / "d.h5", how))
        )

    def libero_linked() -> None:
        path = libero_file(folder("linked") / "task_demo.hdf5", linked=20)
        raises(BadInput, "past what the file can hold")(lambda: load_demos(path, progress=False))

    def libero_symlink() -> None:
        suite = folder("suite")
        libero_file(suite / "a_demo.hdf5")
        other = libero_file(folder("elsewhere") / "b_demo.hdf5")
        (suite / "b_demo.hdf5").symlink_to(other)
        raises(BadInput, "outside the dataset folder")(lambda: load_demos(suite, progress=False))

    def frame_set() -> None:
        from trainers.reward_model.collect import read_frames

        path = frame_set_declaring(folder("frames") / "frames.h5")
        raises(BadInput, "declares (4194304, 32, 32, 1)", "expand to at most")(lambda: read_frames(path))

    return {
        "LeRobot video larger than info.json declares": lerobot(8, True),
        "LeRobot video smaller than info.json declares": lerobot(32, True),
        "LeRobot PNG images of another size": lerobot(8, False),
        "LeRobot data_path with ../": outside("data_path ../"),
        "LeRobot video_path absolute": outside("video_path absolute"),
        "LeRobot data_path 900 MB wide": lambda: raises(BadInput, "not a path template", "0900000000d")(
            lambda: load_demos(lerobot_reaching_out(folder("wide"), "data_path 900 MB wide"), progress=False)
        ),
        "LeRobot data file symlinked out": outside("symlinked data file"),
        "LeRobot info.json symlinked out": outside("symlinked info.json"),
        "LIBERO folder file symlinked out": libero_symlink,
        "HDF5 external link": demos("external link", "external link", "never followed"),
        "HDF5 external storage": demos("external storage", "external files"),
        "HDF5 virtual dataset": demos("virtual dataset", "virtual dataset"),
        "HDF5 4 GiB declared, compressed": demos("4 GiB compressed", "declares", "expand to at most"),
        "HDF5 800 MB declared, contiguous": demos("800 MB contiguous", "declares", "file's"),
        "HDF5 demo hard-linked 20 times": libero_linked,
        "frame set 4 GiB declared": frame_set,
    }


def truncated(path: Path, keep: float = 0.5) -> Path:
    """Cut ``path`` to ``keep`` of its bytes (what a full disk or an interrupted copy leaves)."""
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    return path


def malformed_files(probe: Probe) -> dict[str, Callable[[], None]]:
    """Files cut short or of the wrong shape, and a reward model of NaN weights (issue 32 item 8):
    each a ``ValueError`` naming the file, what was expected and what came, before any work; no NaN
    reward model is ever written."""
    import json
    import shutil

    import torch

    from envs.core.frames import InitialFrame, load_initial_frames, save_initial_frames
    from nets.resnet_rm import ResnetRewardModel
    from trainers.datasets import load_demos

    root = probe.root / "malformed"

    def lerobot(name: str, change: Callable[[Path], Any], *words: str) -> Callable[[], None]:
        def case() -> None:
            from trainers.datasets import write_lerobot

            out = write_lerobot(tiny_demos(), root / name, progress=False)
            change(out)
            raises(BadInput, *words)(lambda: load_demos(out, progress=False))

        return case

    def features_as_list(out: Path) -> None:
        info = json.loads((out / "meta" / "info.json").read_text())
        info["features"] = list(info["features"])
        (out / "meta" / "info.json").write_text(json.dumps(info))

    def frames_npy() -> None:
        frame = InitialFrame("pick", image=np.zeros((4, 4, 3), np.uint8))
        folder = save_initial_frames([frame], root / "frames")
        truncated(folder / "frame_00000.npy", 0.8)
        raises(BadInput, "frame_00000.npy", "expected a whole pickle", "truncated")(
            lambda: load_initial_frames(folder)
        )

    def bundle_npy() -> None:
        bundle = shutil.copytree(probe.bundle, root / "bundle")
        truncated(sorted((bundle / "dataset").glob("*.npy"))[0], 0.9)
        raises(BadInput, ".npy", "truncated")(lambda: probe.world_model(bundle))

    def plain_npy() -> None:
        from nets.safe_load import load_npy

        path = root / "plain.npy"
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, np.zeros((10, 10)))
        raises(BadInput, "plain.npy", "(10, 10)", "truncated")(lambda: load_npy(truncated(path, 0.9)))

    def nan_reward_model() -> None:
        from trainers.reward_model.train import build_model

        model = ResnetRewardModel(width=2)
        with torch.no_grad():
            model.net[-1].weight.fill_(float("nan"))
        path = root / "nan_rm.pth"
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), path)
        raises(BadInput, "init_from", "nan_rm.pth", "finite weights", "net.7.weight")(
            lambda: build_model(None, str(path))
        )

    def nan_model_not_written() -> None:
        from trainers.reward_model.train import save_reward_model

        model = ResnetRewardModel(width=2)
        with torch.no_grad():
            model.net[0][0].bias.fill_(float("inf"))
        path = root / "out" / "resnet_rm.pth"
        raises(BadInput, "not written", "finite weights")(lambda: save_reward_model(model, path))
        if path.exists():
            raise AssertionError(f"{path} written")

    info = "meta/info.json"
    data = "data/chunk-000/file-000.parquet"
    episodes = "meta/episodes/chunk-000/file-000.parquet"
    video = "videos/observation.images.image/chunk-000/file-000.mp4"
    return {
        "LeRobot info.json truncated": lerobot(
            "info", lambda o: truncated(o / info), "info.json", "expected a JSON object", "truncated"
        ),
        "LeRobot info.json features as a list": lerobot(
            "features", features_as_list, "info.json", "features as a JSON object", "got a JSON list"
        ),
        "LeRobot data parquet truncated": lerobot(
            "data", lambda o: truncated(o / data), "file-000.parquet", "expected a parquet file", "truncated"
        ),
        "LeRobot episodes parquet truncated": lerobot(
            "episodes", lambda o: truncated(o / episodes), "meta/episodes", "expected a parquet file"
        ),
        "LeRobot video .mp4 truncated": lerobot(
            "video", lambda o: truncated(o / video), "file-000.mp4", "16x16 frames", "cut short", "truncated"
        ),
        "frame set .npy truncated": frames_npy,
        "world-model bundle dataset .npy truncated": bundle_npy,
        "plain .npy array truncated": plain_npy,
        "reward model started from NaN weights": nan_reward_model,
        "reward model of inf weights never written": nan_model_not_written,
    }


def settings(probe: Probe) -> dict[str, Callable[[], None]]:
    """Trainer settings of the wrong type or out of range, from a config file or flags: a
    ``ValueError`` naming the setting, what it expects and what came, before any work (issue 32)."""
    import json

    import torch

    from trainers.config import parse
    from trainers.ppo import PPOConfig
    from trainers.run import RunConfig

    def config_file(values: dict[str, Any], *words: str) -> Callable[[], None]:
        def call() -> None:
            path = probe.root / "settings.json"
            path.write_text(json.dumps(values))
            parse({"run": RunConfig, "ppo": PPOConfig}, ["--config", str(path)])

        return lambda: raises(BadInput, *words)(call)

    def flags(argv: list[str], *words: str) -> Callable[[], None]:
        return lambda: raises(BadInput, *words)(lambda: parse({"run": RunConfig, "ppo": PPOConfig}, argv))

    cases = {
        '"run": null': config_file({"run": None}, "run", "JSON object"),
        "num_envs true": config_file({"run": {"num_envs": True}}, "num_envs", "expected int", "True"),
        "num_envs as a string": config_file({"run": {"num_envs": "8"}}, "num_envs", "expected int"),
        "env_kwargs a list": config_file({"run": {"env_kwargs": [1]}}, "env_kwargs", "JSON object"),
        "gamma as a string": config_file({"ppo": {"gamma": "0.9"}}, "gamma", "expected a number"),
        "--env-kwargs '[1]'": flags(["--env-kwargs", "[1]"], "env_kwargs", "JSON object"),
        "--seed -1": flags(["--seed", "-1"], "seed", ">= 0"),
        "--eval-num-envs -3": flags(["--eval-num-envs", "-3"], "eval_num_envs", ">= 0"),
        "--clip-low -1": flags(["--clip-low", "-1"], "clip_low"),
        "--target-kl -1": flags(["--target-kl", "-1"], "target_kl", "> 0"),
    }
    if not torch.cuda.is_available():
        cases["--device cuda without CUDA"] = flags(["--device", "cuda"], "CUDA is not available")
    cases.update(resume_flags(probe))
    return cases


def resume_flags(probe: Probe) -> dict[str, Callable[[], None]]:
    """``--resume`` with a setting the run keeps from its checkpoint given another value: a
    ``ValueError`` naming the flag, the run's value and the given one, the folder untouched; the
    same values given again are accepted (issue 32 item 8)."""
    import contextlib
    import hashlib
    import json

    from trainers.__main__ import main

    fast = ["--no-progress", "--no-tensorboard", "--no-video", "--torch-threads", "1"]
    folder = probe.root / "runs" / "resume-flags"

    def quiet(argv: list[str]) -> None:
        with contextlib.redirect_stdout(io.StringIO()):
            main([*argv, *fast])

    def run() -> Path:
        if not folder.exists():
            quiet(["--algo", "ppo", "--env", "CartPole-v1", "--num-envs", "2", "--n-steps", "32",
                   "--batch-size", "64", "--total-steps", "128", "--checkpoint-every", "1", "--eval-every",
                   "-1", "--policy-kwargs", '{"hidden_sizes": [16]}', "--run-dir", str(folder)])  # fmt: skip
        return folder

    def digest(path: Path) -> dict[str, str]:
        return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in path.rglob("*") if p.is_file()}

    def refused(flag: str, value: str, *words: str) -> Callable[[], None]:
        def case() -> None:
            before = digest(run())
            raises(BadInput, flag, *words, "a resumed run keeps it")(
                lambda: quiet(["--resume", str(folder), "--total-steps", "192", flag, value])
            )
            if digest(folder) != before:
                raise AssertionError(f"{folder} changed")

        return case

    def same_values() -> None:
        run()
        quiet(["--resume", str(folder), "--total-steps", "192", "--seed", "0", "--run-dir", str(folder),
               "--policy-kwargs", "{}", "--adam-eps", "1e-5"])  # fmt: skip
        saved = json.loads((folder / "config.json").read_text())
        if saved["run"]["policy_kwargs"] != {"hidden_sizes": [16]} or saved["run"]["total_steps"] != 192:
            raise AssertionError(f"config.json has {saved['run']}")

    def opt_in_it_lacks() -> None:
        # issue 32: a TypeError of the policy's constructor once the env was built
        before = digest(run())
        raises(BadInput, "trust_pickle=True", "CategoricalPolicy) has no trust_pickle argument")(
            lambda: quiet(["--resume", str(folder), "--policy-kwargs", '{"trust_pickle": true}'])
        )
        if digest(folder) != before:
            raise AssertionError(f"{folder} changed")

    def opt_in_asking_nothing() -> None:
        run()
        quiet(["--resume", str(folder), "--total-steps", "256", "--policy-kwargs", '{"trust_pickle": false}'])

    return {
        "--resume with another --seed": refused("--seed", "3", "seed 0"),
        "--resume with another --policy": refused("--policy", "gaussian", "policy 'auto'"),
        "--resume with other --policy-kwargs": refused(
            "--policy-kwargs", '{"hidden_sizes": [32]}', "{'hidden_sizes': [16]}"
        ),
        "--resume with an --init-policy": refused("--init-policy", "runs/other", "init_policy None"),
        "--resume with another --run-dir": refused("--run-dir", "runs/other", str(folder)),
        "--resume with another --adam-eps": refused("--adam-eps", "0.1", "adam_eps 1e-05"),
        "--resume with the run's own values": same_values,
        "--resume with an opt-in its policy has no argument for": opt_in_it_lacks,
        "--resume with an opt-in that asks for nothing (False)": opt_in_asking_nothing,
    }


def special_files(probe: Probe) -> dict[str, Callable[[], None]]:
    """FIFOs, devices, sockets and folders where a reader expects a file (issue 47, class 3): a
    ``ValueError`` naming the path and what it is, at once (opening a FIFO waits for a writer)."""
    import os
    import socket

    from envs.core.frames import load_initial_frames
    from nets.safe_load import load_npy, restricted_unpickle, torch_load
    from trainers.config import read_json
    from trainers.datasets import load_demos

    root = probe.root / "special"

    def fifo(name: str) -> Path:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            os.mkfifo(path)
        return path

    def sock(name: str) -> Path:
        path = root / name
        root.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            server = socket.socket(socket.AF_UNIX)
            server.bind(str(path))
            server.close()
        return path

    def case(call: Callable[[], Any], *words: str) -> Callable[[], None]:
        return lambda: raises(BadInput, *words)(call)

    return {
        "a FIFO named frame_00000.npy in a frame folder": case(
            lambda: load_initial_frames(fifo("frames/dataset/frame_00000.npy").parent),
            "frame_00000.npy",
            "FIFO",
        ),
        "a FIFO as --config": case(lambda: read_json(fifo("config.json")), "config.json", "FIFO"),
        "a FIFO as demos (.h5)": case(lambda: load_demos(fifo("demos.h5")), "demos.h5", "FIFO"),
        "a FIFO as a checkpoint": case(lambda: torch_load(fifo("ckpt.pt")), "ckpt.pt", "FIFO"),
        "a FIFO as a pickle": case(lambda: restricted_unpickle(fifo("emb.pkl")), "emb.pkl", "FIFO"),
        "a socket as a checkpoint": case(lambda: torch_load(sock("ckpt.sock")), "ckpt.sock", "socket"),
        "a character device as an .npy": case(lambda: load_npy("/dev/zero"), "/dev/zero", "character device"),
        "a folder as a checkpoint": case(lambda: torch_load(root), "special", "folder"),
    }


def settings_from_files(probe: Probe) -> dict[str, Callable[[], None]]:
    """Settings a file carries (a resumed run's config.json, a checkpoint's saved arguments) are
    typed data on an allow-list (issue 47 class 1): nothing in them names code, an executable, an
    address or a URL, and an unknown key is refused by its path."""
    from trainers.checkpoint import checked_policy_spec
    from trainers.config import untrusted_settings

    def resumed(run: dict[str, Any], *words: str) -> Callable[[], None]:
        return lambda: raises(BadInput, *words)(lambda: untrusted_settings({"run": run}, {}, "config.json"))

    shell = {"runtime_env": {"py_executable": f"touch {probe.marker}"}}
    libero = "envs:Libero-Spatial-v0"
    return {
        "config.json: ray_options.runtime_env.py_executable": resumed(
            {"env": libero, "env_kwargs": {"ray_actors": 1, "ray_options": shell}}, "env_kwargs.ray_options"
        ),
        "config.json: Ray-v0's env names a module": resumed(
            {"env": "envs:Ray-v0", "env_kwargs": {"env": "this:CartPole-v1"}},
            "env_kwargs.env",
            "not vla-gym's",
        ),
        "config.json: ray_address": resumed(
            {"env": libero, "env_kwargs": {"ray_address": "1.2.3.4:6379"}}, "ray_address"
        ),
        "config.json: an unknown nested key": resumed(
            {"env": libero, "env_kwargs": {"camras": []}}, "camras"
        ),
        "config.json: a URL as init_policy": resumed(
            {"init_policy": "https://x.org/p.pt"}, "init_policy", "URL"
        ),
        "config.json: runtime_env deep in policy_kwargs": resumed(
            {"policy_kwargs": {"torso_kwargs": {"a": shell}}}, "torso_kwargs.a.runtime_env"
        ),
        "checkpoint kwargs: an unknown key": lambda: raises(BadInput, "hiddensizes", "takes no setting")(
            lambda: checked_policy_spec({"name": "gaussian", "kwargs": {"hiddensizes": [8]}}, "c.pt")
        ),
        "checkpoint kwargs: a module in a nested spec": lambda: raises(
            ValueError, "base.name", "not vla-gym's"
        )(
            lambda: checked_policy_spec(
                {"name": "residual", "kwargs": {"base": {"name": "os:system"}}}, "c.pt"
            )
        ),
    }


def data_semantics(probe: Probe) -> dict[str, Callable[[], None]]:
    """Data that would be read wrongly without a word is refused, naming the episode and the field
    (issue 47 class 4)."""
    import dataclasses

    import numpy as np

    from trainers.datasets.demos import Demos

    demos = tiny_demos()

    def changed(*words: str, **change: Any) -> Callable[[], None]:
        def call() -> None:
            episodes = list(demos.episodes)
            episodes[1] = dataclasses.replace(episodes[1], **change)
            Demos({}, episodes)

        return lambda: raises(BadInput, *words)(call)

    ep = demos.episodes[1]
    return {
        "complex-valued actions": changed("actions", "real numbers", actions=ep.actions.astype(np.complex64)),
        "NaN rewards": changed("rewards", "NaN", rewards=np.full(ep.rewards.shape, np.nan, np.float32)),
        "a 16-bit image": changed("uint16", obs={**ep.obs, "image": ep.obs["image"].astype(np.uint16) * 300}),
        "an instruction stored as bytes": changed("instruction", "string", instruction=b"pick up the bowl"),
        "inf in proprio": changed("proprio", "NaN", obs={**ep.obs, "proprio": ep.obs["proprio"] * np.inf}),
    }


def outputs(probe: Probe) -> dict[str, Callable[[], None]]:
    """One output rule for every writer (issue 47 class 5): an existing output needs --overwrite,
    which replaces only this project's own outputs, and never the source being read."""
    from trainers import demos as demos_cli
    from trainers.checkpoint import main as export
    from trainers.datasets.lerobot_write import write_lerobot

    root = probe.root / "outputs"
    root.mkdir(parents=True, exist_ok=True)
    mine = root / "thesis"
    mine.mkdir(exist_ok=True)
    (mine / "chapter1.tex").write_text("years of work")
    existing = root / "notes.h5"
    existing.write_text("a user's file")
    from trainers.checkpoint import latest_checkpoint
    from trainers.ppo import train as ppo_train

    run = root / "ppo-run"
    if not run.exists():  # a real (tiny) run's checkpoint
        ppo_train.main(
            ["--env", "CartPole-v1", "--num-envs", "2", "--n-steps", "16", "--batch-size", "32",
             "--total-steps", "32", "--eval-every", "-1", "--run-dir", str(run), "--no-progress",
             "--no-tensorboard", "--no-video"]
        )  # fmt: skip
    source = latest_checkpoint(run)[0]

    def kept(call: Callable[[], Any], *words: str) -> Callable[[], None]:
        def check() -> None:
            raises(BadInput, *words)(call)
            if (
                mine / "chapter1.tex"
            ).read_text() != "years of work" or existing.read_text() != "a user's file":
                raise AssertionError("a user's file was changed")

        return check

    demos_args = ["--env", "CartPole-v1", "--policy", "auto", "--episodes", "1", "--out", str(existing)]
    return {
        "trainers.demos --out EXISTING": kept(
            lambda: demos_cli.main(demos_args), "already exists", "--overwrite"
        ),
        "trainers.demos --out A_USERS_FILE --overwrite": kept(
            lambda: demos_cli.main([*demos_args, "--overwrite"]), "not a demos file that vla-gym wrote"
        ),
        "export-lerobot --overwrite onto a user's folder": kept(
            lambda: write_lerobot(tiny_demos(), mine, overwrite=True, progress=False), "not a LeRobot dataset"
        ),
        "python -m trainers.checkpoint SRC SRC": kept(
            lambda: export([str(source), str(source)]), "source being read"
        ),
    }


def one_error_type(probe: Probe) -> dict[str, Callable[[], None]]:
    """Bad input reaches the user as one error type (``nets.errors.BadInput``) naming the flag or file
    and the entry, before anything is written, and a command line reports it in one line with exit
    status 2 (issue 47 class 6)."""
    import numpy as np
    import torch

    from envs.core.frames import InitialFrame, load_initial_frames, save_initial_frames
    from nets.files import read_json
    from trainers import checkpoint as ckpt
    from trainers.__main__ import main as trainers_main

    root = probe.root / "one-error-type"
    root.mkdir(parents=True, exist_ok=True)
    fast = ["--no-progress", "--no-tensorboard", "--no-video", "--torch-threads", "1"]

    def run_args(name: str, *extra: str, algo: str = "ppo", env: str = "CartPole-v1") -> list[str]:
        return ["--algo", algo, "--env", env, "--num-envs", "2", "--total-steps", "64", "--eval-every", "-1",
                "--run-dir", str(root / name), *fast, *extra]  # fmt: skip

    def flag(
        name: str, extra: list[str], *words: str, algo: str = "ppo", env: str = "CartPole-v1"
    ) -> Callable:
        def check() -> None:
            raises(BadInput, *words)(lambda: trainers_main(run_args(name, *extra, algo=algo, env=env)))
            if (root / name).exists():
                raise AssertionError(f"{root / name} was written")

        return check

    run = root / "ppo-run"
    if not run.exists():
        trainers_main([*run_args("ppo-run"), "--checkpoint-every", "1"])

    def resumed(name: str, change: Callable[[dict], None], *words: str) -> Callable[[], None]:
        def check() -> None:
            copy = root / name
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(run, copy)
            path, data = ckpt.latest_checkpoint(copy)
            change(data)
            ckpt.save_checkpoint(path, data)  # signed: what an edit with this code's writer gives
            raises(BadInput, str(path), *words)(lambda: trainers_main(["--resume", str(copy), *fast]))

        return check

    def deep_json() -> None:
        path = root / "deep.json"
        path.write_text("[" * 100_000 + "]" * 100_000)
        raises(BadInput, "deep.json", "nested too deep")(lambda: read_json(path))

    def mixed_frames() -> None:
        frames = [InitialFrame(instruction="a", image=np.zeros((n, n, 3), np.uint8)) for n in (8, 16)]
        save_initial_frames(frames, root / "mixed")
        raises(BadInput, "frame_00001.npy", "image size")(lambda: load_initial_frames(root / "mixed"))

    def command_line() -> None:
        done = subprocess.run(
            [sys.executable, "-m", "trainers", *run_args("cli", "--seed", str(2**64))],
            capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[1],
        )  # fmt: skip
        last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
        if done.returncode != 2 or "Traceback" in done.stderr or "error: seed" not in last:
            raise AssertionError(f"exit {done.returncode}: {done.stderr[-300:]}")

    return {
        "--seed 2**64": flag("seed", ["--seed", str(2**64)], "seed", "2**32 - 1"),
        "--max-grad-norm nan": flag("nan", ["--max-grad-norm", "nan"], "max_grad_norm", "nan"),
        "--init-alpha inf": flag(
            "inf", ["--init-alpha", "inf"], "init_alpha", "finite", algo="sac", env="Pendulum-v1"
        ),
        "--batch-size 0": flag("batch", ["--batch-size", "0"], "batch_size", ">= 1"),
        "num_envs in --env-kwargs": flag(
            "kw1", ["--env-kwargs", '{"num_envs": 3}'], "num_envs", "--num-envs"
        ),
        "autoreset_mode in --env-kwargs": flag(
            "kw2", ["--env-kwargs", '{"autoreset_mode": "x"}'], "--autoreset-mode"
        ),
        "--device meta": flag("meta", ["--device", "meta"], "meta"),
        "an eval env of other spaces": lambda: raises(BadInput, "Acrobot-v1", "observation space")(
            lambda: trainers_main(run_args("eval", "--eval-env", "Acrobot-v1", "--eval-every", "0"))
        ),
        "resume: counters of the wrong type": resumed(
            "counters", lambda d: d["counters"].update(env_steps="64"), "counters['env_steps']"
        ),
        "resume: a garbage RNG state": resumed(
            "rng", lambda d: d["rng"].update(torch=torch.zeros(3, dtype=torch.uint8)), "entry 'rng'"
        ),
        "resume: optimizer groups that do not match": resumed(
            "optim",
            lambda d: d["optimizer"]["param_groups"].append(dict(d["optimizer"]["param_groups"][0])),
            "entry 'optimizer'",
        ),  # fmt: skip
        "JSON nested 10^5 deep": deep_json,
        "frames of two image sizes": mixed_frames,
        "the command line: one line, exit status 2": command_line,
    }


CATEGORIES: dict[str, Callable[[Probe], dict[str, Callable[[], None]]]] = {
    "untrusted files": untrusted_files,
    "constructor arguments": constructor_arguments,
    "call arguments": call_arguments,
    "closed envs": closed_envs,
    "saved env states": env_states,
    "faults": faults,
    "checkpoints": checkpoints,
    "run folders": run_folders,
    "process traps": process_traps,
    "declared sizes": declared_sizes,
    "malformed files": malformed_files,
    "settings": settings,
    "special files": special_files,
    "settings from files": settings_from_files,
    "data semantics": data_semantics,
    "outputs": outputs,
    "one error type": one_error_type,
}


def probe_all(categories: list[str], root: Path) -> dict[str, dict[str, str]]:
    """``{category: {case: "" if handled else what happened}}``."""
    from tqdm import tqdm

    probe = Probe(root)
    results: dict[str, dict[str, str]] = {}
    try:
        cases = [(c, name, fn) for c in categories for name, fn in CATEGORIES[c](probe).items()]
        for category, name, fn in tqdm(cases, desc="robustness", unit="case"):
            try:
                fn()
                outcome = ""
            except Exception as e:
                outcome = f"{type(e).__name__}: {e}"[:300]
            if probe.marker.exists():
                outcome = outcome or "the payload ran"
                probe.marker.unlink()
            results.setdefault(category, {})[name] = outcome
    finally:
        probe.close()
    return results


def main(argv: list[str] | None = None) -> dict[str, dict[str, str]]:
    parser = argparse.ArgumentParser(prog=program_name(), description=__doc__.split("\n\n")[0])
    parser.add_argument("--categories", nargs="+", choices=list(CATEGORIES), default=list(CATEGORIES))
    parser.add_argument("--out", type=Path, default=Path("outputs/robustness"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="robustness-") as tmp:
        results = probe_all(args.categories, Path(tmp))
    rows = [[c, len(r), sum(not v for v in r.values())] for c, r in results.items()]
    rows.append(["all", sum(r[1] for r in rows), sum(r[2] for r in rows)])
    print(
        table(["category", "tried", "handled"], rows, title="vla-gym robustness (cases handled as promised)")
    )
    for category, cases in results.items():
        for name, outcome in cases.items():
            if outcome:
                print(f"NOT HANDLED  {category} / {name}: {outcome}")
    write_json(args.out / "robustness.json", results)
    return results


if __name__ == "__main__":
    run_cli(main)

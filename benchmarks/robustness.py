"""How vla-gym takes bad input, faults, untrusted files and damaged checkpoints: cases tried and
handled as README promises, per category, as one table.

    python -m benchmarks.robustness                         # every category (~3 min on 2 cores)
    python -m benchmarks.robustness --categories checkpoints "untrusted files"

A case is handled when the promise holds: bad input raises a ``ValueError`` that names the
parameter; a file that asks to run code raises ``UnsafeFileError`` and the code never runs; a closed
env raises ``ClosedEnvError``; a failed worker is detected (a stopped one within its timeout), its
envs truncated with ``worker_restarted`` and reset later; a damaged checkpoint is refused or skipped
for the one before it, never loaded wrong. Each failing case is printed with what happened instead.
(Every case is also a test under ``tests/``; this script keeps the figures re-measurable.)
"""

from __future__ import annotations

import argparse
import io
import os
import pickle
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

        kwargs = {"image_size": (32, 48), **kwargs}
        return gym.make_vec(
            "CosmosWM-LiberoSpatial-v0", num_envs=1, model_dir=bundle or self.bundle, **kwargs
        )

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
        from policies.cosmos_policy.checkpoint import load_t5_embeddings

        path = probe.root / "t5_embeddings.pkl"
        with open(path, "wb") as f:
            pickle.dump({"pick": Payload(probe.marker)}, f)
        _refused(probe, lambda: load_t5_embeddings(path))

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
        f"LIBERO {k}={v!r}": lambda k=k, v=v: raises(ValueError, f"bad {k}: expected")(
            lambda: probe.libero(**{k: v})
        )
        for k, v in libero.items()
    }
    cases["LIBERO max_episode_steps=-5"] = lambda: raises(ValueError, "bad max_episode_steps")(
        lambda: probe.libero(max_episode_steps=-5)
    )
    cases["LIBERO chunk_size='4'"] = lambda: raises(ValueError, "bad chunk_size")(
        lambda: probe.libero(chunk_size="4")
    )
    cases["LIBERO task_ids=[99]"] = lambda: raises(ValueError, "task_ids must be in")(
        lambda: probe.libero(task_ids=[99])
    )
    world_model = {
        "image_size": (0, 0),
        "success_threshold": "x",
        "max_episode_steps": 0,
        "reward_coef": float("nan"),
    }
    for k, v in world_model.items():
        cases[f"world model {k}={v!r}"] = lambda k=k, v=v: raises(ValueError, f"bad {k}: expected")(
            lambda: probe.world_model(**{k: v})
        )
    cases["world model image_size=(-32, 48)"] = lambda: raises(ValueError, "bad image_size")(
        lambda: probe.world_model(image_size=(-32, 48))
    )
    return cases


def _with_state(env: Any, value: float) -> Any:
    from envs.core.frames import InitialFrame

    frame = env.initial_frames[1]
    state = frame.sim_state.copy()
    state[5] = value
    return InitialFrame(frame.instruction, task=frame.task, sim_state=state)


def call_arguments(probe: Probe) -> dict[str, Callable[[], None]]:
    from envs.core.frames import InitialFrame

    def unchanged(call: Callable[[Any], Any], *words: str) -> Callable[[], None]:
        def case() -> None:
            env = probe.shared_libero
            obs, _ = env.reset(options={"initial_frames": [2, 52]})
            raises(ValueError, *words)(lambda: call(env))
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
        "frame image 0x0": lambda: raises(ValueError, "H, W >= 1")(
            lambda: InitialFrame("pick", image=np.zeros((0, 0, 3), np.uint8))
        ),
        "world-model load_state(b'junk')": lambda: raises(ValueError, "bad state")(
            lambda: probe.world_model().unwrapped.load_state(b"junk")
        ),
    }


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
            raises(ValueError, *words)(lambda: call(wm, good))
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

    return {
        "worker killed mid-episode": killed_mid_episode,
        "worker killed twice in one reset": killed_twice_in_reset,
        "worker stopped (SIGSTOP)": stopped,
    }


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
        raises(ValueError, "corrupt checkpoint")(lambda: ckpt.load_checkpoint(path))

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
        raises(ValueError, "config.json: cannot read the config as JSON")(
            lambda: main(["--resume", str(run_dir)])
        )

    def foreign() -> None:
        torch.save({"weights": 1}, probe.root / "other.pt")
        raises(ValueError, "not a vla-gym checkpoint")(lambda: ckpt.load_checkpoint(probe.root / "other.pt"))

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


CATEGORIES: dict[str, Callable[[Probe], dict[str, Callable[[], None]]]] = {
    "untrusted files": untrusted_files,
    "constructor arguments": constructor_arguments,
    "call arguments": call_arguments,
    "closed envs": closed_envs,
    "saved env states": env_states,
    "faults": faults,
    "checkpoints": checkpoints,
    "process traps": process_traps,
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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
    main()

"""Write ``Demos`` as a world-model bundle's ``dataset/`` folder (RLinf's layout).

One ``.npy`` per episode (``dataset/episode_000000.npy``, ...): an object array with one dict per
observation of the episode (each chunk start; every step for demos recorded one action per step):

    image          uint8 (H, W, 3), upright (our envs' orientation)
    instruction    str
    task           str: the episode's task key, else its instruction
    delta_action   float32 (7,): the action executed from this observation (the chunk's first one)
    wrist_image    uint8 (H, W, 3)            when the demos have one
    sim_state      float64 (S,)               when the demos have simulator states
    action_chunk   float32 (K, 7), action_valid bool (K,)   for demos recorded in chunks (K > 1)
    meta           {"episode", "step", "initial_frame", "success"}

This is what ``envs.load_initial_frames`` reads (frame 0 of each file: an episode's start), so a
world-model env (``model_dir=...``) starts from these episodes, and RLinf's training code reads the
whole trajectories. The files are pickles by definition; ``nets.safe_load.load_npy`` reads them
without running code. The folder appears complete or not at all (staging folder, then a rename).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from nets.errors import BadInput
from nets.files import atomic_folder, check_output, only_entries
from trainers.datasets.demos import Demos, Episode

ACTION_DIM = 7  # RLinf's world models take LIBERO's 7-D actions


def _frames(n: int, ep: Episode) -> np.ndarray:
    if "image" not in ep.obs:
        raise BadInput(
            f"episode {n} has no 'image' observation (it has {list(ep.obs)}): a world model needs one"
        )
    c, k, d = ep.actions.shape
    if d != ACTION_DIM:
        raise BadInput(f"episode {n}: world-model datasets hold {ACTION_DIM}-D LIBERO actions, got {d}-D")
    image = ep.obs["image"]
    if image.dtype != np.uint8 or image.ndim != 4 or image.shape[-1] != 3 or len(image) != c:
        raise BadInput(f"episode {n}: 'image' must be uint8 [{c}, H, W, 3], got {image.dtype} {image.shape}")
    wrist = ep.obs.get("wrist_image")
    if ep.sim_states is not None and len(ep.sim_states) != c:
        raise BadInput(f"episode {n}: {len(ep.sim_states)} sim_states for {c} observations")
    if not ep.instruction:
        raise BadInput(f"episode {n} has no instruction")
    record = np.empty(c, dtype=object)
    for t in range(c):
        item: dict[str, Any] = {
            "image": np.ascontiguousarray(image[t]),
            "instruction": ep.instruction,
            "task": ep.task or ep.instruction,
            "delta_action": ep.actions[t, 0].astype(np.float32),
        }
        if wrist is not None:
            item["wrist_image"] = np.ascontiguousarray(wrist[t])
        if ep.sim_states is not None:
            item["sim_state"] = np.asarray(ep.sim_states[t], np.float64)
        if k > 1:
            item["action_chunk"] = ep.actions[t].astype(np.float32)
            item["action_valid"] = ep.valid[t].astype(bool)
        item["meta"] = {
            "episode": n,
            "step": t,
            "initial_frame": int(ep.initial_frame),
            "success": bool(ep.success),
        }
        record[t] = item
    return record


def write_world_model_dataset(
    demos: Demos, out: str | Path, *, overwrite: bool = False, progress: bool = True
) -> Path:
    """Write ``demos`` as ``out/dataset/episode_*.npy`` (``out``: a world-model bundle folder, or
    any folder); return the ``dataset`` folder. An existing one is replaced only with ``overwrite``."""
    from tqdm.auto import tqdm

    if not demos.episodes:
        raise BadInput("no episodes to export")
    root = Path(out)
    target = root / "dataset"
    check_output(
        target,
        overwrite=overwrite,
        ours=lambda d: only_entries(d, [p.name for p in d.glob("*.npy")]),
        what="a world-model dataset folder (.npy files only)",
    )
    root.mkdir(parents=True, exist_ok=True)
    # staging folder, fsynced, then swapped in: the old folder goes only once the new one is complete
    with atomic_folder(target) as staging:
        for n, ep in enumerate(
            tqdm(demos.episodes, desc="world-model dataset", disable=not progress, unit="episode")
        ):
            np.save(staging / f"episode_{n:06d}.npy", _frames(n, ep), allow_pickle=True)
    return target

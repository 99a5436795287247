"""What a trained world model (OpenSora or Cosmos) learned, in pixels, on held-out episodes: the error of
its imagined frames per horizon step on the pixels that actually change, against copying the last context
frame, the untrained model and the bundle its training started from (issue 49).

    python -m benchmarks.wm_pixels --bundle runs/world_model_opensora_tiny/bundle \\
        --demos data/libero_spatial_expert_64px_steps.h5 --max-clips 64 --json runs/benchmarks/wm_pixels.json

Clips are cut from the held-out episodes as the trainer cuts them (``trainers.world_model.data``: the
``condition_frames`` frames up to step ``s``, the first frame repeated before the episode starts, then the
chunk of actions ``s .. s + chunk - 1`` and the frames they lead to); the held-out episodes are those of
the bundle's ``training.json`` (``--episodes`` for a bundle without one, or demos it never saw), and
``--max-clips`` of their clips are taken evenly spaced, in order. Each model imagines the chunk through
the env's own path (``benchmarks.wm_imagine``: ``OpenSoraWorldModel.generate``, RFLOW Euler steps, or
``CosmosWorldModel.generate``, the 2AB solver; VAE decode; the env's rounding to uint8) from its VAE's
encoding of the true context frames (OpenSora: ``condition_frames`` frames; Cosmos: the frame before the
chunk, and a chunk of the 12 actions its DiT takes, as it was trained); every model sees the same context
posterior samples (its VAE's, one seeded generator per batch) and the same sampling noise (another).

The metric is the mean absolute error in uint8 units (0..255), over the pixels and their 3 channels,
pooled over the clips (every pixel weighs the same), for each horizon step h = 1 .. chunk (the h-th
imagined frame) and for all of them pooled ("pooled"):

* ``MAE changing``: on the pixels whose true value at h differs from the last context frame by more
  than ``--threshold`` (0..255) on any channel: where something happened, so a model that predicts a
  static scene cannot score well by being right about the background;
* ``MAE all``: on every pixel; ``PSNR all``: ``10 log10(255^2 / MSE)`` of every pixel (dB);
* ``changing px``: how many pixels the mask holds, summed over the clips.

Rows: the bundle's model (``trained``); ``copy`` (the last true context frame, in pixels, never through
the VAE); ``untrained`` (the bundle's DiT configuration with a fresh initialization, the same VAE and
action statistics; drawn from the run's seed, as the trainer draws a fresh model); ``init-from`` (the
bundle ``training.json`` says training started from, or why there is none); ``trained, other clips'
actions`` (each clip imagined with the actions of the clip half the list away: equal to ``trained`` when
the model ignores its actions); ``copy through the VAE`` (the last context latent decoded: copy as the
model's decoder can show it); ``VAE round trip`` (the true target frames encoded and decoded: about the
best a model decoding through this VAE can do; Cosmos's video VAE encodes the frame before the chunk and
the chunk together, as the trainer encodes its clips).

``--reference decoded`` compares every row with the VAE round trip of the true frames instead (the mask
still from the true frames): the model's error beyond what its VAE loses, for a VAE whose floor hides
everything else (the tiny bundles' random VAE loses about 55 per pixel). ``--json`` also lists the clips
(episode, and step ``s``: the last context frame).
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from benchmarks.report import table, write_json
from benchmarks.wm_imagine import (
    COSMOS_FILES,
    OPENSORA_FILES,
    Imagination,
    backend_of,
    load_imagination,
    missing_files,
)
from nets.errors import BadInput, program_name, run_cli

if TYPE_CHECKING:
    from trainers.world_model.data import EpisodeFrames

METRICS = ("mae_changing", "mae_all", "psnr_all")
LABELS = {"mae_changing": "MAE changing", "mae_all": "MAE all", "psnr_all": "PSNR all"}


# ---- the measurement ---------------------------------------------------------------------------------------


def changing_mask(last_context: np.ndarray, targets: np.ndarray, threshold: float) -> np.ndarray:
    """``[N, K, H, W]`` bool: the pixels of ``targets`` (uint8 ``[N, K, H, W, 3]``) whose value differs from
    ``last_context`` (uint8 ``[N, H, W, 3]``) by more than ``threshold`` (0..255) on any channel."""
    diff = np.abs(targets.astype(np.int16) - last_context[:, None].astype(np.int16))
    return diff.max(axis=-1) > threshold


@dataclass
class ErrorSums:
    """Per-horizon sums over clips, so batches pool exactly: absolute errors on the changing pixels and on
    all, squared errors on all, and the counts they are divided by."""

    horizon: int
    abs_changing: np.ndarray = field(init=False)
    changing: np.ndarray = field(init=False)
    abs_all: np.ndarray = field(init=False)
    sq_all: np.ndarray = field(init=False)
    pixels: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        for name in ("abs_changing", "changing", "abs_all", "sq_all", "pixels"):
            setattr(self, name, np.zeros(self.horizon, np.float64))

    def add(self, predicted: np.ndarray, targets: np.ndarray, mask: np.ndarray) -> None:
        """Add a batch: ``predicted`` and ``targets`` uint8 ``[N, K, H, W, 3]``, ``mask`` ``[N, K, H, W]``."""
        if predicted.shape != targets.shape:
            raise ValueError(f"predicted {list(predicted.shape)} vs targets {list(targets.shape)}")
        error = np.abs(predicted.astype(np.float64) - targets.astype(np.float64))  # [N, K, H, W, 3]
        per_pixel = error.sum(-1)  # the 3 channels
        self.abs_changing += (per_pixel * mask).sum(axis=(0, 2, 3))
        self.changing += mask.sum(axis=(0, 2, 3))
        self.abs_all += per_pixel.sum(axis=(0, 2, 3))
        self.sq_all += (error**2).sum(axis=(0, 2, 3, 4))
        self.pixels += np.prod(mask.shape[2:]) * mask.shape[0]

    def summary(self) -> dict[str, Any]:
        """Per-horizon lists and the pooled value (``all``) of each metric; None where it is undefined
        (no changing pixel; PSNR of identical frames)."""

        def ratio(num: np.ndarray, den: np.ndarray) -> float | None:
            return float(num / den) if den > 0 else None

        def psnr(sq: float, count: float) -> float | None:
            mse = sq / count if count > 0 else math.nan
            return 10 * math.log10(255.0**2 / mse) if mse > 0 else None

        out: dict[str, Any] = {}
        for h in [*range(self.horizon), None]:  # None: all horizons pooled
            pick = slice(None) if h is None else h
            a_c, n_c = self.abs_changing[pick].sum(), self.changing[pick].sum()
            a, sq, n = self.abs_all[pick].sum(), self.sq_all[pick].sum(), self.pixels[pick].sum()
            values = {
                "mae_changing": ratio(a_c, 3 * n_c),
                "mae_all": ratio(a, 3 * n),
                "psnr_all": psnr(sq, 3 * n),
            }
            for name, value in values.items():
                if h is None:
                    out[f"{name}_pooled"] = value
                else:
                    out.setdefault(name, []).append(value)
        return out


# ---- the bundle, its split, its models ---------------------------------------------------------------------


@dataclass
class Bundle:
    """A world-model bundle as this benchmark reads it."""

    root: Path
    backend: str  # "opensora" or "cosmos" (benchmarks.wm_imagine)
    record: dict[str, Any]  # training.json ({} for RLinf's bundles)
    image_size: tuple[int, int]
    chunk: int


def read_bundle(root: str | Path, what: str = "--bundle") -> Bundle:
    """The bundle at ``root`` checked for what the benchmark loads (a ``BadInput`` naming what is missing)."""
    from trainers.world_model.cosmos_model import MODEL_ACTIONS
    from trainers.world_model.cosmos_model import RLINF_IMAGE_SIZE as COSMOS_IMAGE_SIZE
    from trainers.world_model.model import RLINF_CHUNK, RLINF_IMAGE_SIZE, bundle_record

    root = Path(root)
    expected = f"{', '.join(OPENSORA_FILES)} (OpenSora) or {', '.join(COSMOS_FILES)} (Cosmos)"
    if not root.is_dir():
        raise BadInput(f"{what} {root}: no such folder (expected a world-model bundle: {expected})")
    backend = backend_of(root)
    missing = missing_files(root, backend)
    if backend is None or missing:
        kind = {"cosmos": "a Cosmos", "opensora": "an OpenSora"}.get(backend or "", "a")
        raise BadInput(
            f"{what} {root}: not {kind} world-model bundle (no {', '.join(missing)}; expected {expected})"
        )
    record = bundle_record(root)
    default_size, default_chunk = {"opensora": (RLINF_IMAGE_SIZE, RLINF_CHUNK),
                                   "cosmos": (COSMOS_IMAGE_SIZE, MODEL_ACTIONS)}[backend]  # fmt: skip
    size = tuple(record["image_size"]) if record else default_size
    chunk = record["chunk"] if record else default_chunk
    return Bundle(root, backend, record, (int(size[0]), int(size[1])), int(chunk))


def load_model(bundle: Bundle, *, num_steps: int, batch_size: int, device: str) -> Imagination:
    """The bundle's model as its env loads it (fp32), through ``benchmarks.wm_imagine``."""
    return load_imagination(bundle.root, bundle.backend, image_size=bundle.image_size, chunk=bundle.chunk,
                            num_steps=num_steps, batch_size=batch_size, device=device)  # fmt: skip


def held_out_episodes(bundle: Bundle, count: int, frames: int, episodes: str | None) -> tuple[list[int], str]:
    """The episodes to measure on and where that choice comes from: ``--episodes`` (indices or "all"),
    else the held-out split in ``training.json``, checked to fit these demos (``count`` episodes,
    ``frames`` executed steps in all)."""
    if episodes is not None:
        if episodes.strip() == "all":
            return list(range(count)), "--episodes all" + trained_on_note(
                bundle, list(range(count)), count, frames
            )
        try:
            chosen = sorted({int(e) for e in episodes.split(",") if e.strip()})
        except ValueError:
            raise BadInput(f"--episodes: expected 'all' or indices like 2,5, got {episodes!r}") from None
        bad = [e for e in chosen if not 0 <= e < count]
        if not chosen or bad:
            raise BadInput(f"--episodes {episodes}: expected indices in 0..{count - 1} (the demos' episodes)")
        return chosen, "--episodes" + trained_on_note(bundle, chosen, count, frames)
    split = bundle.record.get("episodes")
    if not bundle.record or not isinstance(split, dict):
        raise BadInput(
            f"--bundle {bundle.root}: no training.json with the held-out episodes; pass --episodes "
            "(indices of the demos' episodes the model never trained on, or 'all')"
        )
    held, train = list(split.get("held_out") or []), list(split.get("train") or [])
    if not held:
        raise BadInput(
            f"{bundle.root}/training.json: the run held out no episode (val_fraction 0); pass --episodes "
            "with demos it never trained on"
        )
    trained_on = bundle.record.get("frames")
    if len(held) + len(train) != count or (trained_on is not None and trained_on != frames):
        raise BadInput(
            f"--demos: {count} episodes, {frames} frames; the bundle trained on {len(held) + len(train)} "
            f"episodes, {trained_on} frames ({bundle.record.get('demos')}): not the demos of its split; pass "
            "those demos, or --episodes for demos it never trained on"
        )
    return sorted(held), "training.json"


def trained_on_note(bundle: Bundle, chosen: list[int], count: int, frames: int) -> str:
    """A warning when chosen episodes are ones the run trained on (these demos being its demos: the same
    episode and frame counts as ``training.json``'s)."""
    split = bundle.record.get("episodes") if bundle.record else None
    if not isinstance(split, dict) or bundle.record.get("frames") != frames:
        return ""
    train = list(split.get("train") or [])
    if len(train) + len(split.get("held_out") or []) != count:
        return ""
    seen = sorted(set(chosen) & set(train))
    return f"; NOT HELD OUT: the run trained on episodes {seen}" if seen else ""


@dataclass
class Clips:
    """The measured clips: true context and target frames (uint8), the actions (env units)."""

    context: np.ndarray  # [N, condition_frames, H, W, 3]
    targets: np.ndarray  # [N, chunk, H, W, 3]
    actions: np.ndarray  # [N, chunk, D]
    where: list[tuple[int, int]]  # (episode, step s) of each clip


def cut_clips(
    episodes: list[EpisodeFrames], chosen: list[int], condition_frames: int, chunk: int, max_clips: int
) -> Clips:
    """Every clip of the ``chosen`` episodes as the trainer cuts them, then ``max_clips`` evenly spaced."""
    from trainers.world_model.data import clip_indices

    eps = [episodes[i] for i in chosen]
    frame_index, action_index = clip_indices([len(ep.frames) for ep in eps], condition_frames, chunk)
    picks = np.unique(
        np.linspace(0, len(frame_index) - 1, min(max_clips, len(frame_index))).round().astype(int)
    )
    frames = np.concatenate([ep.frames for ep in eps])
    actions = np.concatenate([ep.actions for ep in eps])
    starts = np.cumsum([0] + [len(ep.frames) for ep in eps])
    where = []
    for row in picks:
        first_action = int(action_index[row, 0])  # = s in the laid-end-to-end numbering
        n = int(np.searchsorted(starts, first_action, side="right") - 1)
        where.append((chosen[n], first_action - int(starts[n])))
    windows = frames[frame_index[picks]]
    return Clips(
        windows[:, :condition_frames], windows[:, condition_frames:], actions[action_index[picks]], where
    )


# ---- running the methods -----------------------------------------------------------------------------------


@dataclass
class Method:
    """One row group: a model to sample, or a fixed prediction; ``note`` instead of numbers when absent."""

    key: str
    label: str
    model: Imagination | None = None
    note: str | None = None
    sums: ErrorSums | None = None


def init_from_method(bundle: Bundle, override: str | None, **load: Any) -> Method:
    """The bundle training started from, or a row saying why there is none."""
    origin = override
    if origin is None:
        if not bundle.record:
            return Method("init_from", "init-from", note="unknown: the bundle has no training.json")
        origin = bundle.record.get("init_from")
        if not origin:
            return Method("init_from", "init-from", note="none: trained from scratch")
    if not Path(origin).is_dir():
        return Method("init_from", f"init-from {origin}", note="absent: no such folder here")
    try:
        start = read_bundle(origin, "init-from")
        same = (start.backend, start.image_size, start.chunk) == (
            bundle.backend,
            bundle.image_size,
            bundle.chunk,
        )
        if not same:
            note = "unusable: another world model, frame size or chunk"
            return Method("init_from", f"init-from {origin}", note=note)
        return Method("init_from", f"init-from {origin}", model=load_model(start, **load))
    except (BadInput, FileNotFoundError) as e:
        return Method("init_from", f"init-from {origin}", note=f"unloadable: {e}")


def evaluate(
    methods: list[Method],
    clips: Clips,
    reference_model: Imagination,
    *,
    threshold: float,
    batch_size: int,
    seed: int,
    reference: str = "truth",
    progress: bool = True,
) -> np.ndarray:
    """Fill every method's ``sums`` over the clips, in batches; returns the changing-pixel counts per
    horizon (summed over clips). ``reference``: what the predictions are compared with, the true frames
    ("truth") or their VAE round trip ("decoded": the model's error beyond what its VAE loses; the
    changing-pixel mask stays the true frames'). ``reference_model`` (the trained one) gives the VAE rows."""
    from tqdm.auto import tqdm

    n, chunk = clips.targets.shape[:2]
    other = np.roll(np.arange(n), n // 2)  # each clip gets the actions of the clip half the list away
    for m in methods:
        m.sums = ErrorSums(chunk) if m.note is None else None
    sampled = [m for m in methods if m.model is not None]
    bar = tqdm(total=n * len(sampled), desc="imagine", unit="clip", disable=not progress, dynamic_ncols=True)
    changing = np.zeros(chunk, np.int64)
    try:
        for b, start in enumerate(range(0, n, batch_size)):
            rows = np.arange(start, min(start + batch_size, n))
            context, targets = clips.context[rows], clips.targets[rows]
            mask = changing_mask(context[:, -1], targets, threshold)
            changing += mask.sum(axis=(0, 2, 3))
            # one seed pair per batch: every model sees the same posterior samples and sampling noise
            seeds = (seed * 1_000_003 + 2 * b, seed * 1_000_003 + 2 * b + 1)
            last = context[:, -1]
            compared = (
                targets if reference == "truth" else reference_model.round_trip(last, targets, seeds[0])
            )
            for m in methods:
                if m.sums is None:
                    continue
                if m.key == "copy":
                    predicted = np.repeat(context[:, -1:], chunk, axis=1)
                elif m.key == "copy_through_vae":
                    predicted = reference_model.copy_through_vae(last, chunk, seeds[0])
                elif m.key == "vae_roundtrip":
                    predicted = reference_model.round_trip(last, targets, seeds[0])
                else:
                    actions = clips.actions[other[rows] if m.key == "trained_other_actions" else rows]
                    predicted = m.model.imagine(context, actions, *seeds)
                    bar.update(len(rows))
                m.sums.add(predicted, compared, mask)
    finally:
        bar.close()
    return changing


def format_table(methods: list[Method], results: dict[str, Any], changing: np.ndarray, title: str) -> str:
    """One table: a row per (method, metric), a column per horizon step and one for all of them."""

    def cell(value: float | None, metric: str) -> str:
        if value is None:
            return "inf" if metric == "psnr_all" else "-"
        return f"{value:.2f}"

    chunk = len(changing)
    header = ["method", "metric", *(f"h={h}" for h in range(1, chunk + 1)), "pooled"]
    rows: list[list[Any]] = [["(truth)", "changing px", *(int(c) for c in changing), int(changing.sum())]]
    for m in methods:
        r = results[m.key]
        if m.note is not None:
            rows.append([m.label, m.note, *["-"] * (chunk + 1)])
            continue
        for metric in METRICS:
            values = [*r[metric], r[f"{metric}_pooled"]]
            rows.append([m.label, LABELS[metric], *(cell(v, metric) for v in values)])
    return table(header, rows, title)


# ---- the command line --------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=program_name(), description=__doc__.splitlines()[0])
    parser.add_argument(
        "--bundle", required=True, help="the trained world-model bundle (model_dir of the env)"
    )
    parser.add_argument(
        "--demos", default=None, help="demos with the held-out episodes (default: training.json's)"
    )
    parser.add_argument("--image-key", default="image", help="the observation holding the camera frame")
    parser.add_argument(
        "--episodes",
        default=None,
        help="episodes to measure on (2,5 or all; default: training.json's held-out)",
    )
    parser.add_argument(
        "--init-from", default=None, help="the bundle training started from (default: training.json's)"
    )
    parser.add_argument(
        "--max-clips", type=int, default=64, help="clips measured, evenly spaced (bounds the time)"
    )
    parser.add_argument(
        "--threshold",
        type=float,
        default=8.0,
        help="a pixel changes when a channel moves by more than this (0..255) from the last context frame",
    )
    parser.add_argument(
        "--reference",
        choices=("truth", "decoded"),
        default="truth",
        help="compare with the true frames, or their VAE round trip (the error beyond the VAE's)",
    )
    parser.add_argument(
        "--num-steps",
        type=int,
        default=10,
        help="sampler steps: OpenSora's RFLOW Euler, Cosmos's 2AB (the envs' default: 10)",
    )
    parser.add_argument("--batch-size", type=int, default=8, help="clips per model call")
    parser.add_argument("--seed", type=int, default=0, help="sampling noise and posterior samples")
    parser.add_argument(
        "--untrained-seed",
        type=int,
        default=None,
        help="the untrained model's initialization (default: the run's seed in training.json, else 0)",
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--torch-threads", type=int, default=0, help="torch intra-op threads (0: torch's default)"
    )
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--no-progress", dest="progress", action="store_false")
    args = parser.parse_args(argv)
    for name in ("max_clips", "num_steps", "batch_size"):
        if getattr(args, name) < 1:
            raise BadInput(f"--{name.replace('_', '-')}: expected >= 1, got {getattr(args, name)}")
    if not 0 <= args.threshold < 255:
        raise BadInput(f"--threshold: expected a value in [0, 255) (uint8 units), got {args.threshold}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from trainers.datasets import load_demos
    from trainers.world_model.data import read_episodes

    args = parse_args(argv)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    clock = time.perf_counter()
    bundle = read_bundle(args.bundle)
    demos_path = args.demos or bundle.record.get("demos")
    if not demos_path:
        raise BadInput("--demos: not given, and the bundle has no training.json naming its demos")
    if not Path(demos_path).exists():
        origin = "--demos" if args.demos else f"--demos (training.json's, {bundle.root}/training.json)"
        raise BadInput(f"{origin} {demos_path}: no such file; pass --demos with the episodes to measure on")
    load = {"num_steps": args.num_steps, "batch_size": args.batch_size, "device": args.device}
    model = load_model(bundle, **load)

    # the demos, checked against the model (frame size, action dimension, context + one chunk)
    episodes = read_episodes(
        load_demos(demos_path),
        source=str(demos_path),
        image_key=args.image_key,
        image_size=bundle.image_size,
        action_dim=model.action_dim,
        condition_frames=model.condition_frames,
        chunk=bundle.chunk,
    )
    chosen, split = held_out_episodes(
        bundle, len(episodes), sum(len(ep.frames) for ep in episodes), args.episodes
    )
    clips = cut_clips(episodes, chosen, model.condition_frames, bundle.chunk, args.max_clips)

    run_seed = bundle.record.get("config", {}).get("seed", 0) if bundle.record else 0
    untrained_seed = run_seed if args.untrained_seed is None else args.untrained_seed
    untrained = model.fresh(untrained_seed)
    floor = "floor" if args.reference == "truth" else "the reference itself"
    methods = [
        Method("trained", "trained (the bundle)", model=model),
        Method("copy", "copy last context frame"),
        Method("untrained", f"untrained (fresh init, seed {untrained_seed})", model=untrained),
        init_from_method(bundle, args.init_from, **load),
        Method("trained_other_actions", "trained, other clips' actions", model=model),
        Method("copy_through_vae", "copy through the VAE"),
        Method("vae_roundtrip", f"VAE round trip of the truth ({floor})"),
    ]
    changing = evaluate(
        methods,
        clips,
        model,
        threshold=args.threshold,
        batch_size=args.batch_size,
        seed=args.seed,
        reference=args.reference,
        progress=args.progress,
    )

    results = {
        m.key: {"label": m.label, "note": m.note, **(m.sums.summary() if m.sums else {})} for m in methods
    }
    h, w = bundle.image_size
    against = "the true frames" if args.reference == "truth" else "the true frames' VAE round trip"
    title = (
        f"{bundle.root}: {len(clips.where)} clips of episodes {chosen} ({split}), "
        f"{model.condition_frames} context frames + chunk {bundle.chunk}, {args.num_steps} sampler steps\n"
        f"mean absolute error (0..255) against {against} per horizon step h; changing: a channel moves "
        f"> {args.threshold:g} from the last context frame (of {len(clips.where)} x {h * w} px per h)"
    )
    text = format_table(methods, results, changing, title)
    print(text)
    result = {
        "command": shlex.join(
            ["python", "-m", "benchmarks.wm_pixels", *(sys.argv[1:] if argv is None else argv)]
        ),
        "bundle": str(bundle.root),
        "demos": str(demos_path),
        "episodes": chosen,
        "split": split,
        "clips": [{"episode": e, "step": s} for e, s in clips.where],
        "metric": "mean absolute error, uint8 units (0..255), pooled over pixels, channels and clips",
        "reference": args.reference,
        "threshold": args.threshold,
        "horizons": list(range(1, bundle.chunk + 1)),
        "pixels_per_frame": h * w,
        "changing_pixels": changing.tolist(),
        "methods": results,
        "settings": {k: v for k, v in vars(args).items() if k != "progress"},
        "wall_s": time.perf_counter() - clock,
        "table": text,
    }
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    run_cli(main)

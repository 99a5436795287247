"""Train the world models' success classifier on labelled frames, and measure it on held-out episodes.

The steps, top to bottom: hold out whole episodes (``split_episodes``), train with balanced
batches and augmentation (``train_reward_model``), score the held-out frames (``predict``), and
compare with the simulator's labels frame by frame (``frame_metrics``) and episode by episode
(``episode_metrics``). ``run`` strings them together for the command line (``__main__``).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F

from nets.errors import BadInput
from nets.files import check_output, only_entries, write_atomic
from nets.resnet_rm import DEFAULT_WIDTH, ResnetRewardModel, check_width, nonfinite_entries
from trainers.reward_model.augment import Augment, augment, resize_frames, to_model_input
from trainers.reward_model.collect import FrameSet

MODEL_FILE, REPORT_JSON, REPORT_MD, FRAMES_FILE = "resnet_rm.pth", "report.json", "report.md", "frames.h5"
LIBERO_ENV_KWARGS = {  # the LIBERO camera at the world models' frame size, and frames past the success
    "image_size": [256, 256],
    "cameras": ["agentview"],
    "proprio": False,
    "include_instruction": False,
    "task_state": True,  # what the scripted expert reads
    "chunk_size": 2,  # a frame every 2 sub-steps (the expert holds each action for the chunk)
    "steps_after_success": 40,  # 20 frames of the solved scene per successful episode
}


@dataclass
class RewardModelConfig:
    """Settings of ``python -m trainers.reward_model``."""

    # -- collection
    env: str = "envs:Libero-Spatial-v0"
    """any registered id whose info reports success ('module:Id' imports module first)"""
    env_kwargs: dict[str, Any] = field(default_factory=lambda: dict(LIBERO_ENV_KWARGS))
    """JSON object"""
    policy: list[str] = field(
        default_factory=lambda: ["libero_expert,episodes=36", "libero_expert,noise=0.3,episodes=24"]
    )
    """policy specs NAME[,episodes=N,noise=S,...] (repeat --policy for a mix; see collect.py)"""
    num_envs: int = 2
    """envs collecting in parallel"""
    image_key: str = "image"
    """the observation holding the camera frame"""
    sub_steps: bool = False
    """a frame after every sub-step (info['frames']), not only per chunk"""
    frames: str | None = None
    """train from this frame file instead of collecting"""
    collect_only: bool = False
    """stop after writing <out>/frames.h5"""
    # -- model and training
    frame_size: tuple[int, int] = (256, 256)
    """the world model's frames (OpenSora 256x256, Cosmos 256x320)"""
    width: int | None = None
    """base channels: 64 (RLinf's ResNet-18) unless init_from says otherwise"""
    init_from: str | None = None
    """start from this resnet_rm.pth (e.g. a bundle's) instead of random weights"""
    steps: int = 3000
    """optimizer steps (AdamW, warm-up then cosine decay)"""
    batch_size: int = 32
    """frames per optimizer step"""
    lr: float = 1e-3
    """AdamW peak learning rate (after the warm-up, before the cosine decay)"""
    weight_decay: float = 1e-4
    """AdamW weight decay"""
    balance: Literal["sampler", "loss", "none"] = "sampler"
    """balanced batches, or a weighted loss"""
    augment: bool = True
    """shifts, colour jitter, blur, noise (augment.py): toward world-model frames"""
    held_out: float = 0.2
    """fraction of episodes (grouped by start frame) kept for the report"""
    eval_every: int = 500
    """steps between held-out measurements logged to TensorBoard (0: only at the end)"""
    seed: int = 0
    """collection (start frames, noise), split and training"""
    device: str = "cpu"
    """where the network trains ("cuda" on a GPU)"""
    torch_threads: int | None = None
    """torch intra-op threads (None: torch's default)"""
    # -- output
    out: str = "runs/reward_model"
    """resnet_rm.pth, report.json / .md, frames.h5, metrics.jsonl, tb/"""
    overwrite: bool = False
    """write into an existing --out (only a folder of the reward model's own files)"""
    tensorboard: bool = True
    """TensorBoard event files in <out>/tb"""
    progress: bool = True
    """progress bars"""


# ---------------------------------------------------------------------------- split
def split_episodes(fs: FrameSet, held_out: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Episode indices ``(train, held_out)``. Episodes from the same start frame stay on one side;
    successful and failed episodes are held out in the same proportion."""
    n = fs.num_episodes
    starts = fs.episodes["initial_frame"]
    keys = np.where(starts >= 0, starts, -1 - np.arange(n))  # no start frame: its own group
    groups: dict[int, list[int]] = {}
    for ep, key in enumerate(keys.tolist()):
        groups.setdefault(key, []).append(ep)
    rng = np.random.default_rng(seed)
    held: list[int] = []
    solved = fs.episodes["success_once"].astype(bool)
    for stratum in (True, False):
        members = [g for g in groups.values() if solved[g].any() == stratum]
        rng.shuffle(members)
        take = int(round(held_out * len(members))) if len(members) > 1 else 0
        held += [ep for g in members[:take] for ep in g]
    held_arr = np.array(sorted(held), np.int64)
    train_arr = np.setdiff1d(np.arange(n), held_arr)
    for name, eps in (("training", train_arr), ("held-out", held_arr)):
        labels = fs.labels[np.isin(fs.episode, eps)]
        if not labels.any() or labels.all():
            raise BadInput(
                f"the {name} episodes need frames of both labels: {n} episodes ({int(solved.sum())} "
                f"successful) are too few to hold out {held_out:.0%}; collect more episodes"
            )
    return train_arr, held_arr


# ---------------------------------------------------------------------------- training
def build_model(width: int | None, init_from: str | None, seed: int = 0) -> ResnetRewardModel:
    """A trainable reward model: random weights of ``width`` (default 64) drawn with ``seed``, or
    ``init_from``'s."""
    if width is not None:
        check_width(width)
    if init_from is None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = ResnetRewardModel(width=width or DEFAULT_WIDTH, frozen=False)
    else:
        try:  # refused there if any weight is NaN or inf: training would only spread it
            model = ResnetRewardModel.from_checkpoint(init_from, width=width)
        except ValueError as e:
            raise BadInput(f"init_from: {e}") from None
        model.frozen = False
    return model


def train_reward_model(
    model: ResnetRewardModel,
    frames: torch.Tensor,
    labels: np.ndarray,
    cfg: RewardModelConfig,
    *,
    indices: np.ndarray | None = None,
    log: Callable[[int, dict[str, float]], None] | None = None,
    on_eval: Callable[[int], dict[str, float]] | None = None,
) -> ResnetRewardModel:
    """Train ``model`` on uint8 ``frames`` ``[M, H, W, 3]`` with ``labels`` ``[M]`` (only the frames
    ``indices``, default all) for ``cfg.steps`` steps: AdamW, a short warm-up then cosine decay,
    batches drawn with replacement (class-balanced with ``balance="sampler"``), augmented
    (``cfg.augment``). ``on_eval(step)`` runs every ``cfg.eval_every`` steps; its numbers are logged."""
    from tqdm import tqdm

    device = torch.device(cfg.device)
    model.to(device).train()
    pool = torch.as_tensor(np.arange(len(labels)) if indices is None else indices, dtype=torch.long)
    y = torch.as_tensor(np.asarray(labels)[pool.numpy()], dtype=torch.float32)
    positives = float(y.sum())
    negatives = float(len(y) - positives)
    weights = torch.ones(len(y), dtype=torch.float64)
    if cfg.balance == "sampler":  # each class half of every batch, in expectation
        weights = torch.where(y > 0, 1.0 / positives, 1.0 / negatives).double()
    pos_weight = torch.tensor(negatives / positives if cfg.balance == "loss" else 1.0, device=device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    warmup = max(1, cfg.steps // 20)

    def lr_at(step: int) -> float:
        if step < warmup:
            return cfg.lr * (step + 1) / warmup
        return cfg.lr * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, cfg.steps - warmup)))

    gen = torch.Generator().manual_seed(cfg.seed)
    aug = Augment() if cfg.augment else Augment.off()
    bar = tqdm(range(cfg.steps), desc="train", unit="step", disable=not cfg.progress, dynamic_ncols=True)
    running = None
    for step in bar:
        idx = torch.multinomial(weights, cfg.batch_size, replacement=True, generator=gen)
        x = augment(to_model_input(frames[pool[idx]]), aug, gen).to(device)
        target = y[idx].to(device)
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        logits = model.logits(x)
        loss = F.binary_cross_entropy_with_logits(logits, target, pos_weight=pos_weight)
        if not bool(torch.isfinite(loss)):
            raise FloatingPointError(
                f"reward model training: the loss of step {step} is {loss.item()} (expected a finite "
                f"number); the weights have diverged (try a lower lr than {cfg.lr}); no model is written"
            )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        value = loss.item()
        running = value if running is None else 0.95 * running + 0.05 * value
        bar.set_postfix(loss=f"{running:.3f}", refresh=False)
        if log is not None and (step % 20 == 0 or step == cfg.steps - 1):
            accuracy = float(((logits > 0).float() == target).float().mean())
            log(step, {"train/loss": value, "train/lr": lr_at(step), "train/batch_accuracy": accuracy})
        if (
            on_eval is not None
            and cfg.eval_every > 0
            and (step + 1) % cfg.eval_every == 0
            and step + 1 < cfg.steps
        ):
            numbers = on_eval(step + 1)
            model.train()
            if log is not None:
                log(step + 1, numbers)
    bar.close()
    model.eval()
    model.frozen = True
    return model


@torch.no_grad()
def predict(
    model: ResnetRewardModel,
    frames: torch.Tensor,
    batch: int = 64,
    blur_sigma: float = 0.0,
    progress: bool = False,
) -> np.ndarray:
    """``sigmoid(logit)`` of uint8 ``frames`` ``[M, H, W, 3]`` (optionally blurred first), eval mode."""
    from tqdm import tqdm

    from trainers.reward_model.augment import _gaussian_blur

    model.eval()
    out = []
    for i in tqdm(range(0, len(frames), batch), desc="score", disable=not progress, leave=False):
        x = to_model_input(frames[i : i + batch])
        if blur_sigma > 0:
            x = _gaussian_blur(x, torch.full((len(x),), blur_sigma))
        out.append(model.probability(x).cpu())
    return torch.cat(out).numpy() if out else np.zeros(0, np.float32)


# ---------------------------------------------------------------------------- measuring
def frame_metrics(labels: np.ndarray, predicted: np.ndarray) -> dict[str, float]:
    """Precision, recall, F1, accuracy and the confusion counts of ``predicted`` against ``labels``."""
    labels, predicted = np.asarray(labels, bool), np.asarray(predicted, bool)
    tp = int((labels & predicted).sum())
    fp = int((~labels & predicted).sum())
    fn = int((labels & ~predicted).sum())
    tn = int((~labels & ~predicted).sum())
    precision = tp / (tp + fp) if tp + fp else float("nan")
    recall = tp / (tp + fn) if tp + fn else float("nan")
    f1 = 2 * tp / (2 * tp + fp + fn) if tp else 0.0
    accuracy = (tp + tn) / max(len(labels), 1)
    return {"frames": len(labels), "positives": int(labels.sum()), "tp": tp, "fp": fp, "fn": fn, "tn": tn,
            "precision": precision, "recall": recall, "f1": f1, "accuracy": accuracy}  # fmt: skip


def episode_metrics(episode: np.ndarray, labels: np.ndarray, predicted: np.ndarray) -> dict[str, float]:
    """Episode-level agreement of the model with the simulator, per episode of ``episode`` ``[M]``:

    * ``any``: the model says success on some frame <=> the simulator's success on some frame (what
      ends a world-model episode as a success), with its confusion counts;
    * ``final``: the two decisions on the episode's last frame;
    * ``onset``: in episodes both call successful, the model's first positive frame minus the
      simulator's (frames; negative: early), as mean absolute and the share within +-1 frame.
    """
    agree_any = agree_final = 0
    counts = {"any_tp": 0, "any_fp": 0, "any_fn": 0, "any_tn": 0}
    offsets = []
    eps = np.unique(episode)
    for ep in eps:
        mask = episode == ep
        lab, pred = np.asarray(labels[mask], bool), np.asarray(predicted[mask], bool)
        sim_any, model_any = bool(lab.any()), bool(pred.any())
        agree_any += sim_any == model_any
        agree_final += bool(lab[-1]) == bool(pred[-1])
        counts[f"any_{'t' if sim_any == model_any else 'f'}{'p' if model_any else 'n'}"] += 1
        if sim_any and model_any:
            offsets.append(int(np.argmax(pred)) - int(np.argmax(lab)))
    n = max(len(eps), 1)
    off = np.abs(np.array(offsets)) if offsets else np.zeros(0)
    return {"episodes": len(eps), "any_agreement": agree_any / n, "final_agreement": agree_final / n,
            **counts,
            "onset_mean_abs_frames": float(off.mean()) if len(off) else float("nan"),
            "onset_within_1_frame": float((off <= 1).mean()) if len(off) else float("nan"),
            "onset_early_episodes": int(sum(o < 0 for o in offsets))}  # fmt: skip


def measure(
    model: ResnetRewardModel,
    frames: torch.Tensor,
    labels: np.ndarray,
    episode: np.ndarray,
    fs: FrameSet,
    blur_sigma: float = 1.5,
    progress: bool = False,
) -> dict[str, Any]:
    """Everything the report says about ``model`` on uint8 ``frames`` (at the model's frame size)
    with simulator ``labels`` and ``episode`` ids from ``fs``: frame metrics, the same with every frame
    blurred (``blur_sigma``, world-model-like softness), episode agreement, frame metrics per policy."""
    probs = predict(model, frames, progress=progress)
    predicted = probs >= 0.5
    policy = fs.episodes["policy"][episode]
    return {
        "frames": frame_metrics(labels, predicted),
        "frames_blurred": {
            "sigma": blur_sigma,
            **frame_metrics(labels, predict(model, frames, blur_sigma=blur_sigma) >= 0.5),
        },
        "episodes": episode_metrics(episode, labels, predicted),
        "by_policy": {
            name: frame_metrics(labels[policy == j], predicted[policy == j])
            for j, name in enumerate(fs.meta.get("policies", []))
            if (policy == j).any()
        },
    }


# ---------------------------------------------------------------------------- outputs
def save_reward_model(model: ResnetRewardModel, path: str | Path) -> Path:
    """Write ``model``'s state dict as ``resnet_rm.pth`` the world-model envs load (through a
    temporary file fsynced and renamed into place, ``nets.files.write_atomic``: a reader never sees
    half a file)."""
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    bad = nonfinite_entries(state)
    if bad:
        raise BadInput(
            f"{path}: not written: expected a reward model with finite weights, got NaN or inf in "
            f"{bad[:4]}{' and more' if len(bad) > 4 else ''}"
        )
    return write_atomic(path, lambda f: torch.save(state, f))


def _json_ready(value: Any) -> Any:
    """``value`` with NaN as null (strict JSON) and numpy scalars as Python numbers."""
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_ready(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_text(path: Path, text: str) -> None:
    write_atomic(path, text)


def format_report(report: dict[str, Any]) -> str:
    """The report as markdown: data, training, held-out frame and episode results."""
    d, f, e, t = report["data"], report["held_out_frames"], report["held_out_episodes"], report["training"]
    blur = report["held_out_frames_blurred"]
    lines = [
        f"# Reward model: {report['env']}",
        "",
        f"Width {t['width']} ({t['parameters']:,} parameters), {t['steps']} steps of {t['batch_size']}, "
        f"frames {d['frame_size'][0]}x{d['frame_size'][1]}; training {t['train_s']:.0f} s; collection "
        f"{d['collect_s']:.0f} s.",
        "",
        "| | episodes | successful | frames | positive |",
        "|---|---|---|---|---|",
        *[
            f"| {name} | {d[name]['episodes']} | {d[name]['successful']} | {d[name]['frames']} | "
            f"{d[name]['positives']} |"
            for name in ("train", "held_out")
        ],
        "",
        "Held-out frames (simulator label vs model):",
        "",
        "| | model: success | model: no success |",
        "|---|---|---|",
        f"| simulator: success | {f['tp']} | {f['fn']} |",
        f"| simulator: no success | {f['fp']} | {f['tn']} |",
        "",
        f"precision {f['precision']:.4f}, recall {f['recall']:.4f}, **F1 {f['f1']:.4f}**, accuracy "
        f"{f['accuracy']:.4f}; with a Gaussian blur (sigma {blur['sigma']}) on every frame: "
        f"F1 {blur['f1']:.4f}.",
        "",
        f"Held-out episodes ({e['episodes']}): 'some frame is a success' agrees with the simulator in "
        f"{e['any_agreement']:.1%} (model yes / sim no: {e['any_fp']}, model no / sim yes: {e['any_fn']}); "
        f"the final frame's decision in {e['final_agreement']:.1%}; first success frame off by "
        f"{e['onset_mean_abs_frames']:.2f} frames on average ({e['onset_within_1_frame']:.0%} within one).",
    ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- the whole job
def check_config(cfg: RewardModelConfig) -> list[Any]:
    """Every setting that can be checked before minutes of collection; returns the policy specs."""
    from trainers.reward_model.collect import check_policy_name, parse_policy_spec

    if cfg.width is not None:
        check_width(cfg.width)
    if cfg.init_from is not None and not Path(cfg.init_from).is_file():
        raise FileNotFoundError(
            f"init_from: no reward model file at {cfg.init_from} (expected a resnet_rm.pth)"
        )
    if cfg.frames is not None and not Path(cfg.frames).is_file():
        raise FileNotFoundError(
            f"frames: no frame file at {cfg.frames} (written by python -m trainers.reward_model)"
        )
    size = cfg.frame_size
    if len(size) != 2 or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 16 for s in size):
        raise BadInput(f"frame_size: expected [height, width], ints >= 16, got {size!r}")
    counts = (("steps", cfg.steps, 1), ("batch_size", cfg.batch_size, 2), ("num_envs", cfg.num_envs, 1),
              ("eval_every", cfg.eval_every, 0))  # fmt: skip
    for name, value, low in counts:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise BadInput(f"{name}: expected an int >= {low}, got {value!r}")
    if not 0 < cfg.held_out < 1:
        raise BadInput(f"held_out: expected a fraction in (0, 1), got {cfg.held_out!r}")
    if cfg.balance not in ("sampler", "loss", "none"):
        raise BadInput(f"balance: expected 'sampler', 'loss' or 'none', got {cfg.balance!r}")
    specs = [parse_policy_spec(text) for text in cfg.policy]
    if cfg.frames is None and not specs:
        raise BadInput("policy: expected at least one policy spec to collect frames with")
    for spec in specs:
        check_policy_name(spec)
    return specs


def collect(cfg: RewardModelConfig, specs: list[Any], path: Path) -> FrameSet:
    """Run the policy mix in ``cfg.env`` and write the labelled frames to ``path``."""
    from trainers.env_factory import make_vec_env
    from trainers.reward_model.collect import collect_frames, write_frames

    try:
        env = make_vec_env(cfg.env, cfg.num_envs, cfg.env_kwargs, autoreset="disabled_native")
    except Exception as e:
        if type(e).__name__ in (
            "NameNotFound",
            "NamespaceNotFound",
            "VersionNotFound",
            "ModuleNotFoundError",
        ):
            raise BadInput(
                f"unknown env {cfg.env!r}: expected a registered gymnasium id (e.g. "
                f"'envs:Libero-Spatial-v0'; 'module:Id' imports module first): {e}"
            ) from None
        raise
    meta = {"env": cfg.env, "env_kwargs": cfg.env_kwargs, "policies": [s.describe() for s in specs],
            "seed": cfg.seed, "sub_steps": cfg.sub_steps, "num_envs": cfg.num_envs}  # fmt: skip
    try:
        episodes = collect_frames(
            env, specs, seed=cfg.seed, image_key=cfg.image_key, sub_steps=cfg.sub_steps, progress=cfg.progress
        )
        return write_frames(path, episodes, meta)
    finally:
        env.close()


def run(cfg: RewardModelConfig) -> dict[str, Any]:
    """Collect (or read) frames, train, measure on held-out episodes, write the model and report.

    Returns the report (also in ``<out>/report.json`` and ``report.md``)."""
    from trainers.metrics import MetricsLogger
    from trainers.reward_model.collect import read_frames

    specs = check_config(cfg)
    own = {MODEL_FILE, REPORT_JSON, REPORT_MD, FRAMES_FILE, "metrics.jsonl", "tb"}
    check_output(
        cfg.out, overwrite=cfg.overwrite, ours=lambda d: only_entries(d, own), what="a reward-model folder"
    )
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    training = cfg.frames is not None or not cfg.collect_only
    # built before minutes of collection: an init_from that cannot start training is refused first
    model = build_model(cfg.width, cfg.init_from, cfg.seed) if training else None
    out = Path(cfg.out)
    if cfg.frames is not None:
        fs = read_frames(cfg.frames)
    else:
        fs = collect(cfg, specs, out / FRAMES_FILE)
        print(f"reward model: {len(fs.labels)} frames of {fs.num_episodes} episodes in {out / FRAMES_FILE} "
              f"({fs.meta['collect_s']:.0f} s)")  # fmt: skip
        if cfg.collect_only:
            return {"frames": str(out / FRAMES_FILE), "collect_s": fs.meta["collect_s"]}
    train_eps, held_eps = split_episodes(fs, cfg.held_out, cfg.seed)
    if model is None:  # not reached: without frames to train on, collect_only returned above
        model = build_model(cfg.width, cfg.init_from, cfg.seed)
    size = tuple(int(s) for s in cfg.frame_size)
    frames = torch.from_numpy(resize_frames(fs.frames, size))
    in_train, in_held = np.isin(fs.episode, train_eps), np.isin(fs.episode, held_eps)
    held_frames = frames[torch.from_numpy(in_held)]

    def held_out_numbers(step: int) -> dict[str, float]:
        m = frame_metrics(fs.labels[in_held], predict(model, held_frames) >= 0.5)
        return {f"eval/{k}": float(m[k]) for k in ("precision", "recall", "f1", "accuracy")}

    out.mkdir(parents=True, exist_ok=True)
    logger = MetricsLogger(out, tensorboard=cfg.tensorboard)
    start = time.perf_counter()
    try:
        train_reward_model(
            model,
            frames,
            fs.labels,
            cfg,
            indices=np.flatnonzero(in_train),
            log=logger.log,
            on_eval=held_out_numbers,
        )
        train_s = time.perf_counter() - start
        start = time.perf_counter()
        held = measure(model, held_frames, fs.labels[in_held], fs.episode[in_held], fs, progress=cfg.progress)
        eval_s = time.perf_counter() - start
        f = held["frames"]
        logger.log(cfg.steps, {f"eval/{k}": float(f[k]) for k in ("precision", "recall", "f1", "accuracy")})
    finally:
        logger.close()

    def split_numbers(eps: np.ndarray, mask: np.ndarray) -> dict[str, int]:
        return {"episodes": len(eps), "successful": int(fs.episodes["success_once"][eps].sum()),
                "frames": int(mask.sum()), "positives": int(fs.labels[mask].sum())}  # fmt: skip

    report = {
        "env": fs.meta.get("env"),
        "data": {"frames_file": str(cfg.frames or out / FRAMES_FILE),
                 "collect_s": fs.meta.get("collect_s", float("nan")),
                 "frame_size": list(size), "collected_size": list(fs.frames.shape[1:3]),
                 "env_kwargs": fs.meta.get("env_kwargs"), "policies": fs.meta.get("policies"),
                 "train": split_numbers(train_eps, in_train), "held_out": split_numbers(held_eps, in_held),
                 "train_initial_frames": sorted({int(i) for i in fs.episodes["initial_frame"][train_eps]})},
        "training": {"width": model.width, "parameters": sum(p.numel() for p in model.parameters()),
                     "steps": cfg.steps, "batch_size": cfg.batch_size, "lr": cfg.lr, "balance": cfg.balance,
                     "augment": cfg.augment, "init_from": cfg.init_from, "device": cfg.device,
                     "torch_threads": torch.get_num_threads(), "train_s": train_s, "eval_s": eval_s},
        "held_out_frames": held["frames"],
        "held_out_frames_blurred": held["frames_blurred"],
        "held_out_episodes": held["episodes"],
        "held_out_by_policy": held["by_policy"],
        "config": asdict(cfg),
    }  # fmt: skip
    save_reward_model(model, out / MODEL_FILE)
    write_text(out / REPORT_JSON, json.dumps(_json_ready(report), indent=2) + "\n")
    write_text(out / REPORT_MD, format_report(report))
    return report

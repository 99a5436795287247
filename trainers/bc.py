"""Behaviour cloning: train a small policy on demonstrations, then evaluate it in the env, in a run
directory like the RL trainers'.

``--demos`` is any format ``trainers.datasets.load_demos`` reads, told apart from the path: our
demos file (``trainers/datasets/demos.py``), LIBERO's HDF5 demonstration files (one, or a folder of them),
or a LeRobot v3.0 dataset folder.

    python -m trainers.bc --demos demos/spatial.h5 --env envs:Libero-Spatial-v0 \\
        --env-kwargs '{"image_size": 64}' --policy gaussian --policy-kwargs '{"squash": true}' --epochs 50

The loss is the policy's own ``imitation_loss`` (Gaussian: negative log-likelihood; binned:
token cross-entropy; flow: flow matching; categorical: cross-entropy) over every demonstrated
chunk, masked to the executed sub-steps; demos recorded one action per step are cut into chunks
of the env's size at every step (``Demos.chunks``). The policy is built for ``--env``'s spaces, so its
observation keys and action chunk must be in the demonstrations (e.g. demos recorded with
``task_state`` for the expert: the policy, without it, reads the image, proprio and instruction).
One iteration is one epoch; ``--total-steps`` is ignored (the run counts demonstrated sub-steps).
Episodes are split into training and held-out sets (``val_fraction``) for ``train/val_loss``.
The checkpoint starts RL: ``python -m trainers.grpo --init-policy RUN_DIR ...``.

Data parallel, as the RL trainers (``trainers/parallel.py``): ``torchrun --nproc-per-node N -m
trainers.bc ...`` with DDP, or ``--data-parallel fsdp`` (FSDP2; ``--fsdp-param-dtype``,
``--activation-checkpointing`` of the policy's ``fsdp_units``, e.g. a VLA's transformer blocks).
Every rank loads the demos and walks the same shuffled epoch (``epoch_order``, from the run seed);
each trains on its share of every minibatch of ``--batch-size`` rows (a multiple of N), and the
loss and its gradient are the whole minibatch's (``train_epoch``). Rank 0 writes the run folder;
the held-out loss and the evaluation are split over the ranks.

VLAs (``openvla``, ``openvla_oft``, ``pi05``, ``cosmos_policy``; any policy with ``imitation_loss``)
are fine-tuned the same way, with their recipe's loss (OpenVLA: teacher-forced token cross-entropy;
OpenVLA-OFT: token cross-entropy, or L1 with ``"action_head": "l1"``; pi0.5: flow matching; Cosmos
Policy: its denoising loss over the injected latent frames), and OpenVLA-OFT's step-size schedule is
there too (``--lr-warmup-steps``, ``--lr-decay-steps``). A policy class with ``norm_stats_from_demos``
gets its action (and proprio) normalisation statistics computed from the training demos
(``--norm-stats demos``, the default for a new policy) in the format its checkpoints carry: OpenVLA's
``dataset_statistics.json`` (``{unnorm_key: {"action": {q01, q99, mask, ...}, "proprio": {...}}}``,
key ``unnorm_key`` or ``"demos"``), openpi's ``norm_stats.json`` (mean, std, q01, q99 of ``actions``
and ``state``), Cosmos Policy's ``dataset_statistics.json`` (``actions_min/max``,
``proprio_min/max``). They go into the policy's arguments (``norm_stats``), so the run's checkpoints
carry them and the result loads anywhere with ``--init-policy`` or ``benchmarks.evaluate
--checkpoint``, and are written in that format beside them (``RUN/checkpoints/dataset_statistics.json``
/ ``norm_stats.json``).
``--norm-stats checkpoint`` keeps the model's own statistics.

Defaults: every optimizer setting left unset (batch size, step size and schedule, AdamW's betas, eps and
weight decay, clipping, the image shift) is the policy's fine-tuning recipe (``policy_recipe``): a VLA's
published one (``policies.options.FineTuneRecipe``, its numbers and sources beside each policy's
options: OpenVLA-OFT, OpenVLA, pi0.5, Cosmos Policy), whose ``policy_kwargs`` (loss head, LoRA rank) are
defaults of a new policy's keywords; else the generic one (1e-3, minibatches of 256). A model folder's
``fine_tune_recipe.json`` overrides the recipe: the tiny checkpoints (``policies/*/tiny.py``) carry one,
as the published batches (64 to 1920) and warmups (up to 10k steps) do not fit a few demos on a CPU; for
a real checkpoint on a few demos pass e.g. ``--batch-size 16 --lr-warmup-steps 0``. The recipe used is
printed at the start and saved, resolved, in the run's ``config.json``. Cosmos Policy without image
shift trains on VAE latents encoded once (``CosmosPolicy.cache_inputs``).

    python -m trainers.bc --demos demos/spatial.h5 --env envs:Libero-Spatial-v0 \
        --env-kwargs '{"image_size": 224, "cameras": ["agentview"], "chunk_size": 8}' \
        --policy openvla_oft --policy-kwargs '{"model_path": "ckpts/openvla-7b-oft", "action_head": "l1",
        "new_action_head": true, "lora_rank": 32}' --learning-rate 5e-4 --batch-size 8 --bf16
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from nets.errors import BadInput, run_cli
from policies.base import ActionChunkPolicy
from policies.options import RECIPE_FILE, FineTuneRecipe, lr_factor
from policies.registry import policy_class
from trainers import parallel
from trainers.config import parse_cli
from trainers.datasets import load_demos
from trainers.datasets.demos import Demos
from trainers.env_contract import chunk_size
from trainers.env_factory import make_vec_env
from trainers.files import write_atomic
from trainers.optim import EMA_KEY, BadUpdateGuard, WeightEMA, restore_ema, step_optimizer
from trainers.run import Run, RunConfig


@dataclass
class BCConfig:
    demos: str = "demos/demos.h5"
    """our demos file, a LIBERO HDF5 file or folder, or a LeRobot v3 folder"""
    epochs: int = 50
    """passes over the training demos"""
    batch_size: int | None = None
    """chunk-steps per minibatch (None: the policy's recipe; a VLA's published one is large: pass a
    smaller one for a few demos, e.g. 32)"""
    learning_rate: float | None = None
    """AdamW's peak step size (None: the policy's recipe, ``policies.options.FineTuneRecipe``)"""
    lr_schedule: Literal["step", "cosine", "linear"] | None = None
    """the step-size schedule (``FineTuneRecipe``'s docstring): "step", OpenVLA-OFT's warmup and 10x drop;
    "cosine", openpi's warmup and cosine decay; "linear", Cosmos Policy's warmup, linear decay and floor"""
    lr_warmup_steps: int | None = None
    """optimizer steps of linear warmup (0: none)"""
    lr_warmup_start: float | None = None
    """the warmup's first step size, a fraction of learning_rate ("step", "linear"; "cosine": 1/(warmup+1))"""
    lr_decay_steps: int | None = None
    """"step": the step after which the step size is lr_decay_to x (OpenVLA-OFT's num_steps_before_decay);
    "cosine" / "linear": where the decay reaches lr_decay_to (0: never)"""
    lr_decay_to: float | None = None
    """the factor reached at lr_decay_steps"""
    lr_after_decay: float | None = None
    """"linear": the factor after lr_decay_steps (Cosmos Policy's second cycle)"""
    weight_decay: float | None = None
    """AdamW weight decay"""
    adam_betas: tuple[float, float] | None = None
    """AdamW's (beta1, beta2)"""
    adam_eps: float | None = None
    """AdamW's epsilon"""
    max_grad_norm: float | None = None
    """clip the gradient norm per minibatch (0: no clipping)"""
    ema_decay: float = 0.0
    """an exponential moving average of the weights, updated after every step (0: off; e.g. 0.999).
    Evaluations, checkpoints and the final policy hold the averaged weights (what --init-policy then
    starts from); the trained ones travel in the checkpoint for --resume. Not with FSDP."""
    val_fraction: float = 0.1
    """held-out episodes (at least one when there are 2+ and this is > 0)"""
    image_shift: int | None = None
    """random shift augmentation of uint8 images, in pixels (0: off; None: the recipe's, 4 but for
    Cosmos Policy, which then trains on VAE latents encoded once)"""
    max_bad_updates: int = 10
    """stop after this many non-finite updates in a row"""
    norm_stats: Literal["auto", "demos", "checkpoint"] = "auto"
    """action / proprio normalisation statistics of policies that have them (VLAs): "demos" computes them
    from the training demos, "checkpoint" keeps the model's own; "auto": demos for a new policy, the
    checkpoint's with --init-policy or --resume"""
    bf16: bool = False
    """run the policy's forward and loss under bfloat16 autocast"""
    value_gamma: float = 0.99
    """discount of the value targets V(s') given to policies whose loss also trains a world model and a
    value (Cosmos Policy: the observation after each chunk and its discounted return)"""

    def __post_init__(self) -> None:
        if not 0.0 <= self.ema_decay < 1.0:
            raise BadInput(f"bc ema_decay must be in [0, 1) (0: no averaging), got {self.ema_decay}")
        if not 0.0 < self.value_gamma <= 1.0:
            raise BadInput(f"bc value_gamma must be in (0, 1], got {self.value_gamma}")
        for name in ("lr_warmup_steps", "lr_decay_steps", "image_shift"):
            if (getattr(self, name) or 0) < 0:
                raise BadInput(f"bc {name} must be >= 0, got {getattr(self, name)}")
        if self.batch_size is not None and self.batch_size < 1:
            raise BadInput(f"bc batch_size must be >= 1, got {self.batch_size}")

    def with_recipe(self, recipe: FineTuneRecipe) -> BCConfig:
        """These settings with every one left unset (None) taken from ``recipe``."""
        unset = {
            f.name: getattr(recipe, f.name)
            for f in dataclasses.fields(self)
            if f.name in RECIPE_FIELDS and getattr(self, f.name) is None
        }
        if "lr_after_decay" in unset and unset["lr_after_decay"] is None:
            unset["lr_after_decay"] = recipe.lr_decay_to if self.lr_decay_to is None else self.lr_decay_to
        return dataclasses.replace(self, **unset)

    def lr_at(self, step: int) -> float:
        """The step size of optimizer step ``step`` (from 0): ``learning_rate`` times the schedule's
        factor (``policies.options.lr_factor``); settings left unset are the generic recipe's."""
        cfg = (
            self.with_recipe(GENERIC_RECIPE)
            if any(getattr(self, name) is None for name in RECIPE_FIELDS)
            else self
        )
        return float(cfg.learning_rate) * lr_factor(cfg, step)


# The settings a policy's recipe gives (``FineTuneRecipe``'s fields that BCConfig has too).
RECIPE_FIELDS = (
    "batch_size", "learning_rate", "lr_schedule", "lr_warmup_steps", "lr_warmup_start", "lr_decay_steps",
    "lr_decay_to", "lr_after_decay", "weight_decay", "adam_betas", "adam_eps", "max_grad_norm",
    "image_shift",
)  # fmt: skip
# Policies without a published recipe (the small ones): a constant 1e-3, minibatches of 256.
GENERIC_RECIPE = FineTuneRecipe(source="trainers.bc's generic defaults", learning_rate=1e-3, batch_size=256)


def policy_recipe(cls: type | None, policy: str, policy_kwargs: dict[str, Any]) -> tuple[FineTuneRecipe, str]:
    """The recipe trainers.bc's defaults come from, and where it comes from: the policy class's
    ``fine_tune_recipe`` (a VLA's published one, else ``GENERIC_RECIPE``), with the settings of the
    model folder's ``fine_tune_recipe.json`` when it has one (the tiny checkpoints of
    ``policies/*/tiny.py`` do: the published numbers are for billions of weights and tens of thousands
    of steps, not a random model of thousands on a few demos). That file holds typed data only:
    ``{"about": str, "bc": {recipe setting: value}, "policy_kwargs": {the policy's keywords}}``,
    checked against ``FineTuneRecipe``'s fields and the policy's keyword allow-list."""
    from nets.field_types import check_value
    from nets.file_settings import check_file_settings
    from nets.files import read_json
    from policies.registry import policy_settings_schema

    recipe = getattr(cls, "fine_tune_recipe", None) or GENERIC_RECIPE
    model = policy_kwargs.get("model_path")
    path = Path(model) / RECIPE_FILE if isinstance(model, str) and model else None
    if path is None or not path.is_file():
        return recipe, recipe.source
    data = read_json(path, "fine-tuning recipe")
    if not isinstance(data, dict) or set(data) - {"about", "bc", "policy_kwargs"}:
        raise BadInput(f"{path}: expected a JSON object with keys among about, bc, policy_kwargs")
    hints = typing.get_type_hints(FineTuneRecipe)
    changes = {}
    for name, value in dict(data.get("bc", {})).items():
        if name not in RECIPE_FIELDS:
            raise BadInput(f"{path}: bc.{name} is not a recipe setting; known: {list(RECIPE_FIELDS)}")
        try:
            changes[name] = check_value(hints[name], value)
        except ValueError as e:
            raise BadInput(f"{path}: bc.{name}: {e}") from None
    kwargs = check_file_settings(
        dict(data.get("policy_kwargs", {})), policy_settings_schema(policy), f"{path}: policy_kwargs"
    )
    recipe = dataclasses.replace(recipe, **changes, policy_kwargs={**recipe.policy_kwargs, **kwargs})
    return recipe, f"{recipe.source}, with {path}'s settings"


def random_shift(images: torch.Tensor, pad: int, generator: torch.Generator | None) -> torch.Tensor:
    """DrQ-style augmentation: pad ``[B, H, W, C]`` uint8 images by ``pad`` (edge pixels) and crop
    back at a random offset per image."""
    b, h, w, _ = images.shape
    padded = torch.nn.functional.pad(images.permute(0, 3, 1, 2).float(), (pad,) * 4, mode="replicate")
    dx, dy = (torch.randint(0, 2 * pad + 1, (2, b), generator=generator)).tolist()
    crops = [padded[i, :, dy[i] : dy[i] + h, dx[i] : dx[i] + w] for i in range(b)]
    return torch.stack(crops).permute(0, 2, 3, 1).to(images.dtype)


def split_episodes(demos: Demos, val_fraction: float, seed: int) -> tuple[Demos, Demos | None]:
    """Training and held-out demos (whole episodes, drawn with ``seed``)."""
    n = len(demos.episodes)
    n_val = int(round(n * val_fraction)) if val_fraction > 0 else 0
    if val_fraction > 0 and n >= 2:
        n_val = min(max(n_val, 1), n - 1)
    if n_val == 0:
        return demos, None
    order = np.random.default_rng(seed).permutation(n)
    val = {int(i) for i in order[:n_val]}
    train = [ep for i, ep in enumerate(demos.episodes) if i not in val]
    held = [ep for i, ep in enumerate(demos.episodes) if i in val]
    return Demos(demos.meta, train), Demos(demos.meta, held)


def check_observation_keys(
    policy: ActionChunkPolicy, demo_keys: list[str], obs_keys: list[str], path: str
) -> None:
    """The observations the policy reads (``required_observation_keys``, VLAs; else every key of the
    env's observations) must be in the demonstrations."""
    reads = getattr(policy, "required_observation_keys", None)
    required = list(reads()) if reads is not None else obs_keys
    missing = [k for k in required if k not in demo_keys]
    if missing:
        raise BadInput(
            f"{path}: the policy ({type(policy).__name__}) reads the observations {list(required)}; the "
            f"demos have no {missing} (they have {demo_keys}): record the demos with those cameras / "
            "keys, or build the policy on the ones they have"
        )


def demo_statistics(
    demos: Demos, policy_cls: type, kwargs: dict[str, Any], observation_space: gym.Space
) -> tuple[dict, dict]:
    """``policy_cls.norm_stats_from_demos`` over the executed actions ``[N, D]`` and every recorded
    non-image observation of ``demos`` (the env's ``observation_space`` says how to read them): the
    policy kwargs to add and the files to write."""
    actions = np.concatenate([ep.actions[ep.valid.astype(bool)] for ep in demos.episodes])
    keys = [k for k, v in demos.episodes[0].obs.items() if not (v.dtype == np.uint8 and v.ndim == 4)]
    obs = {k: np.concatenate([ep.obs[k] for ep in demos.episodes]).astype(np.float64) for k in keys}
    return policy_cls.norm_stats_from_demos(actions, obs, len(demos.episodes), kwargs, observation_space)


def check_compatible(data: dict[str, Any], policy: ActionChunkPolicy, obs_space: Any, path: str) -> None:
    """Clear errors when the demonstrations do not fit the policy's env."""
    k, d = data["actions"].shape[1:]
    if (k, d) != (policy.chunk_size, policy.action_dim):
        raise BadInput(
            f"{path}: demonstrated chunks are {k} x {d}, the policy's env wants "
            f"{policy.chunk_size} x {policy.action_dim} (chunk_size x action_dim): record the demos "
            "with the same chunk_size, or with chunk_size 1"
        )
    for key, value in data["obs"].items():
        if key == "instruction":
            continue
        expected = obs_space[key].shape
        if value.shape[1:] != expected:
            raise BadInput(
                f"{path}: observation {key!r} has shape {value.shape[1:]} in the demos, the env gives "
                f"{expected}: use the same env_kwargs (image_size, cameras) as when recording"
            )


def batch_obs(obs: dict[str, Any], idx: np.ndarray) -> dict[str, Any]:
    return {k: [v[i] for i in idx] if isinstance(v, list) else v[idx] for k, v in obs.items()}


def main(argv: list[str] | None = None) -> dict[str, float]:
    configs = parse_cli({"run": RunConfig, "bc": BCConfig}, argv, description=__doc__)
    run_cfg: RunConfig = configs["run"]
    cfg: BCConfig = configs["bc"]
    world = parallel.from_env().world_size
    # the policy's recipe gives the settings left unset ("auto" is a small policy: the generic one)
    cls = None if run_cfg.policy == "auto" else policy_class(run_cfg.policy)
    new_policy = not (run_cfg.init_policy or run_cfg.resume)
    recipe, origin = policy_recipe(cls, run_cfg.policy, run_cfg.policy_kwargs if new_policy else {})
    cfg = cfg.with_recipe(recipe)
    if new_policy and recipe.policy_kwargs:  # the recipe's head / LoRA, unless given
        kwargs = {**recipe.policy_kwargs, **run_cfg.policy_kwargs}
        run_cfg = dataclasses.replace(run_cfg, policy_kwargs=kwargs)
    if parallel.from_env().rank == 0:
        print(
            f"fine-tuning recipe ({origin}): lr {cfg.learning_rate:g} ({cfg.lr_schedule}, warmup "
            f"{cfg.lr_warmup_steps}, decay at {cfg.lr_decay_steps}), batch {cfg.batch_size}, weight decay "
            f"{cfg.weight_decay:g}, clip {cfg.max_grad_norm:g}, image shift {cfg.image_shift}"
            + (f", policy {dict(recipe.policy_kwargs)}" if new_policy and recipe.policy_kwargs else ""),
            flush=True,
        )
    if cfg.batch_size % world:  # before any work (Run starts the process group)
        raise BadInput(
            f"batch_size={cfg.batch_size} (the minibatch over all ranks) does not split over {world} "
            f"ranks (world size): use a multiple of {world}"
        )
    demos = load_demos(cfg.demos)
    train_demos, val_demos = split_episodes(demos, cfg.val_fraction, run_cfg.seed)
    # a one-env copy of the env lends its spaces (evaluation builds its own envs)
    env = make_vec_env(run_cfg.env, 1, run_cfg.env_kwargs, run_cfg.vectorization, autoreset_required=False)
    env.close()
    obs_space = env.single_observation_space
    obs_keys = list(getattr(obs_space, "spaces", {"obs": obs_space}))
    demo_keys = [*demos.episodes[0].obs, "instruction"] if demos.episodes else []
    k = chunk_size(env) or 1
    keys = [key for key in obs_keys if key in demo_keys]  # the policy's needs are checked once built
    train = train_demos.chunks(keys, k)
    val = val_demos.chunks(keys, k) if val_demos is not None else None
    sub_steps = int(train["valid"].sum())
    run_cfg = dataclasses.replace(run_cfg, total_steps=max(1, cfg.epochs * sub_steps))
    stats_mode = cfg.norm_stats
    if stats_mode == "auto":
        stats_mode = "checkpoint" if run_cfg.init_policy or run_cfg.resume else "demos"
    cls = policy_class(run_cfg.policy, env.single_action_space)
    stats_files: dict[str, Any] = {}
    if cfg.norm_stats == "demos" and (run_cfg.init_policy or run_cfg.resume):
        raise BadInput(
            "--norm-stats demos with --init-policy / --resume: that policy was trained with its own "
            "statistics, which its checkpoint carries (--norm-stats checkpoint or auto keeps them)"
        )
    if hasattr(cls, "norm_stats_from_demos") and stats_mode == "demos":
        if "norm_stats" in run_cfg.policy_kwargs:
            raise BadInput(
                "--norm-stats demos computes the statistics from the demos; policy_kwargs gives norm_stats "
                "as well: drop one (or --norm-stats checkpoint to use the ones given)"
            )
        d = int(np.shape(train["actions"])[-1])
        space = env.single_action_space
        if isinstance(space, gym.spaces.Box) and space.shape and space.shape[-1] != d:
            raise BadInput(
                f"{cfg.demos}: the demonstrated actions are {d}-D, the env's actions {space.shape[-1]}-D "
                f"({run_cfg.env}): demos and env must have the same action space"
            )
        added, stats_files = demo_statistics(train_demos, cls, run_cfg.policy_kwargs, obs_space)
        run_cfg = dataclasses.replace(run_cfg, policy_kwargs={**run_cfg.policy_kwargs, **added})
    run = Run("bc", run_cfg, cfg)
    try:
        try:
            policy = run.make_policy(env, use_critic=False)
        except ValueError as e:
            if hasattr(cls, "norm_stats_from_demos") and stats_mode == "checkpoint":
                raise BadInput(
                    f"{e} (--norm-stats checkpoint: the policy normalizes with its model's own statistics; "
                    f"--norm-stats demos computes them from {cfg.demos})"
                ) from None
            raise
        check_observation_keys(policy, demo_keys, obs_keys, cfg.demos)
        check_compatible(train, policy, obs_space, cfg.demos)
        if run.is_main:  # in the model's own format, with the checkpoints
            for name, content in stats_files.items():
                (run.dir / "checkpoints").mkdir(exist_ok=True)
                write_atomic(run.dir / "checkpoints" / name, json.dumps(content, indent=2))
        run.shard(policy)  # fsdp over several ranks: before the optimizer
        optimizer = torch.optim.AdamW(
            policy.parameters(),
            lr=cfg.learning_rate,
            betas=tuple(cfg.adam_betas),
            eps=cfg.adam_eps,
            weight_decay=cfg.weight_decay,
        )
        generator = torch.Generator().manual_seed(run_cfg.seed)  # augmentation (each rank its own)
        extra = run.restore(policy, optimizer, {"bc": generator})
        resumed = run.counters["iteration"] > 0
        ema = restore_ema(policy, cfg.ema_decay, extra, resumed, sharded=run.checkpoints.sharded is not None)
        if getattr(policy, "obs_norm", "off") != "off" and policy.obs_stats_count() == 0:
            policy.update_obs_stats(train["obs"])  # standardised by the demos' statistics (saved with it)
        future = None  # what follows each sample, for a loss that takes it (world model and value)
        if {"next_obs", "returns"} <= set(inspect.signature(policy.imitation_loss).parameters):
            future = train_demos.future(k, cfg.value_gamma)
        cache = getattr(policy, "cache_inputs", None)
        if cache is not None and cfg.image_shift == 0:  # frozen encoders: encode the demos once
            with torch.no_grad():
                following = batch_obs(train["obs"], future["next_row"]) if future is not None else None
                train["obs"].update(cache(train["obs"], following, progress=run_cfg.progress and run.is_main))
                if val is not None:
                    val["obs"].update(cache(val["obs"], progress=run_cfg.progress and run.is_main))
        evaluator = run.data_parallel(policy)  # after restore: DDP starts from rank 0's weights
        guard = BadUpdateGuard(cfg.max_bad_updates)
        while not run.finished:
            policy.train()
            order = epoch_order(len(train["actions"]), run_cfg.seed, run.counters["iteration"])
            step = run.counters["iteration"] * -(-len(order) // cfg.batch_size)  # steps so far
            metrics, executed = train_epoch(
                evaluator, optimizer, train, order, cfg, guard, generator, future, run.device, step, ema
            )
            if ema is not None:  # evaluated and saved with the averaged weights
                ema.swap()
                run.checkpoints.extra = {EMA_KEY: ema.state_dict()}
            if val is not None:
                with run.gathered(), autocast(cfg.bf16, run.device):  # fsdp: whole parameters
                    metrics["train/val_loss"] = held_out_loss(policy, val, cfg.batch_size // run.world_size)
            run.end_iteration(executed, [], metrics)  # summed over ranks: the epoch's sub-steps
            if ema is not None and not run.finished:
                ema.swap()
        if ema is not None and not ema.swapped:  # a resumed run that had already finished
            ema.swap()
            run.checkpoints.extra = {EMA_KEY: ema.state_dict()}
        policy.eval()
        return run.finish()
    finally:
        run.close()  # releases the folder on an error too (a no-op after finish)


def epoch_order(rows: int, seed: int, epoch: int) -> np.ndarray:
    """The shuffled rows of an epoch, drawn from ``(seed, epoch)`` alone: the same on every rank,
    and after a resume."""
    return np.random.default_rng([seed, epoch]).permutation(rows)


def train_epoch(
    evaluator: nn.Module,
    optimizer: torch.optim.Optimizer,
    data: dict[str, Any],
    order: np.ndarray,
    cfg: BCConfig,
    guard: BadUpdateGuard,
    generator: torch.Generator,
    future: dict[str, np.ndarray] | None,
    device: Any,
    first_step: int = 0,
    ema: WeightEMA | None = None,
) -> tuple[dict[str, float], int]:
    """One pass over the rows ``order`` of ``data`` in minibatches of ``cfg.batch_size``, one guarded
    optimizer step each on the policy's ``imitation_loss`` (through ``evaluator``: ``parallel``'s
    DDP or FSDP module). Returns the metrics (means over the steps taken) and the executed sub-steps
    of this rank's rows. The step size of each step is ``cfg.lr_at`` its index, counted from
    ``first_step`` (the run's steps before this epoch); ``ema`` (if any) is updated after each step.

    Data parallel: the minibatch is split over the ranks (each takes its contiguous share, and
    augments it with its own ``generator``), and its loss is the mean over all its executed
    sub-steps, as in one process: each rank's mean over its own sub-steps is weighted by their
    share of the minibatch's (every rank holds the whole data set, so that count needs no
    communication) and scaled by the world size, since DDP and FSDP average the gradients over
    the ranks. That is exact for a loss averaged over executed sub-steps, as ``imitation_loss``
    says (Cosmos Policy's, a mean over the batch's latent values, is weighted the same way). A
    rank without a share (a last minibatch with fewer rows than ranks) evaluates one row of it
    with weight 0, so that it joins the forward and backward. At world size 1 this is the plain
    loss.
    """
    world, rank = parallel.world_size(), parallel.rank()
    actions, valid = torch.as_tensor(data["actions"]), torch.as_tensor(data["valid"])
    images = [  # keys to augment
        key
        for key, v in data["obs"].items()
        if cfg.image_shift > 0 and not isinstance(v, list) and v.dtype == np.uint8 and v.ndim == 4
    ]
    losses, norms, executed = [], [], 0
    for i, start in enumerate(range(0, len(order), cfg.batch_size)):
        for group in optimizer.param_groups:
            group["lr"] = cfg.lr_at(first_step + i)
        batch = order[start : start + cfg.batch_size]
        share = parallel.shard(len(batch), rank, world)
        idx = batch[share.start : share.stop]
        mine, total = int(valid[idx].sum()), int(valid[batch].sum())
        executed += mine
        if len(idx) == 0:
            idx = batch[:1]  # weight 0: this rank only joins the collectives
        obs = batch_obs(data["obs"], idx)
        for key in images:
            obs[key] = random_shift(torch.as_tensor(obs[key]), cfg.image_shift, generator)
        extra = {}
        if future is not None:
            extra = {
                "next_obs": batch_obs(data["obs"], future["next_row"][idx]),
                "returns": torch.as_tensor(future["returns"][idx]),
            }
        with autocast(cfg.bf16, device):
            loss = parallel.imitation_loss(evaluator, obs, actions[idx], valid[idx], **extra)
        loss = loss * (mine / max(total, 1))  # this rank's share of the minibatch's loss
        reported = parallel.sum_over_ranks({"loss": loss})["loss"]  # the minibatch's loss
        clip = cfg.max_grad_norm or None  # 0: no clipping
        stepped, norm = step_optimizer(loss * world, optimizer, clip, guard, guard_loss=reported)
        if stepped:
            losses.append(reported.detach())
            norms.append(norm)
            if ema is not None:
                ema.update()
    metrics = {
        "train/bc_loss": float(torch.stack(losses).mean()) if losses else float("nan"),
        "train/grad_norm": float(torch.stack(norms).mean()) if norms else float("nan"),
    }
    return metrics, executed


def autocast(bf16: bool, device: Any) -> contextlib.AbstractContextManager:
    """bfloat16 autocast on ``device`` when ``bf16``, else nothing."""
    if not bf16:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)


@torch.no_grad()
def held_out_loss(policy: ActionChunkPolicy, data: dict[str, Any], batch_size: int) -> float:
    """Mean imitation loss over a data set (no augmentation), weighted by executed sub-steps.
    Data parallel, each rank evaluates its contiguous share of the rows (call it on every rank,
    FSDP inside ``gathered``) and the sums are taken over the ranks."""
    policy.eval()
    total, count = 0.0, 0
    actions, valid = torch.as_tensor(data["actions"]), torch.as_tensor(data["valid"])
    rows = parallel.shard(len(actions), parallel.rank(), parallel.world_size())
    for start in range(rows.start, rows.stop, batch_size):
        idx = np.arange(start, min(start + batch_size, rows.stop))
        n = int(valid[idx].sum())
        total += float(policy.imitation_loss(batch_obs(data["obs"], idx), actions[idx], valid[idx])) * n
        count += n
    sums = parallel.sum_over_ranks({"total": torch.tensor(total, dtype=torch.float64), "count": count})
    return float(sums["total"]) / max(float(sums["count"]), 1)


if __name__ == "__main__":
    run_cli(main)

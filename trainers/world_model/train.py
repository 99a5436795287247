"""The training run: check everything, encode the clips once, optimize, checkpoint, write the bundle.

Run folder (``--run-dir``, default ``<out>.run``; the rules of ``trainers.run_folder``: a lock, a
non-empty folder resumed or refused, atomic files): ``config.json``, ``metrics.jsonl``, ``tb/``
(TensorBoard), ``checkpoints/iter_NNNNNN.pt`` (weights, EMA, optimizer, random streams, counters;
``trainers.checkpoint``'s verified format) and ``checkpoints/latents.pt`` (the VAE posterior of every
frame; Cosmos: the latents of every clip). The backend's own parts (networks, clips, objective, bundle)
come from ``backends.BACKENDS[cfg.backend]``. ``--resume RUN`` continues from the newest checkpoint
exactly: the clip order is drawn from (seed, epoch) alone and every other draw from one generator whose
state is checkpointed, so a resumed run takes the same steps, and logs the same losses, as one that was
never stopped.

With ``vae_steps`` > 0 a VAE stage comes first (``trainers.world_model.vae``): its checkpoints are
``iter_NNNNNN.pt`` too, numbered by VAE step, and the world model's are numbered ``vae_steps`` + its step
(the metrics' ``iteration`` likewise), so one run folder holds one timeline; every world-model checkpoint
carries the trained VAE, and the first is written at the world model's step 0, once the VAE is frozen,
calibrated and its latents cached.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nets.errors import BadInput
from nets.resnet_rm import ResnetRewardModel
from trainers import checkpoint as ckpt
from trainers import parallel, run_folder
from trainers.config import save_config, to_dict
from trainers.datasets import load_demos
from trainers.datasets.demos import Demos
from trainers.metrics import MetricsLogger
from trainers.optim import BadUpdateGuard, step_optimizer
from trainers.world_model import data_parallel
from trainers.world_model.backends import BACKENDS, Objective
from trainers.world_model.bundle import action_statistics, check_bundle_output
from trainers.world_model.config import WorldModelConfig
from trainers.world_model.data import read_episodes
from trainers.world_model.model import BUNDLE_FORMAT
from trainers.world_model.vae import VaeTrainer, train_vae

ALGO = "world_model"
CACHE_FILE = "latents.pt"  # in <run>/checkpoints/


def split_episodes(n: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Training and held-out episode indices (whole episodes, drawn with ``seed``)."""
    held = int(round(n * fraction)) if fraction > 0 else 0
    if fraction > 0 and n >= 2:
        held = min(max(held, 1), n - 1)
    order = np.random.default_rng(seed).permutation(n)
    return sorted(int(i) for i in order[held:]), sorted(int(i) for i in order[:held])


def clip_rows(step: int, batch: int, clips: int, seed: int) -> torch.Tensor:
    """The clips of optimizer step ``step``: consecutive slices of per-epoch permutations drawn from
    (seed, epoch) alone, so any step's rows are known without replaying the run."""
    positions = np.arange(step * batch, (step + 1) * batch)
    epochs = positions // clips
    rows = np.empty(batch, np.int64)
    for epoch in np.unique(epochs):
        order = np.random.default_rng([seed, int(epoch)]).permutation(clips)
        chosen = epochs == epoch
        rows[chosen] = order[positions[chosen] % clips]
    return torch.from_numpy(rows)


class Trainer:
    """One run's model, data and optimizer; ``step()`` takes one optimizer step. ``nets``, the clip sets
    and ``objective`` are the backend's (``backends``). ``resume``: the checkpoint (path, data) to continue
    from. Over several ranks (``torchrun``) each rank computes the loss of its share of every batch
    (``data_parallel``)."""

    def __init__(self, cfg: WorldModelConfig, nets: Any, train: Any, held: Any | None, objective: Objective,
                 resume: tuple[Path, dict[str, Any]] | None = None) -> None:  # fmt: skip
        self.cfg, self.nets, self.train, self.held, self.objective = cfg, nets, train, held, objective
        self.device = torch.device(cfg.device)
        self.dit = nets.dit.to(self.device).train().requires_grad_(True)
        objective.prepare(self.dit)
        if resume is not None:  # whole weights go in before FSDP shards them
            _loading(resume[0], lambda: self.dit.load_state_dict(resume[1]["model"]))
        self.root = data_parallel.wrap(self.dit, objective, bf16=cfg.bf16, mode=cfg.data_parallel,
                                       checkpointing=cfg.activation_checkpointing)  # fmt: skip
        self.rank, self.world = parallel.rank(), parallel.world_size()
        trained = [p for p in self.dit.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            trained, lr=cfg.learning_rate, eps=cfg.adam_eps, weight_decay=cfg.weight_decay
        )
        self.ema = {k: v.detach().float().clone() for k, v in self.dit.state_dict().items()}
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.guard = BadUpdateGuard()
        self.step_index = 0
        self.pending: list[list[float]] = []  # [loss, grad norm] of the steps not logged yet
        self.whole_models: tuple[torch.nn.Module, torch.nn.Module | None] | None = None  # FSDP: gather()
        if resume is not None:
            _loading(resume[0], lambda: self._load(resume[1]))

    # ---- one step --------------------------------------------------------------------------------------
    def loss(self, module: torch.nn.Module, latents: torch.Tensor, actions: torch.Tensor, t: torch.Tensor,
             noise: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """The mean loss of a batch through ``module`` (``data_parallel.Loss`` or its wrapper), ``t`` its
        noise levels."""
        latents, actions = latents.to(self.device), actions.to(self.device)
        return module(latents, actions, t.to(self.device), noise.to(self.device))

    def step(self) -> tuple[float, float]:
        """One optimizer step on the next batch; returns (loss, gradient norm), both of the whole batch.
        Every rank draws the whole batch and its noise; each computes the loss of its own equal share."""
        cfg, g = self.cfg, self.generator
        rows = clip_rows(self.step_index, cfg.batch_size, len(self.train), cfg.seed)
        latents, actions = self.train.batch(rows, g)
        t = self.objective.levels(len(rows), g)
        noise = torch.randn(latents.shape, generator=g)
        for group in self.optimizer.param_groups:
            group["lr"] = cfg.lr_at(self.step_index)
        share = parallel.shard(len(rows), self.rank, self.world)  # equal shares: batch_size % world == 0
        part = slice(share.start, share.stop)
        loss = self.loss(self.root, latents[part], actions[part], t[part], noise[part])
        whole = parallel.all_reduce_sum(loss.detach()) / self.world  # the mean of equal shares' means
        stepped, norm = step_optimizer(loss, self.optimizer, cfg.max_grad_norm, self.guard, guard_loss=whole)
        if stepped and cfg.ema_decay > 0:
            with torch.no_grad():
                for name, p in self.dit.named_parameters():
                    if p.requires_grad:
                        self.ema[name].mul_(cfg.ema_decay).add_(p.detach().float(), alpha=1 - cfg.ema_decay)
        self.step_index += 1
        return float(whole), float(norm)

    # ---- fixed held-out measurement -------------------------------------------------------------------
    @torch.no_grad()
    def eval_loss(self, clips: Any, other_actions: bool = False) -> float:
        """The loss on a fixed set of clips: the first ``eval_clips`` of a seeded order, fixed noise levels
        spread like the training ones (``objective.eval_levels``), noise and posterior samples from a
        generator of their own (the training streams are not touched). ``other_actions``: each clip with
        the actions of the clip half the batch away (the same loss when the model ignores its actions).
        Every rank computes it whole (under FSDP the forward gathers the weights)."""
        cfg = self.cfg
        g = torch.Generator().manual_seed(cfg.seed + 7919)
        order = torch.from_numpy(np.random.default_rng([cfg.seed, 7919]).permutation(len(clips)))
        rows = order[: cfg.eval_clips]
        latents, actions = clips.batch(rows, g)
        if other_actions:
            actions = actions.roll(len(rows) // 2, dims=0)
        levels = self.objective.eval_levels(len(rows))
        noise = torch.randn(latents.shape, generator=g)
        self.dit.eval()
        try:
            return float(self.loss(data_parallel.local(self.root), latents, actions, levels, noise))
        finally:
            data_parallel.reshard(self.root)
            self.dit.train()

    @contextlib.contextmanager
    def ema_weights(self) -> Iterator[None]:
        """The EMA weights in the model for the duration (swapped in place, shard by shard under FSDP)."""
        trained = [(p, self.ema[n]) for n, p in self.dit.named_parameters() if p.requires_grad]
        with torch.no_grad():
            kept = [p.detach().clone() for p, _ in trained]
            for p, average in trained:
                p.copy_(average.to(p.dtype))
        try:
            yield
        finally:
            with torch.no_grad():
                for (p, _), value in zip(trained, kept):
                    p.copy_(value)

    def ema_model(self) -> torch.nn.Module:
        """A whole model holding the EMA weights (the trained weights when there is no EMA)."""
        if self.whole_models is not None:
            return self.whole_models[1] or self.whole_models[0]
        model = copy.deepcopy(self.dit)
        if self.cfg.ema_decay > 0:
            model.load_state_dict({k: v.to(model.state_dict()[k].dtype) for k, v in self.ema.items()})
        return model

    def trained_model(self) -> torch.nn.Module:
        """A whole model holding the trained weights."""
        return self.dit if self.whole_models is None else self.whole_models[0]

    def gather(self) -> None:
        """Under FSDP, the whole trained and EMA models on rank 0 (built on the CPU from the gathered
        shards) for ``trained_model`` / ``ema_model``; a collective, every rank calls it. Else nothing."""
        if not parallel.is_sharded(self.root):
            return
        model, _ = data_parallel.model_and_optimizer_state(self.root, self.dit, self.optimizer)
        ema = data_parallel.whole(self.ema) if self.cfg.ema_decay > 0 else None
        if self.rank != 0:
            return
        trained = type(self.dit)(self.dit.config)
        trained.load_state_dict(model)
        average = None
        if ema is not None:
            average = type(self.dit)(self.dit.config)
            average.load_state_dict({k: v.to(model[k].dtype) for k, v in ema.items()})
        self.whole_models = (trained, average)

    def evaluate(self) -> dict[str, float]:
        row = {"eval/train_loss": self.eval_loss(self.train)}
        # the same clips with other clips' actions: no higher when the model ignores its actions
        row["eval/train_loss_other_actions"] = self.eval_loss(self.train, other_actions=True)
        if self.held is not None:
            row["eval/loss"] = self.eval_loss(self.held)
            row["eval/loss_other_actions"] = self.eval_loss(self.held, other_actions=True)
            if self.cfg.ema_decay > 0:
                with self.ema_weights():
                    row["eval/ema_loss"] = self.eval_loss(self.held)
        return row

    # ---- checkpoints ----------------------------------------------------------------------------------
    def state(self, config: dict[str, Any]) -> dict[str, Any]:
        """The checkpoint: whole tensors in one process's layout (gathered under FSDP: every rank calls it,
        rank 0 writes it)."""
        model, optimizer = data_parallel.model_and_optimizer_state(self.root, self.dit, self.optimizer)
        return {
            "algo": ALGO,
            "config": config,
            "model": model,
            "ema": data_parallel.whole(self.ema),
            "optimizer": optimizer,
            "rng": ckpt.rng_state({"world_model": self.generator}),
            "counters": {
                "iteration": self.step_index,
                **self.guard.counters(),
            },  # fmt: skip
            "pending": self.pending,
        }

    def _load(self, data: dict[str, Any]) -> None:
        """All but the model's weights (``__init__`` loads those before any sharding)."""
        current = self.dit.state_dict()
        if set(data["ema"]) != set(current):
            raise KeyError(f"EMA entries {sorted(set(data['ema']) ^ set(current))[:4]}")
        self.ema = {k: data_parallel.like(v, current[k]) for k, v in data["ema"].items()}
        data_parallel.load_optimizer(self.root, self.dit, self.optimizer, data["optimizer"])
        ckpt.restore_rng_state(data["rng"], {"world_model": self.generator})
        counters = data["counters"]
        self.step_index = int(counters["iteration"])
        self.guard.restore_counters(counters)
        self.pending = [list(map(float, p)) for p in data["pending"]]


def _loading(path: Path, load: Callable[[], Any]) -> None:
    """``load()``, its failures named as a checkpoint that does not fit this run."""
    try:
        load()
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise BadInput(
            f"{path}: does not fit this run's model and settings ({type(e).__name__}: {e})"
        ) from None


def resumable(folder: Path) -> tuple[Path, dict[str, Any]]:
    """The newest checkpoint of a world-model run folder, read and checked (before anything is written)."""
    if not (folder / run_folder.CONFIG_FILE).is_file():
        raise BadInput(f"--resume {folder}: not a run folder (no {run_folder.CONFIG_FILE})")
    path, data = ckpt.latest_checkpoint(folder)
    if data.get("algo") != ALGO:
        raise BadInput(f"--resume {folder}: {path} is a {data.get('algo')} checkpoint, not a world model's")
    return path, data


def prepare(cfg: WorldModelConfig) -> dict[str, Any]:
    """Every check that needs no writing, in order: demos, networks, demos against networks, outputs,
    the checkpoint to resume. Returns what the run is built from."""
    device = torch.device(cfg.device)
    backend = BACKENDS[cfg.backend]
    demos = load_demos(cfg.demos)
    if not demos.episodes:
        raise BadInput(f"{cfg.demos}: no episodes to train on")
    action_dim = int(demos.episodes[0].actions.shape[-1])
    nets = backend.networks(cfg, action_dim, device)
    if nets.image_size is None:  # a fresh model takes the demos' frame size
        images = demos.episodes[0].obs.get(cfg.image_key)
        if images is not None and np.ndim(images) == 4:
            nets.image_size = (int(images.shape[1]), int(images.shape[2]))
        else:
            nets.image_size = (0, 0)  # read_episodes names the missing images
    episodes = read_episodes(
        demos,
        source=cfg.demos,
        image_key=cfg.image_key,
        image_size=nets.image_size,
        action_dim=nets.action_dim,
        condition_frames=nets.condition_frames,
        chunk=nets.chunk,
    )
    h, w = nets.image_size
    if h % 16 or w % 16:
        raise BadInput(
            f"{cfg.demos}: frames of {h}x{w}; the model needs multiples of 16 (8x VAE, 2x2 patches)"
        )
    backend.calibrate(cfg, nets, episodes)  # a fresh random VAE's latent scale
    stats_from = cfg.action_stats if cfg.action_stats != "auto" else ("init" if nets.init_stats else "demos")
    if stats_from == "init" and nets.init_stats is None:
        raise BadInput(
            f"--action-stats init: the --init-from bundle {cfg.init_from} has no dataset_statistics.json"
        )
    reward = Path(cfg.reward_model) if cfg.reward_model else nets.init_reward
    if cfg.reward_model:
        ResnetRewardModel.from_checkpoint(cfg.reward_model)  # refused now, not after training
    out = check_bundle_output(
        cfg.out, cfg.overwrite, [cfg.demos] + ([cfg.init_from] if cfg.init_from else [])
    )
    resumed = None
    if cfg.resume:
        folder = Path(cfg.resume)
        resumed = resumable(folder)
        data = resumed[1]
        trained = data.get("vae_steps", data.get("counters", {}).get("vae_steps", 0))
        if trained != cfg.vae_steps:
            raise BadInput(
                f"vae_steps {cfg.vae_steps}: the run in {folder} was started with vae_steps {trained} (its "
                "VAE stage and the checkpoints' numbering follow it); resume with that"
            )
    else:
        folder = Path(cfg.run_dir) if cfg.run_dir else out.with_name(f"{out.name}.run")
    if folder.resolve() == out.resolve():
        raise BadInput(f"--run-dir {folder} is also --out: the run folder and the bundle are two folders")
    return {"demos": demos, "episodes": episodes, "nets": nets, "stats_from": stats_from, "reward": reward,
            "out": out, "folder": folder, "resumed": resumed, "backend": backend}  # fmt: skip


class _Silent:
    """The metrics logger of ranks other than 0 (rank 0 alone writes the run folder)."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / "metrics.jsonl"

    def log(self, *args: Any, **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        pass


def run(cfg: WorldModelConfig) -> dict[str, Any]:
    """Train (or continue) a world model and write its bundle; returns the bundle's ``training.json``.
    Under ``torchrun`` every rank runs this; rank 0 alone writes the run folder and the bundle."""
    ranks = parallel.from_env()
    if cfg.batch_size % ranks.world_size:
        raise BadInput(
            f"batch_size={cfg.batch_size} (clips per step over all ranks) does not split over "
            f"{ranks.world_size} ranks (torchrun's world size): use a multiple of {ranks.world_size}"
        )
    given = cfg  # what config.json keeps (the device as given, not this rank's)
    cfg = dataclasses.replace(cfg, device=parallel.local_device(cfg.device, ranks),
                              progress=cfg.progress and ranks.is_main)  # fmt: skip
    if cfg.torch_threads:
        torch.set_num_threads(cfg.torch_threads)
    ckpt.seed_all(cfg.seed)  # a fresh model's initialization draws from torch's global stream
    p = prepare(cfg)
    ranks, started = parallel.init(ranks.world_size, cfg.device)  # the process group, after every check
    try:
        return _run(cfg, given, p, ranks.is_main)
    finally:
        if started:
            parallel.shutdown()


def _run(cfg: WorldModelConfig, given: WorldModelConfig, p: dict[str, Any], main: bool) -> dict[str, Any]:
    demos, episodes, nets, folder, backend = p["demos"], p["episodes"], p["nets"], p["folder"], p["backend"]
    train_eps, held_eps = split_episodes(len(episodes), cfg.val_fraction, cfg.seed)

    # action normalization: the bundle's (what the model learned with) or the training demos'
    train_actions = np.concatenate([episodes[i].actions for i in train_eps])
    stats = action_statistics(train_actions, len(train_eps))
    if p["stats_from"] == "init":
        q01, q99 = nets.init_stats
        stats["action"]["q01"], stats["action"]["q99"] = q01.tolist(), q99.tolist()
    q01 = torch.tensor(stats["action"]["q01"], dtype=torch.float32)
    q99 = torch.tensor(stats["action"]["q99"], dtype=torch.float32)

    resumed = p["resumed"] is not None
    lock = run_folder.claim(folder, resume=resumed, overwrite=cfg.overwrite) if main else None
    logger: MetricsLogger | _Silent | None = None
    try:
        saved = dataclasses.replace(given, overwrite=False, resume=None, run_dir=str(folder))
        configs = {"world_model": saved}
        if not resumed and main:
            save_config(folder / run_folder.CONFIG_FILE, configs)
        if main:
            (folder / "checkpoints").mkdir(exist_ok=True)
        config = to_dict(configs)
        path, data = p["resumed"] if p["resumed"] is not None else (None, {})
        stage = data.get("stage", "world_model") if data else None
        offset = cfg.vae_steps  # the world model's step 0 is the run's iteration vae_steps
        resumed_at = None
        if data:
            resumed_at = int(data["counters"]["iteration"]) + (offset if stage == "world_model" else 0)
        if main:
            logger = MetricsLogger(folder, tensorboard=cfg.tensorboard, resume_iteration=resumed_at,
                                   resume_step=resumed_at)  # fmt: skip
        else:
            logger = _Silent(folder)

        def save(iteration: int, state: dict[str, Any]) -> None:
            if main:
                ckpt.save_checkpoint(folder / "checkpoints" / f"iter_{iteration:06d}.pt", state)
                ckpt.prune_checkpoints(folder, cfg.keep_checkpoints)

        # the VAE stage (vae_steps > 0): train the tiny VAE on the training episodes' frames, freeze it
        # (every rank trains it the same way; rank 0's weights are then everyone's)
        vae_record: dict[str, Any] | None = None
        if cfg.vae_steps and stage in (None, "vae"):
            train_samples = backend.vae_samples([episodes[i] for i in train_eps])
            held_samples = backend.vae_samples([episodes[i] for i in held_eps]) if held_eps else None
            vae_trainer = VaeTrainer(cfg, nets.vae, train_samples, held_samples)
            if stage == "vae":
                vae_trainer.load(data, path)
                print(f"resumed from {path} (VAE step {vae_trainer.step_index})")
            vae_record = train_vae(cfg, vae_trainer, logger, save, config, ALGO)
            parallel.broadcast_module(nets.vae.module)
            trained_on = "the training episodes' " + (
                "frames" if train_samples.ndim == 4 else f"{train_samples.shape[1]}-frame clips"
            )
            vae_record.update({**backend.calibrate_trained(nets, [episodes[i] for i in train_eps]),
                               "learning_rate": cfg.vae_learning_rate, "batch_size": cfg.vae_batch_size,
                               "kl_weight": cfg.vae_kl_weight, "loss": cfg.vae_loss,
                               "trained_on": trained_on})  # fmt: skip
        elif cfg.vae_steps:  # resumed in the world-model stage: its trained, calibrated VAE
            try:
                nets.vae.module.load_state_dict(data["vae"])
                vae_record = dict(data["vae_record"])
            except (KeyError, TypeError, RuntimeError) as e:
                raise BadInput(f"{path}: holds no VAE that fits this run ({type(e).__name__}: {e})") from None
        if cfg.vae_steps:
            nets.vae.module.eval().requires_grad_(False)

        # every clip encoded once by the frozen VAE (cached in the run folder: a resume does not encode again;
        # rank 0 encodes and writes the cache, the other ranks read it)
        splits = [train_eps] + ([held_eps] if held_eps else [])
        cache = folder / "checkpoints" / CACHE_FILE
        clip_sets = backend.clip_sets(cfg, nets, episodes, splits, cache, q01, q99) if main else None
        parallel.barrier()
        if not main:
            clip_sets = backend.clip_sets(cfg, nets, episodes, splits, cache, q01, q99)
        held = clip_sets[1] if held_eps else None
        trainer = Trainer(cfg, nets, clip_sets[0], held, backend.objective(cfg, nets),
                          resume=(path, data) if stage == "world_model" else None)  # fmt: skip
        if stage == "world_model" and main:
            print(f"resumed from {path} (step {trainer.step_index})")
        extra: dict[str, Any] = {"vae_steps": cfg.vae_steps}
        if cfg.vae_steps:  # every world-model checkpoint carries the trained VAE
            extra["vae"] = {k: v.detach().cpu().clone() for k, v in nets.vae.module.state_dict().items()}
            extra["vae_record"] = vae_record
        record = _train(cfg, trainer, logger, save, config, offset, extra, resumed=stage == "world_model")
        if vae_record is not None:
            record["vae_training"] = vae_record
        record.update(_describe(given, p, trainer, train_eps, held_eps, folder))
        trainer.gather()  # FSDP: the whole models on rank 0
        if main:
            out = Path(cfg.out)
            out.parent.mkdir(parents=True, exist_ok=True)
            backend.write_bundle(out, cfg, nets, trainer, stats, p["reward"], demos, record)
        parallel.barrier()  # the bundle is whole before any rank returns
        return record
    finally:
        if logger is not None:
            logger.close()
        if lock is not None:
            lock.release()


def _train(cfg: WorldModelConfig, trainer: Trainer, logger: MetricsLogger | _Silent,
           save: Callable[[int, dict[str, Any]], None], config: dict[str, Any], offset: int = 0,
           extra: dict[str, Any] | None = None, *, resumed: bool = False) -> dict[str, Any]:  # fmt: skip
    """The loop from the trainer's step to ``cfg.steps``: log, evaluate, checkpoint. Returns the losses.

    Rows are logged on the cadence alone (``log_every``, ``eval_every``), never because a call stops:
    a run stopped and resumed logs exactly the rows of one that was not (the losses of steps not yet
    logged travel in the checkpoint). The end of a call is measured for ``training.json`` only. Rows and
    checkpoints are numbered ``offset`` + step (``offset``: the VAE stage's steps before this one, which
    also puts a checkpoint at step 0); ``extra`` goes into every checkpoint."""
    from tqdm.auto import tqdm

    def checkpoint(step: int) -> None:
        save(offset + step, {**trainer.state(config), **(extra or {})})

    start = trainer.step_index
    if not resumed:  # the first row (and, after a VAE stage, the first checkpoint) of the world model
        logger.log(offset, {"iteration": offset, **trainer.evaluate()})
        if offset:
            checkpoint(0)
    clock = time.perf_counter()
    bar = tqdm(total=cfg.steps, initial=start, desc="world model", unit="step", disable=not cfg.progress,
               dynamic_ncols=True, mininterval=1.0)  # fmt: skip
    last_train: dict[str, float] = {}
    try:
        while trainer.step_index < cfg.steps:
            loss, norm = trainer.step()
            trainer.pending.append([loss, norm])
            step = trainer.step_index
            row: dict[str, float] = {}
            if step % cfg.log_every == 0:
                losses = np.array(trainer.pending).mean(0)
                row.update({"train/loss": float(losses[0]), "train/grad_norm": float(losses[1]),
                            "train/lr": cfg.lr_at(step - 1)})  # fmt: skip
                trainer.pending = []
                last_train = {"train/loss": row["train/loss"], "train/loss_step": float(step)}
            if cfg.eval_every and step % cfg.eval_every == 0:
                row.update(trainer.evaluate())
            if row:
                row.update({"iteration": offset + step, "time/elapsed": time.perf_counter() - clock})
                logger.log(offset + step, row)
                bar.set_postfix(
                    {k.split("/")[-1]: f"{v:.4g}" for k, v in row.items() if "loss" in k}, refresh=False
                )
            if step % cfg.checkpoint_every == 0 or step == cfg.steps:
                checkpoint(step)
            bar.update(1)
    finally:
        bar.close()
    wall = time.perf_counter() - clock
    # the whole run's rows, resumes included (rank 0's file)
    rows = [] if isinstance(logger, _Silent) else _metrics(logger.path.parent)
    keep = ("eval/", "train/")
    first = next((r for r in rows if "eval/train_loss" in r), {})
    return {
        "losses": {
            "start": {k: v for k, v in first.items() if k.startswith(keep)},
            "end": {**last_train, **trainer.evaluate()},
        },
        "wall_s_this_call": wall,
        "steps_this_call": trainer.step_index - start,
        "bad_updates": trainer.guard.total,
    }


def _metrics(folder: Path) -> list[dict[str, Any]]:
    from trainers.metrics import read_metrics

    return read_metrics(folder)


def _describe(cfg: WorldModelConfig, p: dict[str, Any], trainer: Trainer, train_eps: list[int],
              held_eps: list[int], folder: Path) -> dict[str, Any]:  # fmt: skip
    """What ``training.json`` says the bundle was trained on (plain data only)."""
    demos: Demos = p["demos"]
    episodes, nets = p["episodes"], p["nets"]
    env = demos.meta.get("env")
    return {
        "format": BUNDLE_FORMAT,
        "version": 1,
        "written_by": "python -m trainers.world_model",
        "backend": cfg.backend,
        "suite": env if isinstance(env, str) else None,
        "tasks": sorted({ep.task for ep in episodes}),
        "demos": str(cfg.demos),
        "episodes": {"train": train_eps, "held_out": held_eps},
        "frames": int(sum(len(ep.frames) for ep in episodes)),
        "clips": {"train": len(trainer.train), "held_out": len(trainer.held) if trainer.held else 0},
        "steps": trainer.step_index,
        "batch_size": cfg.batch_size,
        "image_size": list(nets.image_size),
        "chunk": nets.chunk,
        "condition_frames": nets.condition_frames,
        "action_dim": nets.action_dim,
        **p["backend"].describe(cfg, nets),  # model, vae
        "parameters": sum(p.numel() for p in nets.dit.parameters()),
        "init_from": str(nets.init_from) if nets.init_from else None,
        "action_stats": p["stats_from"],
        "reward_model": str(p["reward"]) if p["reward"] else "placeholder: never reports success",
        "weights": cfg.bundle_weights if cfg.ema_decay > 0 else "model",
        "objective": {
            **trainer.objective.record(),
            "learning_rate": cfg.learning_rate,
            "ema_decay": cfg.ema_decay,
        },  # fmt: skip
        "run_dir": str(folder),
        "device": cfg.device,
        "torch_threads": torch.get_num_threads(),
        "config": json.loads(json.dumps(dataclasses.asdict(cfg), default=str)),
    }

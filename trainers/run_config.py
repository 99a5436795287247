"""``RunConfig``: the settings every trainer shares (``--env``, ``--num-envs``, ``--run-dir``,
``--eval-every``, ...), and the envs they describe (``RunConfig.make_env``). The algorithms' own
settings are their dataclasses (``PPOConfig``, ``GRPOConfig``, ``SACConfig``, ``BCConfig``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import gymnasium as gym
import torch

from nets.errors import BadInput
from trainers import parallel
from trainers.env_factory import AUTORESET, check_env_kwargs, make_vec_env


@dataclass
class RunConfig:
    """Settings every trainer shares.

    ``env`` is a gymnasium id; ``"module:Env-v0"`` imports ``module`` first (``envs:Libero-Spatial-v0``
    registers this project's envs; the trainers never import them themselves).
    """

    env: str = "CartPole-v1"
    """a gymnasium id; "module:Env-v0" imports module first (envs:Libero-Spatial-v0)"""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """passed to gym.make_vec"""
    num_envs: int = 8
    """over all ranks (torchrun): each rank steps num_envs / world size of them"""
    vectorization: Literal["auto", "native", "sync", "async"] = "auto"
    """auto: the env's own vector env when it takes autoreset_mode (this project's envs), else sync"""
    autoreset_mode: Literal["auto", "next_step", "same_step", "disabled"] = "auto"
    """auto: the trainer picks"""
    policy: str = "auto"
    """a registered policy (gaussian, categorical, binned, flow, residual, dsrl, openvla, openvla_oft,
    pi05, cosmos_policy, libero_expert; policies/registry.py), auto (from the action space), or
    module:Class"""
    policy_kwargs: dict[str, Any] = field(default_factory=dict)
    """JSON object: the policy's arguments. The pretrained VLAs' (openvla, openvla_oft, pi05,
    cosmos_policy) are typed options: python -m trainers --policy-help NAME lists each one's type,
    default and meaning"""
    total_steps: int = 100_000
    """env steps (executed sub-steps, summed over envs)"""
    max_iterations: int = 0
    """also stop after this many iterations (0: no limit)"""
    max_minutes: float = 0.0
    """also stop at the end of the first iteration after this many minutes of training, over every
    resumed part of the run, evaluations included (0: no limit)"""
    seed: int = 0
    """seeds the envs, the policy's sampling, the minibatch order and torch"""
    device: str = "cpu"
    """where the policy trains (cpu, cuda, cuda:N); cuda with several ranks: cuda:LOCAL_RANK"""
    loop: Literal["sync", "async"] = "sync"
    """sync: step the envs, then update, in turn (exact; resumes bit for bit where the algorithm does);
    async (--algo sac and sil): an actor process steps the envs with a snapshot of the policy while
    the learner updates (trainers/actors/; runs are not bit-exact)"""
    torch_threads: int = 0
    """0: torch's default"""
    run_dir: str | None = None
    """default: runs/<algo>-<env>-s<seed>-<date>"""
    resume: str | None = None
    """a run directory (its newest checkpoint) or the newest checkpoint file in its checkpoints/: the same
    algorithm and env; run_dir is then that directory"""
    overwrite: bool = False
    """a new run in a run_dir that holds another run's files: remove them first (only a run's own files,
    inside the folder: anything else there is refused). Without it such a folder is refused (a new run
    never mixes its files with another's); --resume continues the run instead. Never saved as true: an
    overwrite comes only from your own command line or call"""
    init_policy: str | None = None
    """start from the trained policy of a run directory or checkpoint (e.g. behaviour cloning): its policy
    class and arguments are used (policy_kwargs and the trainer's needs, e.g. a critic, override them) and
    --policy is ignored, except --policy residual: a ResidualPolicy learns a correction over that policy,
    kept frozen as its base"""
    eval_env: str | None = None
    """evaluate on another env, e.g. train in a world model and evaluate in the simulator; the kwargs
    default to env_kwargs when eval_env is unset, else to none"""
    eval_env_kwargs: dict[str, Any] | None = None
    """JSON object (see eval_env)"""
    eval_every: int = 0
    """iterations between evaluations; 0: only at the end; -1: never"""
    eval_at_start: bool = False
    """also evaluate the initial policy, before training"""
    eval_episodes: int = 10
    """episodes per evaluation (deterministic actions)"""
    eval_num_envs: int = 0
    """0: min(eval_episodes, num_envs)"""
    video: bool = True
    """an mp4 of the first eval round (needs an env that renders rgb_array)"""
    video_fps: int = 20
    """frames per second of the eval videos"""
    checkpoint_every: int = 10
    """iterations between checkpoints; 0: only at the end"""
    keep_checkpoints: int = 3
    """newest checkpoints kept; 0: all"""
    tensorboard: bool = True
    """TensorBoard event files in RUN/tb"""
    wandb_project: str | None = None
    """also log to this Weights & Biases project (wandb installed)"""
    progress: bool = True
    """a tqdm progress bar over env steps"""
    data_parallel: Literal["ddp", "fsdp"] = "ddp"
    """several ranks (torchrun): ddp keeps a whole copy of the model on every rank; fsdp shards parameters,
    gradients and optimizer state over the ranks (FSDP2 fully_shard). At world size 1 fsdp changes nothing
    (no process group, no sharding; the two options below are then unused)"""
    fsdp_param_dtype: str | None = None
    """fsdp: compute in this dtype (bfloat16, float16), reduce in float32"""
    activation_checkpointing: bool = False
    """fsdp: recompute activations in backward"""

    def __post_init__(self) -> None:
        check_env_kwargs(self.env, self.env_kwargs)
        check_env_kwargs(self.eval_env or self.env, self.eval_env_kwargs, "eval_env_kwargs")
        for name in ("num_envs", "total_steps", "eval_episodes"):
            if getattr(self, name) < 1:
                raise BadInput(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_iterations", "seed", "torch_threads", "eval_num_envs", "checkpoint_every"):
            if getattr(self, name) < 0:
                raise BadInput(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.max_minutes < float("inf"):
            raise BadInput(f"max_minutes must be a finite number >= 0 (0: none), got {self.max_minutes}")
        if self.keep_checkpoints < 0 or self.video_fps < 1 or self.eval_every < -1:
            raise BadInput(
                "need keep_checkpoints >= 0, video_fps >= 1 and eval_every >= -1, got "
                f"{self.keep_checkpoints}, {self.video_fps} and {self.eval_every}"
            )
        if not 0 <= self.seed < 2**32:  # numpy's and gymnasium's seeds, and seed + offsets in torch's int64
            raise BadInput(f"seed must be in [0, 2**32 - 1], got {self.seed}")
        check_device(self.device)
        if self.loop not in ("sync", "async"):
            raise BadInput(f"loop must be 'sync' or 'async', got {self.loop!r}")
        if self.autoreset_mode not in ("auto", *AUTORESET):
            raise BadInput(
                f"autoreset_mode must be 'auto' or one of {list(AUTORESET)}, got {self.autoreset_mode!r}"
            )
        if self.data_parallel not in parallel.DATA_PARALLEL:
            raise BadInput(
                f"data_parallel must be one of {list(parallel.DATA_PARALLEL)}, got {self.data_parallel!r}"
            )
        parallel.param_dtype(self.fsdp_param_dtype)  # a ValueError naming the choices
        if self.data_parallel != "fsdp" and (self.fsdp_param_dtype or self.activation_checkpointing):
            raise BadInput("fsdp_param_dtype and activation_checkpointing need data_parallel='fsdp'")
        if self.resume and self.overwrite:
            raise BadInput("resume continues the run in its folder, overwrite clears the folder: give one")

    def make_env(
        self,
        num_envs: int,
        *,
        autoreset: str = "same_step",
        render_mode: str | None = None,
        evaluation: bool = False,
        train_env_kwargs: dict[str, Any] | None = None,
    ) -> gym.vector.VectorEnv:
        """``make_vec_env`` of the configured env (``evaluation``: of the eval env); ``autoreset`` is
        the mode used when the config says ``auto``. ``train_env_kwargs``: the training env made
        with these kwargs instead (e.g. a fixed subset of its starts to evaluate on)."""
        env_id, env_kwargs = self.env, self.env_kwargs
        if evaluation and self.eval_env is not None:
            env_id, env_kwargs = self.eval_env, self.eval_env_kwargs or {}
        elif evaluation and self.eval_env_kwargs is not None:
            env_kwargs = self.eval_env_kwargs
        if train_env_kwargs is not None:
            env_id, env_kwargs = self.env, train_env_kwargs
        return make_vec_env(
            env_id,
            num_envs,
            env_kwargs,
            self.vectorization,
            self.autoreset_mode if self.autoreset_mode != "auto" else autoreset,
            autoreset_required=self.autoreset_mode != "auto",
            render_mode=render_mode,
        )


def check_device(device: str) -> None:
    """A ``ValueError`` naming ``device`` unless this machine has it (``cpu``, ``cuda``, ``cuda:N``)."""
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise BadInput(f"device {device!r} is not a device name: expected cpu, cuda or cuda:N") from None
    if dev.type not in ("cpu", "cuda"):
        raise BadInput(f"device {device!r}: training runs on cpu, cuda or cuda:N")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise BadInput(f"device {device!r}: CUDA is not available on this machine (use cpu)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise BadInput(
                f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s), "
                f"cuda:0 to cuda:{torch.cuda.device_count() - 1}"
            )

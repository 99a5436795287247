"""``CosmosWorldModel``: the Cosmos DiT + Wan VAE + 2AB sampler behind the ``WorldModel`` protocol.

One ``generate`` call is RLinf's ``CosmosEnv._infer_next_chunk_frames`` (§3.7): per env the chunk
of actions is zero-padded (or truncated) to ``model_actions`` (12) rows and scaled by
``action_scaler``; the current frame is encoded into latent 0 (the condition); the other
``model_actions // 4`` latents are sampled from ``80 * randn`` with the 2AB solver; the video is
decoded and frames ``1..frames_per_step`` are returned. Frame ``frames_per_step``, quantized to
uint8, conditions the next call (the per-env state).

Four exact shortcuts are on by default (``faithful=True`` turns them all off, reproducing RLinf's
computation and cost): skipping the CFG branch that gets identical inputs, encoding only frame 0
(causal VAE), decoding only the latents that cover the returned frames (causal decoder), and using
per-block constant cross-attention outputs (the text context is constant).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from nets.cosmos_checkpoint import load_cosmos_dit
from nets.cosmos_dit import TEXT_TOKENS, CosmosDiT
from nets.cosmos_sampler import SIGMA_MAX, guided_x0_fn, karras_sigmas, sample_2ab
from nets.errors import BadInput
from nets.wan_vae import LATENT_CHANNELS, SPATIAL_FACTOR, TEMPORAL_FACTOR, WanVAE

ACTION_DIM = 7
MODEL_ACTIONS = 12  # action rows RLinf's DiT takes (13 frames, 4 latents)


def pad_actions(actions: torch.Tensor, length: int) -> torch.Tensor:
    """``[n, K, A]`` -> ``[n, length, A]``: zero rows appended, or the first ``length`` kept."""
    n, k, a = actions.shape
    if k >= length:
        return actions[:, :length]
    return torch.cat([actions, actions.new_zeros(n, length - k, a)], dim=1)


def frames_to_uint8(frames: torch.Tensor) -> torch.Tensor:
    """RLinf's quantization of generated frames: ``uint8(clamp((x + 1) / 2, 0, 1) * 255)`` (truncates)."""
    return ((frames.float() / 2 + 0.5).clamp(0, 1) * 255).to(torch.uint8)


def _auto_dtype(dtype: torch.dtype | None, device: torch.device | str) -> torch.dtype:
    """``dtype`` if given, else bf16 on CUDA (RLinf) and fp32 elsewhere."""
    if dtype is not None:
        return dtype
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


class CosmosWorldModel:
    """RLinf's Cosmos world model (see the module docstring).

    Args:
        dit: the action DiT (``load_cosmos_dit``).
        vae: the Wan VAE (``WanVAE.from_tokenizer``).
        image_size: (H, W) of the frames, multiples of 16 (RLinf: 256x320).
        frames_per_step: actions in, frames out per ``generate`` (RLinf: 8).
        model_actions: action rows the DiT takes (12 -> 13 frames, 4 latents); a multiple of 4.
        action_scaler: factor for all 7 dims, or one per dim (RLinf: 20 for all, gripper included).
        num_steps: 2AB solver steps (``num_steps + 1`` denoiser evaluations).
        guidance: CFG scale g in ``x0_c + g * (x0_c - x0_u)``; only matters numerically if the
            uncond branch is evaluated (it is then still a no-op: identical inputs).
        batch_size: micro-batch of envs for the DiT and VAE.
        text_context: ``"zeros"`` (RLinf: zero T5 context) or ``"proj_of_zero"`` (Predict2.5
            ``crossattn_proj`` applied to zero text embeddings; needs a checkpoint that has it).
        dtype: compute dtype of both networks; default bf16 on CUDA, fp32 on CPU.
        skip_uncond_branch, encode_first_frame_only, decode_used_latents_only,
        cache_cross_attention: the exact shortcuts (all on by default).
        faithful: turn all four shortcuts off.
        compile_blocks: ``torch.compile`` the DiT's blocks (the first ``generate`` compiles; about
            the same numbers, faster on a GPU; see ``benchmarks/README.md``).
    """

    action_dim = ACTION_DIM
    action_low, action_high = -1.0, 1.0  # trained on LIBERO's delta pose and gripper

    def __init__(
        self,
        dit: CosmosDiT,
        vae: WanVAE,
        *,
        image_size: tuple[int, int] = (256, 320),
        frames_per_step: int = 8,
        model_actions: int = MODEL_ACTIONS,
        action_scaler: float | Sequence[float] = 20.0,
        num_steps: int = 10,
        guidance: float = 7.0,
        batch_size: int = 16,
        text_context: str = "zeros",
        dtype: torch.dtype | None = None,
        skip_uncond_branch: bool = True,
        encode_first_frame_only: bool = True,
        decode_used_latents_only: bool = True,
        cache_cross_attention: bool = True,
        faithful: bool = False,
        compile_blocks: bool = False,
    ) -> None:
        h, w = image_size
        multiple = SPATIAL_FACTOR * dit.config.patch_spatial
        if h % multiple or w % multiple:
            raise BadInput(f"image_size must be multiples of {multiple}, got {h}x{w}")
        if model_actions < TEMPORAL_FACTOR or model_actions % TEMPORAL_FACTOR:
            raise BadInput(
                f"model_actions must be a positive multiple of {TEMPORAL_FACTOR}, got {model_actions}"
            )
        if not 1 <= frames_per_step <= model_actions:
            raise BadInput(
                f"frames_per_step must be in 1..{model_actions} (model_actions), got {frames_per_step}"
            )
        if not dit.config.action_per_latent and dit.config.action_dim != model_actions * ACTION_DIM:
            raise BadInput(
                f"the DiT embeds {dit.config.action_dim} action values, expected model_actions * 7 = "
                f"{model_actions * ACTION_DIM}"
            )
        if text_context not in ("zeros", "proj_of_zero"):
            raise BadInput(f"expected text_context 'zeros' or 'proj_of_zero', got {text_context!r}")
        if text_context == "proj_of_zero" and dit.crossattn_proj is None:
            raise BadInput("text_context='proj_of_zero' needs a checkpoint with crossattn_proj (Predict2.5)")
        if num_steps < 1 or batch_size < 1:
            raise BadInput(f"expected num_steps >= 1 and batch_size >= 1, got {num_steps}, {batch_size}")
        # on the CPU under any device context: generate() scales the actions there
        scaler = torch.as_tensor(action_scaler, dtype=torch.float32, device="cpu").flatten()
        if scaler.numel() not in (1, ACTION_DIM):
            raise BadInput(f"expected action_scaler as a float or {ACTION_DIM} values, got {scaler.numel()}")

        self.dit, self.vae = dit, vae
        self.image_size = (h, w)
        self.frames_per_step = frames_per_step
        self.model_actions = model_actions
        self.action_scaler = scaler.expand(ACTION_DIM).clone()
        self.num_steps = num_steps
        self.guidance = guidance
        self.batch_size = batch_size
        self.text_context = text_context
        self.skip_uncond_branch = skip_uncond_branch and not faithful
        self.encode_first_frame_only = encode_first_frame_only and not faithful
        self.decode_used_latents_only = decode_used_latents_only and not faithful
        self.cache_cross_attention = cache_cross_attention and not faithful
        self._dtype = dtype
        self.to(dit.device)
        if compile_blocks:
            dit.compile_blocks()

    @classmethod
    def from_files(
        cls,
        dit_path: str | Path,
        tokenizer_path: str | Path,
        *,
        prefix: str = "net.",
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        trust_pickle: bool = False,
        **options,
    ) -> CosmosWorldModel:
        """Load the DiT checkpoint (``prefix``: ``"net."`` as RLinf, or ``"net_ema."``) and the Wan
        ``tokenizer.pth`` (as plain data unless ``trust_pickle``); ``options`` are the constructor's
        keyword arguments."""
        dtype = _auto_dtype(dtype, device)
        dit = load_cosmos_dit(dit_path, prefix=prefix, dtype=dtype, device=device, trust_pickle=trust_pickle)
        vae = WanVAE.from_tokenizer(tokenizer_path, dtype=dtype, device=device, trust_pickle=trust_pickle)
        return cls(dit, vae, dtype=dtype, **options)

    # ---- device / dtype ----

    @property
    def device(self) -> torch.device:
        return self.dit.device

    @property
    def dtype(self) -> torch.dtype:
        return self.dit.dtype

    def to(self, device: torch.device | str) -> CosmosWorldModel:
        """Move both networks (cast to the compute dtype) and rebuild the cross-attention cache."""
        dtype = _auto_dtype(self._dtype, device)
        self.dit.to(device=device, dtype=dtype)
        self.vae.to(device=device, dtype=dtype)
        if self.cache_cross_attention:
            self.dit.cache_cross_attention(self.dit.text_context(self.text_context, 1, 1))
        else:
            self.dit.clear_cross_attention_cache()
        return self

    # ---- protocol ----

    def _check_frames(self, frames: torch.Tensor, what: str) -> None:
        h, w = self.image_size
        if frames.ndim != 4 or tuple(frames.shape[1:]) != (3, h, w):
            raise BadInput(f"expected {what} [n, 3, {h}, {w}], got {list(frames.shape)}")

    def start(self, images: torch.Tensor, generator: torch.Generator) -> dict[str, torch.Tensor]:
        """State ``{"frame": uint8 [n, 3, H, W]}`` of ``images`` in [-1, 1] (on the images' device).

        Rounded (``round((x + 1) * 127.5)``), so frames that came from uint8 pixels (``u / 127.5 - 1``)
        are recovered exactly, like RLinf's uint8 frame queue.
        """
        self._check_frames(images, "images")
        return {"frame": torch.round((images.float().clamp(-1, 1) + 1) * 127.5).to(torch.uint8)}

    @torch.no_grad()
    def generate(
        self, state: dict[str, torch.Tensor], actions: torch.Tensor, generator: torch.Generator
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Frames ``[n, frames_per_step, 3, H, W]`` float32 in [-1, 1] and the new state (both on the
        model's device). Noise for all n envs is drawn at once from ``generator`` (CPU), so the
        result does not depend on ``batch_size``."""
        frame = state.get("frame") if isinstance(state, dict) else None
        if frame is None or frame.dtype != torch.uint8:
            raise BadInput("expected state {'frame': uint8 [n, 3, H, W]} from start() or generate()")
        self._check_frames(frame, "state['frame']")
        n, k = frame.shape[0], self.frames_per_step
        if actions.ndim != 3 or tuple(actions.shape) != (n, k, ACTION_DIM):
            raise BadInput(f"expected actions [{n}, {k}, {ACTION_DIM}], got {list(actions.shape)}")
        if generator.device.type != "cpu":
            raise BadInput(f"expected a CPU generator, got one on {generator.device}")

        h, w = self.image_size
        latent_shape = (LATENT_CHANNELS, 1 + self.model_actions // TEMPORAL_FACTOR, h // 8, w // 8)
        noise = SIGMA_MAX * torch.randn((n, *latent_shape), generator=generator, dtype=torch.float32)
        scaled = pad_actions(actions.float().cpu(), self.model_actions) * self.action_scaler
        sigmas = karras_sigmas(self.num_steps)

        frames, last = [], []
        for start in range(0, n, self.batch_size):
            sl = slice(start, start + self.batch_size)
            video = self._generate_batch(frame[sl], scaled[sl], noise[sl], sigmas)
            frames.append(video[:, :, 1 : 1 + k].transpose(1, 2))
            last.append(frames_to_uint8(video[:, :, k]))
        return torch.cat(frames), {"frame": torch.cat(last)}

    def _generate_batch(
        self, frame: torch.Tensor, actions: torch.Tensor, noise: torch.Tensor, sigmas: torch.Tensor
    ) -> torch.Tensor:
        """One micro-batch: uint8 frames ``[b, 3, H, W]`` -> decoded video ``[b, 3, F, H, W]`` (fp32)."""
        device = self.device
        b = frame.shape[0]
        x = frame.to(device).float() / 127.5 - 1
        clip = x[:, :, None]
        if not self.encode_first_frame_only:  # RLinf: frame 0 followed by model_actions zero frames
            clip = torch.cat([clip, clip.new_zeros(b, 3, self.model_actions, *self.image_size)], dim=2)
        x0_cond = torch.zeros(noise.shape, device=device)
        x0_cond[:, :, :1] = self.vae.encode(clip)[:, :, :1]
        cond_mask = torch.zeros(b, noise.shape[2], device=device)
        cond_mask[:, 0] = 1.0

        context = None  # cached constants
        if not self.cache_cross_attention:
            context = self.dit.text_context(self.text_context, b, TEXT_TOKENS)
        x0_fn = guided_x0_fn(
            self.dit,
            x0_cond,
            cond_mask,
            actions.to(device),
            context,
            self.guidance,
            evaluate_uncond=not self.skip_uncond_branch,
        )
        latents = sample_2ab(x0_fn, noise.to(device), sigmas)
        if self.decode_used_latents_only:  # frames 1..k lie in latents 1..1+(k-1)//4
            latents = latents[:, :, : 2 + (self.frames_per_step - 1) // TEMPORAL_FACTOR]
        return self.vae.decode(latents)

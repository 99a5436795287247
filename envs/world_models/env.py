"""The world-model env loop shared by every video model: frames in, imagined frames, rewards out.

``WorldModelVectorEnv`` is a ``ChunkedVectorEnv`` whose "simulator" is a ``WorldModel`` (Cosmos,
OpenSora). Per chunk step it runs the whole batch of envs through the model at once, scores every
new frame with the ResNet-18 reward model and turns the scores into RLinf's rewards:

* score ``c_k = round(sigmoid(RM(frame_k)))``; success at frame k when ``c_k >= success_threshold``;
* relative reward ``r_k = reward_coef * (c_k - c_{k-1})`` (the first frame's ``c`` counts as 0), so a
  return telescopes to ``reward_coef * c`` of the episode's last frame; ``relative_reward=False``
  gives ``c_k`` itself.

Episodes end at the first success frame (terminated; the rest of the chunk is not part of the
episode, as in the simulator envs) or after ``max_episode_steps`` frames (truncated). Resets are per
env (``reset_mask``, autoreset modes of the base class). ``reset_all_on_done=True`` is RLinf's
behaviour instead: when any running episode ends, every other one is truncated with it.

Differences from RLinf kept on purpose (RLinf parity noted): RLinf ends the episode at the end of the
chunk and reports ``reward_coef * c`` of the chunk's last frame, so a success seen mid-chunk can be
lost; RLinf has no per-env resets; its ``states`` are zeros, here there is no ``proprio`` key.

Observations are ``image`` (uint8 (H, W, 3), the model's size, same orientation as the frames given
at reset) and ``instruction``: a subset of the LIBERO env's keys. ``sim_env_id`` and
``sim_env_kwargs()`` make the LIBERO env with exactly these keys and sizes, to evaluate a policy
trained here in the simulator.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from envs.core.errors import bad_input, check_float, check_int, describe
from envs.core.frames import InitialFrame, load_initial_frames
from envs.core.images import resize_bilinear, to_uint8
from envs.core.registration import keywords, unknown_keywords
from envs.core.spaces import observation_space
from envs.core.vector_env import ChunkedVectorEnv, ChunkResult
from envs.world_models.bundles import Bundle, find_bundle
from envs.world_models.model import WorldModel
from envs.world_models.reward import ResnetRewardModel, relative_rewards
from nets.devices import default_device, parse_dtype  # noqa: F401  (the backends import them from here)
from nets.errors import BadInput
from nets.safe_load import UnsafeFileError, torch_load

REWARD_MODEL_FILE = "resnet_rm.pth"


def locate_bundle(
    env_id: str,
    bundles: Mapping[str, Bundle],
    suite: str,
    reward_model: str | os.PathLike | None,
    model_dir: str | os.PathLike | None,
    download: bool,
    revision: str | None,
) -> tuple[Path, Path | None]:
    """The suite's bundle folder and the ``reward_model=`` file (None: the bundle's
    ``resnet_rm.pth``, which the bundle then must hold). Both are checked before any weights load."""
    if suite not in bundles:
        raise BadInput(f"{env_id}: suite must be one of {sorted(bundles)}, got {suite!r}")
    reward_path = None
    if reward_model is not None:
        if not isinstance(reward_model, str | os.PathLike):
            kind = type(reward_model).__name__
            raise bad_input(env_id, "reward_model", "a path to a resnet_rm.pth file", kind)
        reward_path = Path(reward_model)
        if not reward_path.is_file():
            raise FileNotFoundError(
                f"{env_id}: reward_model={str(reward_path)!r} is not a file; expected a resnet_rm.pth "
                "state dict (e.g. written by `python -m trainers.reward_model`)"
            )
    skip = (REWARD_MODEL_FILE,) if reward_path is not None else ()
    return find_bundle(bundles[suite], model_dir, download, revision, skip=skip), reward_path


def bundle_parts(
    root: Path, trust_pickle: bool = False, reward_model: Path | None = None
) -> tuple[ResnetRewardModel, list[InitialFrame]]:
    """What every bundle holds besides its video model: ``resnet_rm.pth`` (or the file
    ``reward_model``, of any width) and ``dataset/`` (read as plain data unless ``trust_pickle``)."""
    path = reward_model if reward_model is not None else root / REWARD_MODEL_FILE
    reward = ResnetRewardModel.from_checkpoint(path, trust_pickle=trust_pickle)
    return reward, load_initial_frames(root / "dataset", trust_pickle=trust_pickle)


def libero_suite(sim_env_id: str | None) -> str | None:
    """The LIBERO suite (task key prefix) of a LIBERO env id: ``"Libero-Spatial-v0"`` -> ``"libero_spatial"``;
    None for another id (or none)."""
    parts = (sim_env_id or "").split(":")[-1].split("-")
    return f"libero_{parts[1].lower()}" if len(parts) == 3 and parts[0] == "Libero" else None


def chunk_options(env_id: str, chunk_size: Any, model_options: Any) -> dict[str, Any]:
    """``model_options`` with the model's ``frames_per_step`` set from ``chunk_size``, which means
    what it means for LIBERO: K actions per step (the model imagines one frame per action), or None
    for one action of shape (D,) per step (one frame). Checked before any weights load: an int >= 1
    or None, and a ``frames_per_step`` in ``model_options`` must agree with it."""
    k = check_int(env_id, "chunk_size", chunk_size, low=1, none_ok=True)
    if model_options is not None and not isinstance(model_options, Mapping):
        raise bad_input(env_id, "model_options", "a dict of the model's options", describe(model_options))
    options = dict(model_options or {})
    frames = options.setdefault("frames_per_step", k or 1)
    if frames != (k or 1):
        raise bad_input(
            env_id,
            "model_options['frames_per_step']",
            f"{k or 1}, what chunk_size={k} gives (set the actions per step with chunk_size alone)",
            describe(frames),
        )
    return options


def check_env_options(env_id: str, env_class: type, options: Mapping[str, Any]) -> None:
    """Refuse, before any weights load, a keyword that neither ``env_class`` (a backend, whose
    ``**env_options`` go to ``WorldModelVectorEnv``) nor ``WorldModelVectorEnv`` takes: a
    ``ValueError`` naming it and listing the accepted ones (not Python's ``TypeError`` once the
    model is loaded)."""
    own = keywords(env_class.__init__)
    base = keywords(WorldModelVectorEnv.__init__) - {"model", "reward_model", "initial_frames", "sim_env_id"}
    unknown = {name: value for name, value in options.items() if name not in base}  # not the backend's own
    if unknown:
        raise unknown_keywords(env_id, unknown, own | base)


class WorldModelVectorEnv(ChunkedVectorEnv):
    """A video world model as a chunked gymnasium vector env (see the module docstring).

    Args:
        model: the video model (``WorldModel`` protocol): ``frames_per_step`` actions in, as many
            frames out per step.
        chunk_size: actions per step, as for LIBERO: the model's ``frames_per_step``, or None for
            a plain (D,) action space (a model of one frame per step); the backends build their
            model from it (``chunk_options``).
        reward_model: the frame success classifier.
        initial_frames: the frames episodes start from (ids index this list); any ``InitialFrame``
            with an image can also be passed at reset. Images are resized bilinearly to the
            model's size unless ``resize_frames=False``, which rejects other sizes.
        env_id: the registered id, used in error messages.
        num_envs: envs run as one batch.
        max_episode_steps: frames per episode before truncation (RLinf training: 256 = 32 chunks).
        reward_coef, relative_reward, success_threshold: reward shaping as in RLinf.
        reset_all_on_done: RLinf's all-env restart (see the module docstring).
        include_instruction: include the ``instruction`` text in observations.
        seed: seeds the noise generator; ``reset(seed=...)`` reseeds it.
        sim_env_id: the LIBERO id whose tasks this model imagines.
        autoreset_mode, render_mode: as for every vector env here.
    """

    def __init__(
        self,
        model: WorldModel,
        reward_model: ResnetRewardModel,
        initial_frames: Sequence[InitialFrame],
        *,
        env_id: str,
        num_envs: int = 1,
        chunk_size: int | None = 8,
        max_episode_steps: int = 256,
        reward_coef: float = 1.0,
        relative_reward: bool = True,
        success_threshold: float = 0.9,
        reset_all_on_done: bool = False,
        include_instruction: bool = True,
        resize_frames: bool = True,
        seed: int = 0,
        sim_env_id: str | None = None,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        render_mode: str | None = "rgb_array",
    ) -> None:
        chunk_size = check_int(env_id, "chunk_size", chunk_size, low=1, none_ok=True)
        if (chunk_size or 1) != model.frames_per_step:
            raise bad_input(
                env_id,
                "chunk_size",
                f"the model's frames_per_step ({model.frames_per_step}), or None for a model of 1",
                chunk_size,
            )
        check_int(env_id, "max_episode_steps", max_episode_steps, low=1)
        check_int(env_id, "seed", seed, low=0)
        check_float(env_id, "reward_coef", reward_coef)
        check_float(env_id, "success_threshold", success_threshold)  # > 1: never succeeds (tests use it)
        if not initial_frames:
            raise bad_input(env_id, "initial_frames", "at least one frame", 0)
        self.model, self.resize_frames = model, resize_frames
        self.sim_env_id = sim_env_id  # before the frames are checked: a frame of another suite is refused
        for i, frame in enumerate(initial_frames):  # checked once here, so resets cannot fail on them
            why = self._check_frame(frame)
            if why:
                raise bad_input(env_id, f"initial frame {i}", why, frame.instruction)
        super().__init__(
            env_id=env_id,
            num_envs=num_envs,
            single_observation_space=observation_space(
                image_size=model.image_size, wrist=False, proprio_dim=0, instruction=include_instruction
            ),
            action_low=np.broadcast_to(np.asarray(model.action_low, np.float32), (model.action_dim,)),
            action_high=np.broadcast_to(np.asarray(model.action_high, np.float32), (model.action_dim,)),
            chunk_size=chunk_size,
            initial_frames=initial_frames,
            autoreset_mode=autoreset_mode,
            render_mode=render_mode,
        )
        self.reward_model = reward_model.to(model.device)
        self.max_episode_steps = max_episode_steps
        self.reward_coef = float(reward_coef)
        self.relative_reward = relative_reward
        self.success_threshold = float(success_threshold)
        self.reset_all_on_done = reset_all_on_done
        self.record_frames = False  # True: info["frames"] holds every imagined frame of the step
        self._generator = torch.Generator().manual_seed(seed)
        self._model_state: dict[str, torch.Tensor] = {}  # per-env tensors, leading dim num_envs
        self._spec: dict[str, tuple[tuple[int, ...], torch.dtype]] | None = None  # see _state_spec
        self._previous = torch.zeros(self.num_envs)  # reward_coef * c of each env's last frame
        self._offloaded = False
        self._device = model.device

    def sim_env_kwargs(self) -> dict[str, Any]:
        """Keyword arguments that make ``sim_env_id`` observe and act exactly like this env."""
        return {
            "image_size": tuple(self.model.image_size),
            "cameras": ("agentview",),
            "proprio": False,
            "chunk_size": self.chunk_size,
            "include_instruction": "instruction" in self.single_observation_space.spaces,
        }

    # ---------------------------------------------------------------- backend hooks
    def _check_frame(self, frame: InitialFrame) -> str | None:
        if frame.image is None:
            return "a frame with an image (export frames with current_frames() after a reset)"
        suite, theirs = libero_suite(self.sim_env_id), frame.task.partition("/")[0]
        if suite and theirs.startswith("libero_") and "/" in frame.task and theirs != suite:
            return f"a frame of a {suite} task (the suite this model imagines), got a {theirs} frame"
        if not self.resize_frames and frame.image.shape[:2] != tuple(self.model.image_size):
            h, w = self.model.image_size
            return f"a {h}x{w} image (resize_frames=False), got {frame.image.shape[0]}x{frame.image.shape[1]}"
        return None

    def _max_episode_steps(self, frame: InitialFrame) -> int:
        return self.max_episode_steps

    def _reset_envs(self, env_ids: np.ndarray, frames: list[InitialFrame]) -> dict[str, np.ndarray]:
        self.onload()
        images = np.stack([resize_bilinear(f.image, self.model.image_size) for f in frames])  # 0..255
        pixels = torch.from_numpy(images).permute(0, 3, 1, 2).to(self.model.device) / 127.5 - 1.0
        with torch.inference_mode():
            state = self.model.start(pixels, self._generator)
        self._store_state(env_ids, state)
        self._previous[env_ids] = 0.0
        return {"image": to_uint8(images)}

    def _step_envs(self, env_ids: np.ndarray, actions: np.ndarray, max_steps: np.ndarray) -> ChunkResult:
        self.onload()
        n, k = actions.shape[:2]
        device = self.model.device
        index = torch.as_tensor(env_ids, device=device)
        with torch.inference_mode():
            state = {key: value[index] for key, value in self._model_state.items()}
            frames, state = self.model.generate(state, torch.from_numpy(actions).to(device), self._generator)
            if tuple(frames.shape) != (n, k, 3, *self.model.image_size):
                raise RuntimeError(f"{self.env_id}: model returned frames {list(frames.shape)}")
            if not torch.isfinite(frames).all():
                raise RuntimeError(f"{self.env_id}: the world model produced non-finite frames")
            scores = self.reward_model(frames.flatten(0, 1)).view(n, k).cpu().numpy()
        self._store_state(env_ids, state)
        success = scores >= self.success_threshold
        steps = np.arange(k)
        first_success = np.where(success.any(1), success.argmax(1), k)
        valid = (steps <= first_success[:, None]) & (steps < max_steps[:, None])
        last = valid.sum(1) - 1  # index of each env's last executed frame (max_steps >= 1)
        rewards = self._rewards(env_ids, scores)
        info: dict[str, np.ndarray] = {"reward_model_scores": scores.astype(np.float32)}
        if self.record_frames:  # every imagined frame to the host; otherwise only the observed ones
            uint8 = _to_uint8(frames.flatten(0, 1)).reshape(n, k, *self.model.image_size, 3)
            info["frames"] = np.empty(n, dtype=object)
            info["frames"][:] = [uint8[i, : last[i] + 1] for i in range(n)]
            observed = uint8[np.arange(n), last]
        else:
            observed = _to_uint8(
                frames[torch.arange(n, device=frames.device), torch.as_tensor(last).to(frames.device)]
            )
        terminated = (success & valid).any(1)
        cut = None
        if self.reset_all_on_done:
            ends = terminated | (valid.sum(1) >= max_steps)
            cut = np.full(n, ends.any()) & ~ends
        obs = {"image": observed}
        return ChunkResult(obs, rewards, valid, success, terminated, info, cut=cut)

    def _rewards(self, env_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        """Per-frame rewards ``[n, K]``; updates each env's previous scaled score.

        The new previous score is the chunk's last frame: an env whose episode ended earlier in
        the chunk (success or step limit) is reset before it is scored again.
        """
        if not self.relative_reward:
            return scores.astype(np.float32)
        rewards, self._previous[env_ids] = relative_rewards(
            torch.from_numpy(scores).float(), self._previous[env_ids], self.reward_coef
        )
        return rewards.numpy()

    def _store_state(self, env_ids: np.ndarray, state: dict[str, torch.Tensor]) -> None:
        if not self._model_state:  # allocate on the first reset, from the model's own shapes
            self._model_state = {
                key: value.new_zeros((self.num_envs, *value.shape[1:])) for key, value in state.items()
            }
        index = torch.as_tensor(env_ids, device=self.model.device)
        for key, value in state.items():
            self._model_state[key][index] = value

    # ---------------------------------------------------------------- sharing a GPU, saving state
    def offload(self) -> None:
        """Move the models and per-env tensors to CPU memory (to free the GPU for the policy)."""
        self._check_open("offload")
        if self._offloaded or self.model.device.type == "cpu":
            return
        self._device = self.model.device
        self._move("cpu")
        self._offloaded = True
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def onload(self) -> None:
        """Undo ``offload``; ``reset`` and ``step`` call it themselves."""
        self._check_open("onload")
        if self._offloaded:
            self._move(self._device)
            self._offloaded = False

    def _move(self, device: torch.device | str) -> None:
        self.model.to(device)
        self.reward_model.to(device)
        self._model_state = {key: value.to(device) for key, value in self._model_state.items()}

    def get_state(self) -> bytes:
        """Everything needed to continue these episodes later (not the weights), as bytes."""
        state = {
            "env_id": self.env_id,
            "episode": self._episode_state(),
            "model_state": {key: value.cpu() for key, value in self._model_state.items()},
            "previous": self._previous.clone(),
            "generator": self._generator.get_state(),
        }
        buffer = io.BytesIO()
        torch.save(state, buffer)
        return buffer.getvalue()

    def load_state(self, data: bytes) -> None:
        """Restore a ``get_state`` snapshot of an env with the same id, model and ``num_envs``.

        The bytes are read as plain data (tensors, numpy arrays, initial frames): no code in them
        runs. The whole state is checked before anything changes (``_read_state``; the model state
        is also moved to the model's device first): a state this env cannot go on from raises a
        ``ValueError`` naming the entry, what was expected and what came, and leaves the env as it was.
        """
        self._check_open("load_state")
        state = self._read_state(data)
        device = self.model.device
        model_state = {key: value.to(device).contiguous() for key, value in state["model_state"].items()}
        previous = state["previous"].clone(memory_format=torch.contiguous_format)
        # from here nothing can fail: every part was checked by _read_state
        self._load_episode_state(state["episode"])
        self._model_state = model_state
        self._previous = previous
        self._generator.set_state(state["generator"])

    _STATE_KEYS = ("env_id", "episode", "model_state", "previous", "generator")

    def _read_state(self, data: Any) -> dict[str, Any]:
        """``get_state``'s bytes read safely and checked against this env; changes nothing."""
        expected = "the bytes get_state returned"
        if not isinstance(data, bytes | bytearray):
            raise bad_input(self.env_id, "state", expected, type(data).__name__)
        try:
            state = torch_load(io.BytesIO(data), numpy=True, allow=[InitialFrame], opt_in=None)
        except UnsafeFileError:
            raise
        except Exception as e:
            raise bad_input(self.env_id, "state", expected, f"unreadable ({e})") from None
        if not isinstance(state, dict) or set(state) != set(self._STATE_KEYS):
            got = f"entries {sorted(map(str, state))}" if isinstance(state, dict) else type(state).__name__
            raise bad_input(self.env_id, "state", f"{expected}: entries {list(self._STATE_KEYS)}", got)
        if type(state["env_id"]) is not str or state["env_id"] != self.env_id:
            raise bad_input(
                self.env_id, "state['env_id']", f"a state of {self.env_id}", describe(state["env_id"])
            )
        self._check_episode_state(state["episode"])
        self._check_model_state(state["model_state"], started=bool(state["episode"]["_started"].all()))
        previous = state["previous"]
        if not (
            type(previous) is torch.Tensor
            and previous.dtype == torch.float32
            and tuple(previous.shape) == (self.num_envs,)
            and previous.layout == torch.strided
            and not previous.requires_grad
            and torch.isfinite(previous).all()
        ):
            raise bad_input(
                self.env_id,
                "state['previous']",
                f"a float32 tensor of shape ({self.num_envs},) with finite values (each env's scaled score)",
                _describe_tensor(previous),
            )
        generator = state["generator"]
        if type(generator) is not torch.Tensor or generator.dtype != torch.uint8 or generator.dim() != 1:
            raise bad_input(
                self.env_id,
                "state['generator']",
                "a CPU torch.Generator state (uint8 tensor)",
                _describe_tensor(generator),
            )
        try:  # on a new generator, so ours is untouched
            torch.Generator().set_state(generator)
        except Exception as e:
            raise bad_input(
                self.env_id, "state['generator']", "a CPU torch.Generator state", f"unusable ({e})"
            ) from None
        return state

    def _check_model_state(self, model_state: Any, started: bool) -> None:
        """The model's per-env tensors: the keys, shapes (leading dim ``num_envs``) and dtypes
        ``model.start`` gives, finite where floating point; none only before the first reset (a
        backend driven through its hooks in a Ray actor has model state but no episodes)."""
        what = "state['model_state']"
        if type(model_state) is not dict or not all(type(k) is str for k in model_state):
            raise bad_input(self.env_id, what, "a dict of the model's per-env tensors", describe(model_state))
        if not model_state and not started:
            return
        spec = self._state_spec()
        want = {
            key: f"{self.num_envs}x{'x'.join(map(str, shape))} {dtype}"
            for key, (shape, dtype) in spec.items()
        }
        got = {key: _describe_tensor(value) for key, value in model_state.items()}
        ok = set(model_state) == set(spec) and all(
            type(value) is torch.Tensor
            and value.layout == torch.strided
            and not value.requires_grad
            and value.dtype == spec[key][1]
            and tuple(value.shape) == (self.num_envs, *spec[key][0])
            for key, value in model_state.items()
        )
        if not ok:
            raise bad_input(self.env_id, what, f"the tensors of this model {want}", got)
        for key, value in model_state.items():
            if value.is_floating_point() and not torch.isfinite(value).all():
                raise bad_input(self.env_id, what, "finite values", f"NaN/inf in {key!r}")

    def _state_spec(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Per-env shape and dtype of each model-state tensor: from the current state, else from
        ``model.start`` on one blank frame (once; its noise from a throwaway generator)."""
        if self._model_state:
            return {key: (tuple(v.shape[1:]), v.dtype) for key, v in self._model_state.items()}
        if self._spec is None:
            blank = torch.zeros((1, 3, *self.model.image_size), device=self.model.device)
            with torch.inference_mode():
                state = self.model.start(blank, torch.Generator().manual_seed(0))
            self._spec = {key: (tuple(v.shape[1:]), v.dtype) for key, v in state.items()}
        return self._spec

    def _seed_backend(self, seed: int) -> None:
        self._generator.manual_seed(seed)  # the noise follows the seed too: reset(seed=s) replays exactly

    def reset(
        self, *, seed: int | Sequence[int] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        saved = self._generator.get_state()
        try:
            return super().reset(seed=seed, options=options)
        except Exception:
            self._generator.set_state(saved)
            raise


def _describe_tensor(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{type(value).__name__} of shape {tuple(value.shape)} and dtype {value.dtype}"
    return describe(value)


def _to_uint8(pixels: torch.Tensor) -> np.ndarray:
    """``[B, 3, H, W]`` in [-1, 1] -> uint8 ``[B, H, W, 3]``, rounded (RLinf truncates: at most 1 lower)."""
    x = ((pixels.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    return x.permute(0, 2, 3, 1).cpu().numpy()

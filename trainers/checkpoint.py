"""Checkpoints that are written atomically and resume a run exactly.

A checkpoint is one ``torch.save`` file ``<run>/checkpoints/iter_<NNNNNN>.pt`` holding the policy
(class, constructor arguments, weights), the optimizer, every random-number generator the run
draws from (torch, numpy, python, the policy's sampling generator, the minibatch shuffler), the
step counters and the run's config. It is written to a temporary name, flushed to disk and then
renamed (and the directory flushed), so a killed run leaves either the previous checkpoint or the
new one, never half of one; temporary files a killed run left are removed by the next save.

Loading runs no code from the file (``nets.safe_load.torch_load``: tensors, containers, strings,
numbers and numpy arrays only), and a SHA-256 of the payload written with it is checked, so a file
with flipped bytes is refused rather than loaded with a wrong weight. The check is bounded work per
byte of file (a crafted file cannot make it hang), and a file that cannot be verified, or a
version-1 file without a SHA-256 unless the caller allows it, is refused with a ``ValueError``.
What a checkpoint says about its policy (class, arguments) is checked before anything is built:
it names only vla-gym's policies (or classes the caller names), and the opt-ins of its saved
arguments (``trust_pickle``, ``download``, ...) are dropped: they come from the caller.
"""

from __future__ import annotations

import hashlib
import math
import random
import warnings
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from nets.errors import BadInput, program_name, reading, run_cli
from nets.file_settings import OPT_IN_KEYS, check_file_settings
from nets.files import check_output
from nets.safe_load import UnsafeFileError, torch_load
from trainers import parallel
from trainers.files import write_atomic

FORMAT = "vla-gym-checkpoint"
VERSION = 2  # 2: with "sha256" (version 1 files, without it, only with allow_unverified=True)
READABLE_VERSIONS = (1, 2)


def seed_all(seed: int, generators: Collection[torch.Generator | None] = ()) -> None:
    """Seed torch's, numpy's and python's global RNGs, and ``generators``, with ``seed``."""
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)
    for g in generators:
        if g is not None:
            g.manual_seed(seed)


def rng_state(generators: dict[str, torch.Generator | None]) -> dict[str, Any]:
    """The state of torch's, numpy's and python's global RNGs and of the named ``generators``."""
    return {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
        "generators": {k: None if g is None else g.get_state() for k, g in generators.items()},
    }


def restore_rng_state(state: dict[str, Any], generators: dict[str, torch.Generator | None]) -> None:
    """Inverse of ``rng_state``: the named generators must exist exactly where they did. Every state is
    tried on a scratch generator first, so a garbled one changes nothing."""
    torch.Generator().set_state(state["torch"])
    np.random.RandomState().set_state(state["numpy"])
    random.Random().setstate(state["python"])
    for name, saved in state["generators"].items():
        if saved is not None and generators.get(name) is not None:
            torch.Generator(device=generators[name].device).set_state(saved)
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    for name, saved in state["generators"].items():
        g = generators.get(name)
        if (saved is None) != (g is None):
            raise BadInput(
                f"checkpoint generator {name!r}: saved {'none' if saved is None else 'a state'}, "
                f"but the run has {'none' if g is None else 'one'}"
            )
        if g is not None:
            g.set_state(saved)


MAX_DEPTH = 100  # containers nested deeper than this are no checkpoint this code writes
# verifying a file's SHA-256 may walk at most this many bytes (plus one per value) per byte of
# file: a few times what a real checkpoint needs (tied weights are hashed once per name), so
# shared references in a crafted file cannot make the walk explode
WORK_PER_FILE_BYTE = 32
WORK_SLACK = 1 << 20


def payload_digest(payload: Any, budget: int | None = None) -> str:
    """SHA-256 over a checkpoint payload: every tensor's and array's dtype, shape and bytes, and
    the ``repr`` of every other value, walked in order (the same after a save/load round trip).

    The walk is iterative (no recursion limit to hit) and refuses, with a ``ValueError``, nesting
    deeper than ``MAX_DEPTH`` and, with a ``budget``, a walk of more than ``budget`` bytes and
    values (a value shared many times is walked each time: a few shared references can stand for
    far more than the file holds)."""
    digest = hashlib.sha256()
    left = float("inf") if budget is None else budget
    stack: list[tuple[Any, int, bool]] = [(payload, 0, False)]  # (value, depth, is closing bytes)

    def spend(work: int) -> None:
        nonlocal left
        left -= work
        if left < 0:
            raise BadInput(
                f"the payload walks to more than {budget} bytes and values, far more than its file "
                "holds (shared references or views)"
            )

    while stack:
        value, depth, closing = stack.pop()
        if closing:
            digest.update(value)
            continue
        spend(1)
        if depth > MAX_DEPTH:
            raise BadInput(f"the payload is nested deeper than {MAX_DEPTH} levels")
        if isinstance(value, torch.Tensor):
            spend(value.numel() * value.element_size())  # before .contiguous() copies a view
            flat = value.detach().cpu().contiguous().reshape(-1)
            digest.update(f"T{flat.dtype}{tuple(value.shape)}".encode())
            digest.update(memoryview(flat.view(torch.uint8).numpy()))
        elif isinstance(value, np.ndarray) and value.dtype != object:
            spend(value.nbytes)
            digest.update(f"A{value.dtype.str}{value.shape}".encode())
            if value.size:  # (memoryview cannot cast an array with a zero in its shape)
                digest.update(memoryview(np.ascontiguousarray(value)).cast("B"))
        elif isinstance(value, (dict, list, tuple)):
            items = [x for pair in value.items() for x in pair] if isinstance(value, dict) else list(value)
            spend(len(items))
            if isinstance(value, dict):
                opening, end = b"{", b"}"
            else:
                opening, end = (b"(" if isinstance(value, tuple) else b"["), b")"
            digest.update(opening)
            stack.append((end, depth, True))
            stack.extend((item, depth + 1, False) for item in reversed(items))
        else:
            text = f"{type(value).__name__}:{value!r};".encode()
            spend(len(text))
            digest.update(text)
    return digest.hexdigest()


def save_checkpoint(path: str | Path, payload: dict[str, Any]) -> Path:
    """Write ``payload`` (plus format tags and its SHA-256) to ``path`` atomically
    (``trainers.files.write_atomic``: temp file, fsync, rename, fsync of the directory). Temp files
    of earlier killed saves are removed (a run folder has one writer: ``trainers/run_folder.py``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(".*.partial"):
        stale.unlink(missing_ok=True)
    data = {"format": FORMAT, "version": VERSION, **payload}
    data["sha256"] = payload_digest(data)
    return write_atomic(path, lambda f: torch.save(data, f), temp_suffix=".partial")


def load_checkpoint(path: str | Path, *, allow_unverified: bool = False) -> dict[str, Any]:
    """Read a checkpoint written by ``save_checkpoint``: safely (no code from the file runs; a
    file that asks for more raises ``UnsafeFileError``), checking its SHA-256. Anything else that
    is wrong with it is a ``BadInput`` naming the file: unreadable, not a checkpoint, a content
    that does not match its SHA-256 or cannot be verified within bounded work (crafted nesting or
    shared references). A version-1 file (written before checkpoints carried a SHA-256) is loaded
    only with ``allow_unverified=True``: a file's ``version`` is no proof that it was never altered."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint file at {path}")
    with reading(path):  # BadInput if unreadable; UnsafeFileError if it asks for code
        data = torch_load(path, numpy=True, opt_in=None)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise BadInput(f"{path} is not a vla-gym checkpoint (expected format {FORMAT!r})")
    version = data.get("version")
    if type(version) is not int or version not in READABLE_VERSIONS:
        raise BadInput(f"{path}: checkpoint version {version!r}, this code reads {READABLE_VERSIONS}")
    if version < 2:
        if not allow_unverified:
            raise BadInput(
                f"{path}: a version-1 checkpoint, which carries no SHA-256 to verify its content; "
                "load it only if you trust it: allow_unverified=True, or re-save it verified with "
                "`python -m trainers.checkpoint --allow-unverified SOURCE OUT`"
            )
        return data
    saved = data.pop("sha256", None)
    budget = WORK_PER_FILE_BYTE * path.stat().st_size + WORK_SLACK
    try:
        actual = payload_digest(data, budget)
    except Exception as e:  # whatever a crafted payload makes the walk raise: not verified
        raise BadInput(f"{path}: cannot verify the checkpoint's SHA-256: {type(e).__name__}: {e}") from None
    if saved != actual:
        raise BadInput(f"{path}: corrupt checkpoint (its content does not match the SHA-256 saved with it)")
    return data


def checkpoint_paths(run_dir: str | Path) -> list[Path]:
    """The run's checkpoints, oldest first."""
    return sorted((Path(run_dir) / "checkpoints").glob("iter_*.pt"))


def latest_checkpoint(source: str | Path, *, allow_unverified: bool = False) -> tuple[Path, dict[str, Any]]:
    """The newest readable checkpoint of a run directory (or ``source`` itself if it is a file).

    A newest file that cannot be read or verified (a disk fault, not a killed run: writes are
    atomic) is skipped with a warning in favour of the one before it. ``allow_unverified``: see
    ``load_checkpoint``.
    """
    source = Path(source)
    if source.is_file():
        return source, load_checkpoint(source, allow_unverified=allow_unverified)
    for _ in range(3):  # a run still training prunes old files: a vanished one means a newer exists
        paths = checkpoint_paths(source)
        if not paths:
            raise FileNotFoundError(
                f"no checkpoints under {source / 'checkpoints'} (expected iter_*.pt files)"
            )
        for path in reversed(paths):
            try:
                return path, load_checkpoint(path, allow_unverified=allow_unverified)
            except UnsafeFileError:
                raise  # never fall back silently past a file that tried to run code
            except FileNotFoundError:
                break  # pruned between listing and reading: list again
            except ValueError as e:
                warnings.warn(f"skipping unreadable checkpoint: {e}", RuntimeWarning, stacklevel=2)
        else:
            raise BadInput(f"none of the checkpoints under {source / 'checkpoints'} can be read")
    raise FileNotFoundError(f"the checkpoints under {source / 'checkpoints'} kept vanishing while being read")


def prune_checkpoints(run_dir: str | Path, keep: int) -> None:
    """Delete all but the ``keep`` newest checkpoints (``keep`` <= 0 keeps all)."""
    if keep > 0:
        for path in checkpoint_paths(run_dir)[:-keep]:
            path.unlink(missing_ok=True)


def policy_observation_space(spec: dict[str, Any], observation_space: Any, source: Any = "") -> Any:
    """The part of an env's Dict observation space that a saved policy reads (``observation_keys``
    of its spec), so a policy trained without a camera runs in an env that renders one."""
    from gymnasium import spaces

    keys = spec.get("observation_keys")
    if keys is None or not isinstance(observation_space, spaces.Dict):
        return observation_space
    missing = [k for k in keys if k not in observation_space.spaces]
    if missing:
        raise BadInput(
            f"{source}: the policy reads observations {keys}; the env has no {missing} "
            f"(it has {list(observation_space.spaces)})"
        )
    return spaces.Dict({k: observation_space.spaces[k] for k in keys})


def policy_state(policy: Any, state: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[str]]:
    """What a checkpoint keeps of a policy: its state dict (or ``state``, e.g. the full state of
    a sharded policy), less the frozen parameters that its constructor loads again from pretrained
    files (policies with ``rebuilds_frozen_weights``: the VLAs' frozen vision / backbone / LoRA
    base weights, several GB), and the names left out."""
    state = policy.state_dict() if state is None else state
    if not getattr(policy, "rebuilds_frozen_weights", False):
        return state, []
    frozen = sorted(name for name, p in policy.named_parameters() if not p.requires_grad)
    return {k: v for k, v in state.items() if k not in set(frozen)}, frozen


def load_policy_state(
    policy: Any, spec: dict[str, Any], where: Any = "", optional: tuple[str, ...] = ()
) -> None:
    """Load a checkpoint's ``spec["state_dict"]`` into ``policy``: every key must match except the
    frozen pretrained ones the checkpoint left out (``spec["omitted"]``) and names starting with
    ``optional`` prefixes."""
    omitted = set(spec.get("omitted", ()))
    result = policy.load_state_dict(spec["state_dict"], strict=False)
    missing = [k for k in result.missing_keys if k not in omitted and not k.startswith(optional)]
    if missing or result.unexpected_keys:
        raise BadInput(
            f"{where}: the policy weights do not fit the policy built for this env "
            f"(missing {missing}, unexpected {list(result.unexpected_keys)})"
        )


def make_sized_policy(
    name: str, observation_space: Any, action_space: Any, kwargs: dict[str, Any], state: Any, where: Any
) -> Any:
    """``make_policy`` for arguments read from a checkpoint whose weights are ``state``: the policy is
    first built on the meta device (no memory), and a parameter whose shape differs from the
    checkpoint's tensor of that name is a ``ValueError`` naming it, before anything is allocated (a
    small file whose saved ``hidden_sizes`` ask for gigabytes is refused, not built). A policy that
    cannot be built on the meta device (one that reads pretrained files as it is built) skips the
    check."""
    from policies.registry import make_policy

    if isinstance(state, Mapping):
        try:
            with torch.device("meta"):
                probe = make_policy(name, observation_space, action_space, **kwargs)
        except Exception:  # built for real below, where its own errors are raised
            probe = None
        if probe is not None:
            for key, tensor in probe.state_dict().items():
                theirs = state.get(key)
                if isinstance(theirs, torch.Tensor) and tuple(theirs.shape) != tuple(tensor.shape):
                    raise BadInput(
                        f"{where}: the saved arguments build {key} of shape {tuple(tensor.shape)} "
                        f"({tensor.numel():,} values), but the checkpoint's weights have "
                        f"{tuple(theirs.shape)}; refused before building it"
                    )
    return make_policy(name, observation_space, action_space, **kwargs)


def checked_policy_spec(spec: Any, source: Any, allow_policies: Collection[str] = ()) -> dict[str, Any]:
    """A checkpoint's policy spec, checked before anything is built from it: ``name`` (and the
    name of a nested policy spec such as a residual policy's ``base``) must be a registered policy
    or in ``allow_policies`` (names the user gave: nothing is imported for a name a file chose);
    ``kwargs`` hold only the class's keywords, as data (``nets.file_settings``): the opt-ins
    (``trust_pickle``, ``download``, ...) are dropped with a warning (they come only from the user's
    own call), and anything naming code, an address or a remote resource is refused."""
    from policies.registry import check_policy_from_file, policy_settings_schema

    where = f"{source}: policy"
    if not isinstance(spec, dict) or not isinstance(spec.get("kwargs"), dict):
        raise BadInput(f"{where}: expected a dict with 'name' and a 'kwargs' dict, got {spec!r:.200}")
    check_policy_from_file(spec.get("name"), where, allow_policies)
    schema = policy_settings_schema(spec["name"])
    kwargs = check_file_settings(spec["kwargs"], schema, f"{where} kwargs", allow=allow_policies)
    nested = [kwargs]
    while nested:  # nested policy specs ({"name": ..., "kwargs": ...}, e.g. a residual's base)
        value = nested.pop()
        if isinstance(value, dict):
            if isinstance(value.get("name"), str) and ("kwargs" in value or value is kwargs.get("base")):
                check_policy_from_file(value["name"], f"{where} kwargs", allow_policies)
            nested.extend(value.values())
        elif isinstance(value, (list, tuple)):
            nested.extend(value)
    return {**spec, "kwargs": kwargs}


def given_opt_ins(
    kwargs: Mapping[str, Any],
    name: str,
    source: Any,
    action_space: Any = None,
    saved: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The opt-ins (``OPT_IN_KEYS``) among the caller's ``kwargs`` to rebuild a checkpoint's policy
    ``name`` with (``source``: the checkpoint): those its class takes as arguments. One it has no
    argument for is left out when it asks for nothing (False or None: what the policy does anyway),
    else a ``ValueError`` names it, the policy and the opt-ins it takes. ``action_space`` resolves
    the name ``auto`` (without it: Gaussian; neither it nor the categorical policy takes one).

    A frozen base's opt-ins (DSRL's or a residual policy's ``base``, whose saved ``kwargs`` lost
    theirs) are given as ``{"base": {"kwargs": {"trust_pickle": true}}}``: with ``saved`` (the
    checkpoint's policy kwargs) they are checked against the base's class the same way and the
    result holds the saved ``base`` with them added."""
    from policies.registry import accepted_arguments, policy_class

    given = {k: v for k, v in kwargs.items() if k in OPT_IN_KEYS}
    found = {}
    if given:
        cls = policy_class(name, action_space)
        takes = accepted_arguments(cls) & OPT_IN_KEYS
        for key, value in given.items():
            if key not in takes and value not in (False, None):
                raise BadInput(
                    f"policy_kwargs {key}={value!r}: the policy of {source} ({cls.__module__}:"
                    f"{cls.__qualname__}) has no {key} argument (of the opt-ins {sorted(OPT_IN_KEYS)} it "
                    f"takes {sorted(takes) or 'none'}); leave {key} out"
                )
        found = {k: v for k, v in given.items() if k in takes}
    base, saved_base = kwargs.get("base"), (saved or {}).get("base")
    if isinstance(base, Mapping) and isinstance(base.get("kwargs"), Mapping):
        if not (isinstance(saved_base, Mapping) and isinstance(saved_base.get("kwargs"), Mapping)):
            raise BadInput(
                f"policy_kwargs base: the policy of {source} ({name}) has no frozen base to give opt-ins to"
            )
        inner = given_opt_ins(base["kwargs"], saved_base["name"], source, action_space, saved_base["kwargs"])
        if inner:
            found["base"] = {**saved_base, "kwargs": {**saved_base["kwargs"], **inner}}
    return found


def resume_opt_ins(
    data: dict[str, Any], path: Any, policy: str, policy_kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    """A resume's checkpoint ``data`` with its policy spec checked, when the command's
    ``policy_kwargs`` give opt-ins (or a frozen ``base``): ``given_opt_ins`` refuses what the run's
    policy does not take before any env is built. ``policy`` names a ``module:Class`` the file may
    name. Otherwise ``data`` unchanged."""
    if not (OPT_IN_KEYS & set(policy_kwargs) or "base" in policy_kwargs):
        return data
    spec = checked_policy_spec(data.get("policy"), path, [policy] if ":" in policy else [])
    given_opt_ins(policy_kwargs, spec["name"], path, saved=spec["kwargs"])
    return {**data, "policy": spec}


def load_policy(
    source: str | Path,
    observation_space: Any,
    action_space: Any,
    *,
    policy_kwargs: dict[str, Any] | None = None,
    allow_policies: Collection[str] = (),
    allow_unverified: bool = False,
) -> Any:
    """The trained policy of a checkpoint (or of a run directory's newest one), rebuilt for the
    given single-env spaces (only the observation keys it was trained on) with the class and
    arguments it was trained with.

    What widens what is loaded comes from this call, never from the file: ``policy_kwargs``
    override the saved arguments (e.g. ``{"trust_pickle": True}`` or ``{"download": True}`` for
    a policy whose pretrained files need them: ``given_opt_ins``; the file's own opt-ins are
    dropped with a warning), ``allow_policies`` are ``module:Class`` names besides vla-gym's
    policies that the file may name, and ``allow_unverified`` reads a version-1 file (no SHA-256)."""

    path, data = latest_checkpoint(source, allow_unverified=allow_unverified)
    spec = checked_policy_spec(data.get("policy"), path, allow_policies)
    space = policy_observation_space(spec, observation_space, path)
    given = policy_kwargs or {}
    overrides = {k: v for k, v in given.items() if k not in OPT_IN_KEYS}
    base = overrides.get("base")
    if isinstance(base, Mapping) and "name" not in base:  # opt-ins for the saved frozen base
        extra = sorted(set(base) - {"kwargs"}) + sorted(set(base.get("kwargs") or {}) - OPT_IN_KEYS)
        if extra:
            raise BadInput(
                f"policy_kwargs base: without a 'name' it gives the saved base of {path} opt-ins only "
                f"(base.kwargs of {sorted(OPT_IN_KEYS)}), got {extra}; give a whole spec to replace it"
            )
        del overrides["base"]
    opt_ins = given_opt_ins(given, spec["name"], path, action_space, spec["kwargs"])
    kwargs = {**spec["kwargs"], **overrides, **opt_ins}
    policy = make_sized_policy(spec["name"], space, action_space, kwargs, spec.get("state_dict"), path)
    load_policy_state(policy, spec, path)
    return policy


def build_policy(
    name: str,
    kwargs: dict[str, Any],
    observation_space: Any,
    action_space: Any,
    *,
    init_policy: str | Path | None = None,
    resume: str | Path | None = None,
    resumed: tuple[Path, dict[str, Any]] | None = None,
) -> tuple[Any, dict[str, Any]]:
    """The policy a run trains, and its spec (``name``, ``kwargs``, ``observation_keys``: what
    ``load_policy`` needs to rebuild it).

    ``name``/``kwargs`` build a new policy. With ``init_policy`` (a checkpoint or run directory) it
    starts from that policy: its class and arguments (``kwargs`` override them; whether there is
    a critic stays the caller's choice) and weights, or, with ``name`` ``"residual"`` or ``"dsrl"``,
    a ``ResidualPolicy`` / ``NoiseSteeredPolicy`` whose frozen base is that policy. With ``resume``
    the policy is rebuilt as the resumed run built it (the caller loads its weights), with the
    opt-ins of ``kwargs`` it takes (``given_opt_ins``; ``resumed``: that checkpoint's ``(path,
    data)`` when the caller has read it already). The checkpoint's spec is checked first
    (``checked_policy_spec``): its opt-ins are dropped and it may name no ``module:Class`` but
    vla-gym's policies and ``name``.
    """
    from gymnasium import spaces

    from policies.registry import make_policy, resolve_policy

    state = None
    allow = [name] if ":" in name else []  # the caller's own module:Class
    if resume:
        path, data = resumed or latest_checkpoint(resume)
        spec = checked_policy_spec(data.get("policy"), path, allow)
        # the resumed run's class and arguments, with the caller's opt-ins it takes (never the file's)
        opt_ins = given_opt_ins(kwargs, spec["name"], path, action_space, spec["kwargs"])
        name, kwargs = spec["name"], {**spec["kwargs"], **opt_ins}
        observation_space = policy_observation_space(spec, observation_space, path)
    elif init_policy:
        path, data = latest_checkpoint(init_policy)
        spec = checked_policy_spec(data.get("policy"), path, allow)
        kept = {k: v for k, v in spec["kwargs"].items() if k != "use_critic"}
        if name in FROZEN_BASE:  # the checkpoint's policy becomes the frozen base
            base = {"name": spec["name"], "kwargs": {**kept, "use_critic": False}}
            given = kwargs.get("base")
            if isinstance(given, Mapping) and "name" not in given:  # additions to the checkpoint's base
                base["kwargs"].update(dict(given.get("kwargs", {})))
                given = None
            kwargs = {**kwargs, "base": given or base}
        else:
            name, kwargs = spec["name"], {**kept, **kwargs}
        state = (path, spec)
        observation_space = policy_observation_space(spec, observation_space, path)
    if resume or (init_policy and name not in FROZEN_BASE):  # weights of this shape follow
        weights = data["policy"].get("state_dict") if isinstance(data.get("policy"), dict) else None
        policy = make_sized_policy(name, observation_space, action_space, kwargs, weights, path)
    else:
        policy = make_policy(name, observation_space, action_space, **kwargs)
    if state is not None:
        load_initial_weights(policy.base if name in FROZEN_BASE else policy, *state)
    built = {"name": resolve_policy(name, action_space), "kwargs": kwargs}
    if isinstance(observation_space, spaces.Dict):  # what it reads: load_policy rebuilds it on these keys
        built["observation_keys"] = list(observation_space.spaces)
    return policy, built


CRITIC_PREFIXES = ("critic_torso.", "value_head.")
ADDED_INPUTS = ("outcome_embedding.",)  # zero-initialised inputs a policy may add to its start's weights
FROZEN_BASE = ("residual", "dsrl")  # policies that keep --init-policy's policy as a frozen base


def load_initial_weights(policy: Any, path: str | Path, spec: dict[str, Any]) -> None:
    """Load another run's policy weights to start from. Only a critic (behaviour cloning trains none;
    PPO adds a fresh one) or a zero-initialised added input (``ADDED_INPUTS``) may be missing,
    besides frozen pretrained weights the checkpoint left out; anything else that does not match is
    an error."""
    load_policy_state(policy, spec, path, optional=(*CRITIC_PREFIXES, *ADDED_INPUTS))


def is_checkpoint(path: Path) -> bool:
    """Whether ``path`` is a vla-gym checkpoint that loads (its checksum verified): the only file an
    export with ``overwrite`` may replace."""
    try:
        load_checkpoint(path)
    except (OSError, ValueError, UnsafeFileError):
        return False
    return True


def export_policy(
    source: str | Path,
    path: str | Path,
    note: dict[str, Any] | None = None,
    *,
    allow_unverified: bool = False,
    overwrite: bool = False,
) -> Path:
    """Write the policy alone (class, arguments, weights; no optimizer or RNG state) of a run's
    newest checkpoint to ``path``: a small file that ``--init-policy`` and ``load_policy`` read.
    ``path`` is never the checkpoint read; an existing one is replaced only with ``overwrite``, and only
    if it is a vla-gym checkpoint.
    ``allow_unverified`` reads a version-1 source (no SHA-256) that you trust; what is written
    carries the SHA-256 of what was read."""
    src, data = latest_checkpoint(source, allow_unverified=allow_unverified)
    check_output(
        path, overwrite=overwrite, ours=is_checkpoint, what="a checkpoint", flag="out", sources=[src]
    )
    payload = {
        "algo": data["algo"],
        "policy": data["policy"],
        "counters": data["counters"],
        "config": data.get("config", {}),
        "exported_from": str(src),
        "note": note or {},
    }
    return save_checkpoint(path, payload)


@dataclass
class RunCheckpoints:
    """A training run's checkpoints: ``save`` writes everything needed to continue exactly from
    the current iteration, ``restore`` loads a checkpoint back into the run's state.

    The state is attached as the run starts: ``spec`` by ``Run.make_policy``, ``sharded`` by
    ``Run.shard``, ``policy``, ``optimizer`` and ``generators`` by ``Run.restore``. ``extra`` is
    what the loop saves besides them (GRPO: the group starts and the reference policy; SAC: the
    critics and the replay buffer).

    With several ranks, rank 0 writes (the ranks hold the same weights and optimizer state, and its
    RNG states are the ones kept) while the others wait at a barrier, so that no rank runs ahead
    of a checkpoint; with FSDP every rank first takes part in gathering the full state.
    """

    run_dir: Path
    algo: str
    configs: dict[str, dict[str, Any]]  # the run's settings as saved (``config.to_dict``)
    keep: int  # newest checkpoints kept; 0: all
    is_main: bool = True
    spec: dict[str, Any] | None = None  # how to rebuild the policy (``build_policy``)
    policy: Any = None
    optimizer: torch.optim.Optimizer | None = None
    generators: dict[str, torch.Generator | None] = field(default_factory=dict)
    sharded: nn.Module | None = None  # fsdp over several ranks: the shard's root module
    extra: dict[str, Any] = field(default_factory=dict)

    def save(self, counters: dict[str, Any]) -> Path:
        """Write ``<run>/checkpoints/iter_<NNNNNN>.pt`` for ``counters`` (iteration, env steps,
        episodes, elapsed) and prune the old ones; returns its path (on every rank)."""
        if self.spec is None:
            raise RuntimeError("Run.save needs a policy built with Run.make_policy (its class and arguments)")
        policy, optimizer = self.policy, self.optimizer
        path = self.run_dir / "checkpoints" / f"iter_{counters['iteration']:06d}.pt"
        if self.sharded is not None:  # every rank takes part in gathering the full state (to rank 0)
            full = parallel.full_state(self.sharded, policy, optimizer)
        if not self.is_main:
            parallel.barrier()
            return path
        if self.sharded is not None:
            state, omitted = policy_state(policy, full[0])
            optimizer_state = full[1]
        else:
            state, omitted = policy_state(policy)
            optimizer_state = optimizer.state_dict()
        payload = {
            "algo": self.algo,
            "config": self.configs,
            "policy": {**self.spec, "state_dict": state, "omitted": omitted},
            "optimizer": optimizer_state,
            "rng": rng_state({"policy": policy.generator, **self.generators}),
            "counters": counters,
            "extra": self.extra,
        }
        save_checkpoint(path, payload)
        prune_checkpoints(self.run_dir, self.keep)
        parallel.barrier()
        return path

    def restore(self, path: Path, data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """Load checkpoint ``data`` (read from ``path``) into the attached policy, optimizer and
        generators; returns its counters and ``extra``. An entry that does not fit (counters of the
        wrong type, optimizer groups of another shape, a garbled RNG state) is a ``BadInput`` naming
        the file and the entry; the run then stops before writing anything."""
        counters, extra = check_counters(data.get("counters"), path), data.get("extra", {})
        if not isinstance(extra, dict):
            raise BadInput(f"{path}: entry 'extra' must be a dict, got {type(extra).__name__}")
        broken = (KeyError, TypeError, RuntimeError, IndexError, AttributeError)
        if self.sharded is not None:  # the weights were loaded before sharding (Run.shard)
            with reading(f"{path}: entry 'optimizer'", *broken):
                parallel.load_optimizer_state(self.sharded, self.policy, self.optimizer, data["optimizer"])
        else:
            load_policy_state(self.policy, data["policy"], path)
            with reading(f"{path}: entry 'optimizer'", *broken):
                self.optimizer.load_state_dict(data["optimizer"])
        with reading(f"{path}: entry 'rng'", *broken):
            restore_rng_state(data["rng"], {"policy": self.policy.generator, **self.generators})
        return counters, extra


COUNTERS = {"iteration": int, "env_steps": int, "episodes": int, "elapsed": float}


def check_counters(counters: Any, path: Any) -> dict[str, Any]:
    """A checkpoint's ``counters``: a dict with each of ``COUNTERS`` a number >= 0 of its type
    (an int is a float too); anything else is a ``BadInput`` naming the file and the entry."""
    if not isinstance(counters, dict):
        raise BadInput(f"{path}: entry 'counters' must be a dict, got {type(counters).__name__}")
    for name, kind in COUNTERS.items():
        value = counters.get(name)
        ok = isinstance(value, int | float) if kind is float else isinstance(value, int)
        if not ok or isinstance(value, bool) or not math.isfinite(value) or value < 0:
            raise BadInput(
                f"{path}: entry counters[{name!r}] must be a finite {kind.__name__} >= 0, got {value!r}"
            )
    return counters


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(
        prog=program_name(), description="Export the policy of a run's newest checkpoint."
    )
    parser.add_argument("source", help="a run directory or a checkpoint file")
    parser.add_argument("out", help="the policy-only checkpoint to write")
    parser.add_argument(
        "--allow-unverified",
        action="store_true",
        help="read a version-1 checkpoint (no SHA-256) that you trust; the export carries one",
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace an existing policy checkpoint at out"
    )
    args = parser.parse_args(argv)
    path = export_policy(
        args.source, args.out, allow_unverified=args.allow_unverified, overwrite=args.overwrite
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    run_cli(main)

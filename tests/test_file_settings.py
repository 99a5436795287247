"""Settings read from a file (a resumed run's config.json, a checkpoint's saved policy arguments) are
typed data checked against an allow-list (``nets.file_settings``): what names code, an executable, an
address or a remote resource is refused at any depth, an unknown key is refused by its path, opt-ins
in any spelling are dropped. Tiny PPO runs on CartPole and Pendulum; nothing starts Ray."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

import envs  # noqa: F401  (registers the ids the allow-lists are read from)
from nets.file_settings import Schema, check_data, check_file_settings, is_opt_in, schema_of
from trainers import checkpoint as ckpt
from trainers.config import untrusted_settings
from trainers.env_factory import env_settings_schema
from trainers.ppo import train as ppo_train

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FAST = ["--no-progress", "--no-tensorboard", "--no-video", "--torch-threads", "1"]


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A finished one-iteration PPO run on CartPole."""
    folder = tmp_path / "run"
    ppo_train.main(
        ["--env", "CartPole-v1", "--num-envs", "2", "--n-steps", "16", "--batch-size", "32",
         "--total-steps", "32", "--eval-every", "-1", "--run-dir", str(folder), *FAST]
    )  # fmt: skip
    return folder


def _tamper(run_dir: Path, **run: object) -> None:
    config = json.loads((run_dir / "config.json").read_text())
    config["run"].update(run)
    (run_dir / "config.json").write_text(json.dumps(config))


LIBERO = "envs:Libero-Spatial-v0"
SHELL = {"runtime_env": {"py_executable": "touch {marker}"}}


@pytest.mark.parametrize(
    "run, refusal",
    [
        (  # the hostile probe's case: a Ray runtime_env whose py_executable is a shell command
            {"env": LIBERO, "env_kwargs": {"ray_actors": 1, "ray_options": SHELL}},
            r"run\.env_kwargs\.ray_options: it is Ray actor options",
        ),
        (  # Ray-v0's inner env names a module to import
            {"env": "envs:Ray-v0", "env_kwargs": {"env": "this:CartPole-v1", "ray_actors": 1}},
            r"run\.env_kwargs\.env: 'this:CartPole-v1' imports a module that is not vla-gym's",
        ),
        (
            {"env": LIBERO, "env_kwargs": {"ray_actors": 1, "ray_address": "10.0.0.9:6379"}},
            r"run\.env_kwargs\.ray_address: it is the address of a Ray cluster",
        ),
        (
            {"env": LIBERO, "env_kwargs": {"camreas": []}},
            r"run\.env_kwargs\.camreas: Libero-Spatial-v0 takes no setting 'camreas' \(it takes .*cameras",
        ),
        (
            {"policy_kwargs": {"torso_kwargs": {"deep": {"runtime_env": {"pip": ["x"]}}}}},
            r"run\.policy_kwargs\.torso_kwargs\.deep\.runtime_env: it is a Ray runtime environment",
        ),
        ({"policy_kwargs": {"hiden_sizes": [8]}}, r"run\.policy_kwargs\.hiden_sizes: .*takes no setting"),
        ({"policy_kwargs": {"hidden_sizes": "big"}}, r"policy_kwargs\.hidden_sizes: expected a JSON list"),
        ({"init_policy": "https://example.com/p.pt"}, r"init_policy: 'https://example.com/p.pt' is a URL"),
    ],
    ids=[
        "runtime_env",
        "ray-v0-module",
        "ray_address",
        "unknown-env-key",
        "deep-runtime_env",
        "unknown-policy-key",
        "wrong-type",
        "url",
    ],  # fmt: skip
)
def test_a_resumed_runs_file_cannot_name_code_or_unknown_settings(run_dir, tmp_path, run, refusal):
    marker = tmp_path / "ran"
    run = json.loads(json.dumps(run).replace("{marker}", str(marker)))
    _tamper(run_dir, **run)
    before = _files(run_dir)
    with pytest.raises(ValueError, match=refusal):
        ppo_train.main(["--resume", str(run_dir), "--total-steps", "64", *FAST])
    assert not marker.exists()  # nothing ran
    assert _files(run_dir) == before  # nothing written


def test_the_users_own_command_line_still_gives_them(run_dir):
    """Given again on the command line, a setting the file may not carry is the user's: taken."""
    _tamper(run_dir, env_kwargs={"ray_address": "10.0.0.9:6379"})
    config = json.loads((run_dir / "config.json").read_text())
    with pytest.raises(ValueError, match="ray_address"):
        untrusted_settings(config, {}, "config.json")
    out = untrusted_settings(config, {"env_kwargs": {"ray_address": "mine"}}, "config.json")
    assert "env_kwargs" not in out["run"]  # the flag's value is used instead of the file's
    _tamper(run_dir, env_kwargs={})
    ppo_train.main(["--resume", str(run_dir), "--total-steps", "64", *FAST])  # an honest file resumes


def test_opt_ins_in_any_spelling_are_dropped_with_a_warning():
    for key in ("trust_pickle", "TrustRemoteCode", "allow-download", "trust_remote_code", "download"):
        assert is_opt_in(key)
    assert not is_opt_in("hidden_sizes")
    with pytest.warns(RuntimeWarning, match=r"ignored \{'Trust-Remote-Code': True\}"):
        out = check_file_settings({"Trust-Remote-Code": True, "a": {"allowDownload": 1, "b": 2}}, None, "f")
    assert out == {"a": {"b": 2}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_file_settings({"download": False}, None, "f") == {}  # asks for nothing: no word


@pytest.mark.parametrize(
    "value, refusal",
    [
        (float("nan"), "expected a finite number"),
        (object(), "expected plain data"),
        ("os:system", "imports a module that is not vla-gym's"),
        ("s3://bucket/x", "is a URL"),
        ({1: 2}, "expected string keys"),
    ],
)
def test_data_read_from_a_file_is_plain(value, refusal):
    with pytest.raises(ValueError, match=refusal):
        check_data({"x": [value]}, "file")
    assert check_data({"x": ["envs:Libero-Spatial-v0", "pick up: the bowl", 1.5, None]}, "file")
    assert check_data("os:system", "file", allow=["os:system"]) == "os:system"  # a name the user gave


def test_schemas_follow_the_signatures():
    libero = env_settings_schema("envs:Libero-Spatial-v0")
    assert not libero.open and {"cameras", "init_states", "ray_actors"} <= set(libero.keys)
    assert "vector_class" not in libero.keys
    assert env_settings_schema("CartPole-v1").open  # gymnasium's own: gym.make's keywords too

    class Base:
        def __init__(self, *, width: int = 1) -> None: ...

    class Child(Base):
        def __init__(self, depth: int = 2, **rest: object) -> None: ...

    schema = schema_of(Child)
    assert set(schema.keys) == {"depth", "width"} and not schema.open  # **rest goes to Base's
    with pytest.raises(ValueError, match=r"f\.width: expected int"):
        check_file_settings({"width": 1.5}, schema, "f")
    assert check_file_settings({"x": 1}, Schema("any", {}, open=True), "f") == {"x": 1}


def test_a_checkpoints_saved_arguments_follow_the_policys_allow_list():
    good = ckpt.checked_policy_spec({"name": "gaussian", "kwargs": {"hidden_sizes": [8]}}, "c.pt")
    assert good["kwargs"] == {"hidden_sizes": [8]}
    with pytest.raises(ValueError, match=r"c\.pt: policy kwargs\.hiddensizes: .*takes no setting"):
        ckpt.checked_policy_spec({"name": "gaussian", "kwargs": {"hiddensizes": [8]}}, "c.pt")
    with pytest.raises(ValueError, match=r"kwargs\.torso_kwargs\.ray_address: it is the address"):
        torso = {"torso_kwargs": {"ray_address": "x"}}
        ckpt.checked_policy_spec({"name": "gaussian", "kwargs": torso}, "c.pt")
    flow = {"name": "flow", "kwargs": {"num_steps": 4, "sampling": {"noise_level": 0.5}}}  # flat or grouped
    assert ckpt.checked_policy_spec(flow, "c.pt")["kwargs"] == flow["kwargs"]

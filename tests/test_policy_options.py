"""The pretrained VLAs' typed options (``policies/options.py``): documented fields, checked keywords,
and what ``python -m trainers --help`` / ``--policy-help NAME`` show of them. Nothing here loads a
model: the keywords are checked before anything else."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from gymnasium import spaces

from policies.flow import FlowSampling
from policies.options import OptionsError, accepted_keywords, build_options
from policies.registry import POLICIES, options_type
from trainers.config import field_docs

VLAS = ["openvla", "openvla_oft", "pi05", "cosmos_policy"]
OBS = spaces.Dict({"instruction": spaces.Text(64), "image": spaces.Box(0, 255, (8, 8, 3), np.uint8)})
ACT = spaces.Box(-1, 1, (2, 7), np.float32)


def test_every_vla_has_documented_options():
    for name in VLAS:
        cls = options_type(name)
        assert cls is not None and dataclasses.is_dataclass(cls), name
        missing = [f.name for f in dataclasses.fields(cls) if not field_docs(cls).get(f.name)]
        assert not missing, f"{cls.__name__} fields without a docstring: {missing}"
        assert [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING] == ["model_path"]
    assert options_type("gaussian") is None and options_type("auto") is None


def test_options_keep_the_constructors_defaults():
    """The defaults the constructors had as keyword defaults (saved checkpoints rely on them)."""
    oft = options_type("openvla_oft")(model_path="m")
    assert (oft.action_head, oft.l1_scale, oft.temperature, oft.top_k, oft.image_keys) == (
        "tokens",
        0.05,
        None,
        0,
        ("image",),
    )
    assert (oft.gripper, oft.max_prompt_tokens, oft.value_type, oft.dtype, oft.append_stop) == (
        "libero",
        64,
        "chunk",
        "auto",
        True,
    )
    pi05 = options_type("pi05")(model_path="m")
    assert pi05.sampling == FlowSampling(num_steps=10)  # pi0.5's own sampler default
    assert (pi05.cameras, pi05.state_key, pi05.max_token_len, pi05.value_vlm_mode) == (
        ("image", "wrist_image"),
        "proprio",
        200,
        "mean_token",
    )
    openvla = options_type("openvla")(model_path="m")
    assert (openvla.temperature, openvla.top_k, openvla.use_cache, openvla.image_keys) == (
        None,
        0,
        True,
        ("image",),
    )
    assert not hasattr(openvla, "action_head")  # OpenVLA-OFT's heads are not the original's options
    cosmos = options_type("cosmos_policy")(model_path="m")
    assert (cosmos.image_size, cosmos.num_steps, cosmos.noise_level, cosmos.center_crop) == (224, 5, 0.5, 0.9)
    assert (cosmos.image_keys, cosmos.sft_split, cosmos.trust_pickle) == (
        ("wrist_image", "image"),
        (0.5, 0.25, 0.25),
        False,
    )


@pytest.mark.parametrize("name", VLAS)
def test_an_unknown_keyword_is_named_with_the_accepted_ones(name):
    """Before anything is loaded: a ValueError (also a TypeError, as Python's own) naming the keyword
    and every keyword the policy accepts."""
    from policies.registry import make_policy

    with pytest.raises(ValueError, match=r"unexpected keyword arguments \['modle_path'\]") as info:
        make_policy(name, OBS, ACT, modle_path="m")
    assert isinstance(info.value, TypeError)
    assert all(k in str(info.value) for k in accepted_keywords(options_type(name)))
    with pytest.raises(OptionsError, match=r"needs the keyword arguments \['model_path'\]"):
        make_policy(name, OBS, ACT)


def test_build_options_takes_keywords_a_dict_or_an_instance():
    cls = options_type("openvla_oft")
    built = build_options(cls, None, {"model_path": "m", "top_k": 5}, "P")
    assert built == cls(model_path="m", top_k=5)
    assert build_options(cls, {"model_path": "m"}, {"top_k": 5}, "P") == built
    assert build_options(cls, built, {}, "P") is built
    with pytest.raises(OptionsError, match="beside options="):
        build_options(cls, built, {"top_k": 1}, "P")
    with pytest.raises(OptionsError, match=r"\['top_k'\] given both"):
        build_options(cls, {"model_path": "m", "top_k": 1}, {"top_k": 2}, "P")
    with pytest.raises(ValueError, match="action_head must be 'tokens' or 'l1'"):
        build_options(cls, None, {"model_path": "m", "action_head": "mse"}, "P")
    # pi0.5: FlowSampling's fields as keywords, or together as sampling=
    pi05 = options_type("pi05")
    flat = build_options(pi05, None, {"model_path": "m", "num_steps": 4, "noise_level": 0.3}, "P")
    assert flat.sampling == FlowSampling(num_steps=4, noise_level=0.3)
    nested = {"model_path": "m", "sampling": {"num_steps": 4, "noise_level": 0.3}}
    assert build_options(pi05, None, nested, "P") == flat
    with pytest.raises(ValueError, match=r"\['num_steps'\] given both"):
        build_options(pi05, None, {"model_path": "m", "sampling": {"num_steps": 4}, "num_steps": 3}, "P")


@pytest.mark.parametrize(
    "name, kwargs, match",
    [
        ("openvla_oft", {"temperature": "hot"}, r"option temperature: expected float \| None, got 'hot'"),
        ("openvla_oft", {"top_k": 2.5}, "option top_k: expected int, got 2.5"),
        ("openvla_oft", {"image_keys": "image"}, "option image_keys: expected a JSON list of str, got 'im"),
        ("openvla_oft", {"lora_targets": ["q_proj", 3]}, "option lora_targets: expected .*Sequence"),
        ("openvla_oft", {"new_action_head": "yes"}, "option new_action_head: expected bool"),
        ("pi05", {"num_steps": "4"}, "option num_steps: expected int, got '4'"),
        ("pi05", {"sampling": 4}, r"option sampling: expected FlowSampling \| Mapping"),
        ("cosmos_policy", {"sft_split": [0.5, "a", 0.25]}, "option sft_split: expected a JSON list of float"),
    ],
)
def test_a_value_of_the_wrong_type_is_named_before_anything_loads(name, kwargs, match):
    """``"temperature": "hot"`` in --policy-kwargs: an OptionsError naming the option, the type its
    field declares and what came, before the model folder is read (``model_path`` does not exist)."""
    from policies.registry import make_policy

    with pytest.raises(OptionsError, match=match):
        make_policy(name, OBS, ACT, model_path="/nonexistent", **kwargs)


def test_values_that_fit_are_kept_or_widened():
    cls = options_type("openvla_oft")
    built = build_options(cls, None, {"model_path": "m", "l1_scale": 1, "image_keys": ["image"]}, "P")
    assert built.l1_scale == 1.0 and isinstance(built.l1_scale, float) and list(built.image_keys) == ["image"]


def test_help_points_to_the_options_and_policy_help_lists_them(capsys):
    from trainers.__main__ import main as trainers_main
    from trainers.run_config import RunConfig

    typed = [name for name in POLICIES if options_type(name) is not None]
    assert sorted(typed) == sorted(VLAS)
    policy_kwargs_help = field_docs(RunConfig)["policy_kwargs"]
    assert "--policy-help NAME" in policy_kwargs_help
    assert all(name in policy_kwargs_help for name in typed)
    with pytest.raises(SystemExit):
        trainers_main(["--help"])
    assert "--policy-help NAME" in " ".join(capsys.readouterr().out.split())

    assert trainers_main(["--policy-help", "openvla_oft"]) == {}
    out = capsys.readouterr().out
    assert "policies.openvla_oft:OpenVLAOFTPolicy" in out and "model_path: str | Path  (required)" in out
    assert "  action_head: str = 'tokens'\n      ``\"tokens\"`` (the LM head's 256 action bins)" in out
    trainers_main(["--policy-help", "pi05"])
    out = capsys.readouterr().out
    assert "FlowSampling's fields" in out and "  num_steps: int = 10\n      Denoising steps N" in out
    trainers_main(["--policy-help", "gaussian"])
    assert "has no options type" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="unknown policy 'nope'"):
        trainers_main(["--policy-help", "nope"])
    # --policy is not an abbreviation of --policy-help: it reaches the trainer (here its check of the env)
    with pytest.raises(ValueError, match="total_steps"):
        trainers_main(["--policy", "gaussian", "--total-steps", "-1"])

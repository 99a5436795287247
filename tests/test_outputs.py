"""One output rule for every writer (``nets.files.check_output``): an existing output is refused unless
``--overwrite``, which replaces only what this project wrote (never a user's other files), and a
writer never writes over the source it reads. Tiny PPO runs on CartPole; no env for the refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from nets.files import check_output, only_entries
from trainers import checkpoint as ckpt
from trainers import demos
from trainers.ppo import train as ppo_train
from trainers.reward_model.train import RewardModelConfig, run

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FAST = ["--no-progress", "--no-tensorboard", "--no-video", "--torch-threads", "1"]


def _ppo(folder: Path, *extra: str) -> Path:
    ppo_train.main(
        ["--env", "CartPole-v1", "--num-envs", "2", "--n-steps", "16", "--batch-size", "32",
         "--total-steps", "32", "--eval-every", "-1", "--run-dir", str(folder), *FAST, *extra]
    )  # fmt: skip
    return folder


def test_the_rule(tmp_path):
    def never(_: Path) -> bool:
        return False

    assert check_output(tmp_path / "new", overwrite=False, ours=never, what="x") == tmp_path / "new"
    (tmp_path / "empty").mkdir()
    check_output(tmp_path / "empty", overwrite=False, ours=never, what="x")  # an empty folder is no output
    mine = tmp_path / "mine.txt"
    mine.write_text("keep")
    with pytest.raises(ValueError, match=r"--out .*mine.txt already exists: pass --overwrite"):
        check_output(mine, overwrite=False, ours=lambda p: True, what="x")
    with pytest.raises(ValueError, match="is not a demos file that vla-gym wrote"):
        check_output(mine, overwrite=True, ours=never, what="a demos file")
    (tmp_path / "link").symlink_to(mine)
    with pytest.raises(ValueError, match="is not x that vla-gym wrote"):  # a link is never written through
        check_output(tmp_path / "link", overwrite=True, ours=lambda p: True, what="x")
    with pytest.raises(ValueError, match="is also the source being read"):
        check_output(
            tmp_path / "link", overwrite=True, ours=lambda p: True, what="checkpoint", sources=[mine]
        )
    assert mine.read_text() == "keep"
    assert only_entries(tmp_path / "empty", ["a"]) and not only_entries(tmp_path, ["empty"])


def test_a_policy_export_never_replaces_its_source_or_a_foreign_file(tmp_path):
    run_dir = _ppo(tmp_path / "run")
    source = ckpt.latest_checkpoint(run_dir)[0]
    before = source.read_bytes()
    with pytest.raises(ValueError, match="is also the source being read"):
        ckpt.main([str(source), str(source)])  # python -m trainers.checkpoint SRC SRC
    assert source.read_bytes() == before
    out = tmp_path / "policy.pt"
    ckpt.main([str(run_dir), str(out)])
    with pytest.raises(ValueError, match="policy.pt already exists: pass --overwrite"):
        ckpt.main([str(run_dir), str(out)])
    ckpt.main([str(run_dir), str(out), "--overwrite"])  # a checkpoint of ours: replaced
    notes = tmp_path / "notes.pt"
    notes.write_text("not a checkpoint")
    with pytest.raises(ValueError, match="notes.pt exists and is not a checkpoint that vla-gym wrote"):
        ckpt.main([str(run_dir), str(notes), "--overwrite"])
    assert notes.read_text() == "not a checkpoint"


def test_demos_and_reward_models_refuse_an_existing_output_before_any_env(tmp_path):
    existing = tmp_path / "demos.h5"
    existing.write_text("a user's file")
    args = ["--env", "CartPole-v1", "--policy", "auto", "--episodes", "1", "--out", str(existing)]
    with pytest.raises(ValueError, match="demos.h5 already exists: pass --overwrite"):
        demos.main(args)
    with pytest.raises(ValueError, match="demos.h5 exists and is not a demos file that vla-gym wrote"):
        demos.main([*args, "--overwrite"])
    assert existing.read_text() == "a user's file"

    bundle = tmp_path / "bundle"  # e.g. a world-model bundle: its weights are not the reward model's
    bundle.mkdir()
    (bundle / "model.safetensors").write_text("weights")
    (bundle / "resnet_rm.pth").write_text("old")
    config = RewardModelConfig(env="CartPole-v1", out=str(bundle), progress=False)
    with pytest.raises(ValueError, match="bundle already exists: pass --overwrite"):
        run(config)
    with pytest.raises(ValueError, match="bundle exists and is not a reward-model folder that vla-gym wrote"):
        run(RewardModelConfig(env="CartPole-v1", out=str(bundle), progress=False, overwrite=True))
    assert sorted(p.name for p in bundle.iterdir()) == ["model.safetensors", "resnet_rm.pth"]


def test_overwrite_never_removes_another_run_made_inside_the_folder(tmp_path):
    outer = _ppo(tmp_path / "outer")
    inner = _ppo(outer / "tb" / "inner")  # a careless --run-dir inside another run's tb/
    with pytest.raises(ValueError, match=r"tb/inner holds another run: move it"):
        _ppo(outer, "--overwrite")
    assert ckpt.latest_checkpoint(inner)[0].exists()

"""Real size on paper (issue 50): every wrapped model's parameter count at its published size (built on
the meta device) against the reference's, the memory/time plan against a hand calculation, and the
GPU benchmark's dry run."""

from __future__ import annotations

import pytest
import torch

from benchmarks import gpu_step_times, gpu_train_steps, real_size, real_size_plan
from nets.errors import BadInput

# the totals each model must reach, and the rows allowed to differ from their reference (with the
# documented size of the difference)
TOTALS = {
    "openvla-7b": 7_541_237_184,  # openvla-7b index total_size / 2
    "openvla-oft": 7_541_237_184 + 151_117_831 + 16_818_176,  # + L1 head + proprio projector
    "pi05": 3_353_433_872,
    "cosmos-policy": 1_956_413_440 + 126_892_531,
    "cosmos-wm": 2_127_684_608 + 126_892_531,
    "opensora-wm": 1_212_991_556 + 83_653_863,
}
DOCUMENTED = {
    ("openvla-7b", "DINOv2 ViT-L/14 reg4 (224 px)"): -2048,  # transformers' mask_token + CLS position
    ("openvla-oft", "DINOv2 ViT-L/14 reg4 (224 px)"): -2048,
    ("pi05", "action expert Gemma 300M (adaRMS)"): 37 * (1024 * 3072 + 3072 - 1024),
    ("pi05", "total"): -257_152 * 1024,  # the expert's lm_head, not built
}


@pytest.mark.parametrize("name", real_size.MODELS)
def test_real_size_counts_equal_the_references(name):
    rows = real_size.count_model(name)
    assert [r for r in rows if r.status == "FAIL"] == []
    total = [r for r in rows if r.component.startswith("total")][-1]
    assert total.ours == TOTALS[name]
    for r in rows:
        if r.status == "DIFF" and not r.component.startswith("keys"):
            assert r.ours - r.reference == DOCUMENTED[name, r.component], r
            assert r.cause


def test_a_difference_is_a_fail_row_with_its_cause():
    row = real_size.compare("x", 10, 12, "ref", expected=(-1, "one missing"))
    assert row.status == "FAIL" and "-2" in row.cause and "one missing" in row.cause
    keys = real_size.compare_keys("keys", {"a": (2,), "b": (3,)}, {"a": (2,), "b": (4,)}, "ref")
    assert keys.status == "FAIL" and "shapes differ" in keys.cause


def test_unknown_model_names_the_choices():
    with pytest.raises(BadInput, match="openvla-oft"):
        real_size.count_model("gpt-7b")
    with pytest.raises(BadInput, match="cosmos-wm"):
        real_size.main(["--models", "pi05", "gpt-7b"])


def test_plan_oft_lora_row_by_hand():
    (row,) = [r for r in real_size_plan.oft_rows(gpus=8) if r.name == "OFT GRPO LoRA r32"]
    r = 32
    llama_layer = 4 * r * (4096 + 4096) + 3 * r * (4096 + 11008)  # q k v o, gate up down
    language = 32 * llama_layer + r * ((2176 + 8704) + (8704 + 4096) + (4096 + 4096)) + r * (4096 + 32064)
    dino = 24 * r * ((1024 + 3072) + (1024 + 1024) + 2 * (1024 + 4096))  # qkv proj fc1 fc2
    siglip = 27 * r * ((1152 + 3456) + (1152 + 1152) + 2 * (1152 + 4304))
    attn_pool = r * (1152 + 1152) + 2 * r * (1152 + 4304)  # its proj, mlp.fc1, mlp.fc2
    lora = language + dino + siglip + attn_pool
    assert lora == 110_536_704 and row.trainable == lora
    assert row.weights == 2 * 7_541_237_184 + 4 * lora  # bf16 base, fp32 adapters
    assert row.grads == 4 * lora and row.optimizer == 8 * lora  # fp32 grads, AdamW m + v
    # activations, checkpointing off: micro-batch 8, bf16, per token per layer 4h + 2h_kv + h + 4f
    # (Llama) or 4h + 2h + h + 2f (ViTs); s = BOS + 256 patches + 40 prompt + 56 actions + STOP
    s = 1 + 256 + 40 + 56 + 1
    llama = 32 * s * 2 * (4 * 4096 + 2 * 4096 + 4096 + 4 * 11008)
    towers = 24 * 261 * 2 * (7 * 1024 + 2 * 4096) + 27 * 256 * 2 * (7 * 1152 + 2 * 4304)
    assert row.act_off == 8 * (llama + towers)
    # forward FLOPs: 2 x params x tokens + attention; the LoRA update 2x forward x 64 samples
    assert row.update_tflop == pytest.approx(2 * 64 * row.act_tflop)
    assert 4.9 < row.act_tflop < 5.3  # ~ 2 x 6.5e9 LLM params x 354 tokens + towers


def test_plan_world_model_dit_flops_match_the_counted_ones():
    # research/worldmodels.md 7.1: flop_counter on meta, Cosmos 4.86 and OpenSora 5.59 TFLOP per sample
    rows = {r.extra["backend"]: r for r in real_size_plan.world_model_rows()}
    assert rows["cosmos"].extra["dit_fwd_tflop"] == pytest.approx(4.86, abs=0.01)
    assert rows["opensora"].extra["dit_fwd_tflop"] == pytest.approx(5.59, abs=0.01)


def test_gpu_step_times_dry_run_checks_and_writes_only_its_table(tmp_path):
    table, json_path = tmp_path / "out" / "steps.txt", tmp_path / "out" / "steps.json"
    args = ["--dry-run", "--table", str(table), "--json", str(json_path)]
    assert gpu_step_times.main(args) is True
    written = sorted(p.name for p in tmp_path.rglob("*") if p.is_file())
    assert written == ["steps.dry_run.txt"]
    text = (tmp_path / "out" / "steps.dry_run.txt").read_text()
    assert (
        "cosmos" in text
        and "opensora" in text
        and (tmp_path / "out" / "steps.dry_run.txt").stat().st_size < 4096
    )
    with pytest.raises(BadInput, match="plan's world-model rows"):
        gpu_step_times.main([*args, "--envs", "64"])
    with pytest.raises(BadInput):
        gpu_step_times.main([*args, "--steps", "0"])
    with pytest.raises(BadInput, match="compiled needs --compile"):
        gpu_step_times.main([*args, "--modes", "compiled"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the skip without CUDA")
def test_gpu_step_times_skips_without_cuda(tmp_path):
    assert gpu_step_times.main(["--table", str(tmp_path / "t.txt")]) is False
    assert list(tmp_path.iterdir()) == []


def test_gpu_train_steps_runs_the_real_code_path_at_tiny_size_on_cpu(tmp_path):
    """The GPU script's act and update on the tiny checkpoints: each model's training options leave
    a part of its parameters trainable, both steps are timed, and the table and JSON are written."""
    table, json_path = tmp_path / "t.txt", tmp_path / "t.json"
    args = ["--size", "tiny", "--device", "cpu", "--repeats", "1", "--steps", "1"]
    args += ["--envs", "4", "--micro", "2"]
    rows = gpu_train_steps.main([*args, "--table", str(table), "--json", str(json_path)])
    assert [r["model"] for r in rows] == ["openvla_oft", "pi05"]
    for r in rows:
        assert 0 < r["trainable_m"] < r["params_b"] * 1e3 and r["act_s"] > 0 and r["update_s"] > 0
    assert "openvla_oft" in table.read_text() and json_path.exists()


def test_gpu_train_steps_plan_columns_come_from_the_plan_rows():
    row = {"model": "openvla_oft", "envs": 16, "micro": 8}
    planned = gpu_train_steps.with_plan(row, 0.4)
    plan = {r.name: r for r in real_size_plan.build_plan(gpus=1)}["OFT GRPO LoRA r32"]
    assert planned["plan_gib"] == pytest.approx(plan.total(checkpointing=False) / 2**30)
    assert planned["plan_update_s"] == pytest.approx(real_size_plan.seconds(plan.update_tflop / 8, 0.4))
    assert planned["plan_act_s"] == pytest.approx(real_size_plan.seconds(plan.act_tflop * 16, 0.4))


def test_gpu_train_steps_bad_input(tmp_path):
    out = ["--table", str(tmp_path / "t.txt"), "--json", str(tmp_path / "t.json")]
    with pytest.raises(BadInput, match="--micro 8 must be <= --envs 4"):
        gpu_train_steps.main(["--size", "tiny", "--device", "cpu", "--envs", "4", "--models", "pi05", *out])
    with pytest.raises(BadInput, match="--steps must be >= 1"):
        gpu_train_steps.main(["--size", "tiny", "--device", "cpu", "--steps", "0", *out])
    if not torch.cuda.is_available():
        with pytest.raises(BadInput, match="--size real needs --device cuda"):
            gpu_train_steps.main(["--device", "cpu", *out])
        assert gpu_train_steps.main(out) == []  # no CUDA: skipped with a message

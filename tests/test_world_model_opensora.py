"""OpenSora backend: STDiT3 conventions and causality, the RFLOW sampler, loaders, and the world model."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from benchmarks.reference_layouts import STDIT3_XL2, expand
from envs.world_models.opensora.model import OpenSoraWorldModel, load_action_stats
from envs.world_models.tiny import write_stats
from nets.opensora_checkpoint import load_stdit3
from nets.opensora_sampler import (
    rflow_sample,
    sampling_timesteps,
    step_sizes,
    timestep_transform,
)
from nets.opensora_stdit3 import (
    RotaryEmbedding,
    STDiT3,
    STDiT3Config,
    apply_rope,
    sincos_2d,
    timestep_embedding,
)
from nets.opensora_tiny import build_tiny_stdit3, write_tiny_stdit3, write_tiny_vae
from nets.opensora_vae import SDXLVAE

COND, STEPS = 4, 8  # condition latents, generated frames (RLinf's numbers)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def dit():
    return build_tiny_stdit3(seed=0)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("opensora")
    return {
        "model": write_tiny_stdit3(root / "ckpt", shards=2),
        "vae": write_tiny_vae(root / "vae"),
        "stats": write_stats(root / "dataset_statistics.json"),
    }


@pytest.fixture(scope="module")
def world_model(files):
    return OpenSoraWorldModel.from_files(
        files["model"], files["vae"], files["stats"], image_size=(32, 32), num_steps=2
    )


def _expected_keys(depth: int) -> set[str]:
    """The STDiT3 checkpoint key set, written out from RLinf's module names."""
    keys = {"x_embedder.proj.weight", "x_embedder.proj.bias", "action_embedder.none_action.weight"}
    keys |= {"t_block.1.weight", "t_block.1.bias", "y_embedder.y_embedding", "rope.freqs"}
    keys |= {"final_layer.linear.weight", "final_layer.linear.bias", "final_layer.scale_shift_table"}
    linears = ["t_embedder.mlp.0", "t_embedder.mlp.2", "fps_embedder.mlp.0", "fps_embedder.mlp.2"]
    linears += [
        "action_embedder.fc.0",
        "action_embedder.fc.2",
        "y_embedder.y_proj.fc1",
        "y_embedder.y_proj.fc2",
    ]
    for kind in ("spatial", "temporal"):
        for i in range(depth):
            block = f"{kind}_blocks.{i}."
            keys |= {block + "scale_shift_table", block + "attn.q_norm.weight", block + "attn.k_norm.weight"}
            for name in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2"):
                linears.append(block + name)
            for name in ("cross_attn.q_linear", "cross_attn.kv_linear", "cross_attn.proj"):
                linears.append(block + name)
    return keys | {f"{name}.{p}" for name in linears for p in ("weight", "bias")}


# ---- STDiT3 conventions --------------------------------------------------------------------------------


def test_real_size_layout_on_meta():
    with torch.device("meta"):
        model = STDiT3(STDiT3Config.xl2_libero())
    state = model.state_dict()
    assert set(state) == _expected_keys(28) and len(state) == 978
    # names and shapes equal the reference layout shared with benchmarks.real_size
    assert {k: tuple(v.shape) for k, v in state.items()} == expand(STDIT3_XL2)
    assert sum(p.numel() for p in model.parameters()) == 1_212_991_556  # buffers not counted
    shapes = {
        "x_embedder.proj.weight": (1152, 4, 1, 2, 2),
        "action_embedder.fc.0.weight": (4608, 7),
        "t_block.1.weight": (6912, 1152),
        "y_embedder.y_embedding": (300, 4096),
        "rope.freqs": (36,),
        "temporal_blocks.27.attn.qkv.weight": (3456, 1152),
        "spatial_blocks.0.attn.q_norm.weight": (72,),
        "final_layer.linear.weight": (32, 1152),
    }
    for key, shape in shapes.items():
        assert tuple(state[key].shape) == shape, key
    with torch.device("meta"):  # the real-size forward, shapes only
        z, actions = torch.empty(2, 4, COND + STEPS, 32, 32), torch.empty(2, STEPS, 7)
        mask = torch.tensor([False] * COND + [True] * STEPS).expand(2, -1)
        out = model(z, torch.full((2,), 1000.0), actions, mask, height=256, width=256)
    assert out.shape == (2, 8, COND + STEPS, 32, 32) and out.dtype == torch.float32


def test_tiny_layout(dit):
    assert set(dit.state_dict()) == _expected_keys(2)
    assert 300_000 < sum(p.numel() for p in dit.parameters()) < 400_000


def test_rope_matches_interleaved_formula():
    dim, length = 8, 5
    rope = RotaryEmbedding(dim)
    freqs = torch.tensor([10000 ** (-2 * j / dim) for j in range(dim // 2)])
    assert torch.allclose(rope.freqs, freqs)
    x = torch.randn(3, 2, length, dim)
    out = apply_rope(x, *rope.cos_sin(length))
    # independent: each interleaved pair (x0, x1) is the complex number x0 + i x1, turned by pos * freq
    angles = torch.arange(length, dtype=torch.float64)[:, None] * freqs.double()[None]
    pairs = torch.view_as_complex(x.double().reshape(3, 2, length, dim // 2, 2).contiguous())
    expected = torch.view_as_real(pairs * torch.polar(torch.ones_like(angles), angles)).reshape(x.shape)
    assert torch.allclose(out.double(), expected, atol=1e-5)


def test_position_embedding_first_half_is_the_column():
    dim, h, w, scale, base = 8, 2, 3, 0.5, 2
    emb = sincos_2d(dim, h, w, scale=scale, base_size=base)
    inv_freq = [1.0, 0.01]  # 1 / 10000 ** (arange(0, dim/2, 2) / (dim/2))

    def axis(p):
        return [math.sin(p * f) for f in inv_freq] + [math.cos(p * f) for f in inv_freq]

    for row in range(h):
        for col in range(w):
            expected = axis(col / scale * base / w) + axis(row / scale * base / h)
            assert torch.allclose(emb[row * w + col], torch.tensor(expected), atol=1e-6), (row, col)
    # the real setting: 256x256 frames, 16x16 tokens, scale 0.5, base 16 -> coordinates 2*index
    emb = sincos_2d(8, 16, 16, scale=0.5, base_size=16)
    assert torch.allclose(emb[3 * 16 + 5, 0], torch.tensor(math.sin(2 * 5)))
    assert torch.allclose(emb[3 * 16 + 5, 4], torch.tensor(math.sin(2 * 3)))


def test_timestep_embedding_is_cos_then_sin_of_raw_t():
    emb = timestep_embedding(torch.tensor([15.0]))[0]
    k = 3
    freq = math.exp(-math.log(10000) * k / 128)
    assert emb.shape == (256,)
    assert math.isclose(emb[k].item(), math.cos(15 * freq), abs_tol=1e-6)
    assert math.isclose(emb[128 + k].item(), math.sin(15 * freq), abs_tol=1e-6)


# ---- causality and masking -----------------------------------------------------------------------------


def _inputs(batch=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(batch, 4, COND + STEPS, 4, 4, generator=g)
    actions = torch.randn(batch, STEPS, 7, generator=g)
    mask = torch.tensor([False] * COND + [True] * STEPS).expand(batch, -1)
    return z, actions, mask


@pytest.mark.parametrize("k", [0, 5])
def test_dit_is_causal_in_actions(dit, k):
    z, actions, mask = _inputs()
    changed = actions.clone()
    changed[:, k] += 1.0
    with torch.no_grad():
        out = dit(z, torch.full((2,), 900.0), actions, mask, height=32, width=32)
        out2 = dit(z, torch.full((2,), 900.0), changed, mask, height=32, width=32)
    assert out.shape == (2, 8, COND + STEPS, 4, 4) and out.dtype == torch.float32
    assert torch.equal(out[:, :, : COND + k], out2[:, :, : COND + k])  # bit-identical before frame 4+k
    assert not torch.allclose(out[:, :, COND + k], out2[:, :, COND + k])


def test_condition_frames_use_timestep_15(dit):
    z, actions, mask = _inputs()
    with torch.no_grad():
        out = dit(z, torch.full((2,), 900.0), actions, mask)
        other_t = dit(z, torch.full((2,), 300.0), actions, mask)
    # condition frames see only themselves (causal) and timestep 15, whatever t is
    assert torch.equal(out[:, :, :COND], other_t[:, :, :COND])
    assert not torch.allclose(out[:, :, COND:], other_t[:, :, COND:])


def _sample(dit, z, actions, steps=3):
    frame_mask = torch.tensor([0] * COND + [1] * STEPS)

    def velocity(x, t, x_mask):
        return dit(x, t, actions, x_mask, height=32, width=32)

    with torch.no_grad():
        return rflow_sample(velocity, z, frame_mask, sampling_timesteps(steps, height=32, width=32))


def test_sampler_is_causal_and_keeps_condition_latents(dit):
    z, actions, _ = _inputs()
    k = 3
    changed = actions.clone()
    changed[:, k] -= 0.5
    out, out2 = _sample(dit, z, actions), _sample(dit, z, changed)
    assert torch.equal(out[:, :, :COND], z[:, :, :COND])  # condition frames untouched
    assert torch.equal(out[:, :, : COND + k], out2[:, :, : COND + k])
    assert not torch.allclose(out[:, :, COND + k], out2[:, :, COND + k])
    assert not torch.allclose(out[:, :, COND:], z[:, :, COND:])


# ---- sampler -------------------------------------------------------------------------------------------


def test_timesteps_and_transform():
    ts = sampling_timesteps(10, height=256, width=256)
    assert torch.allclose(ts, torch.arange(1000.0, 0.0, -100.0), atol=1e-4)
    assert torch.allclose(step_sizes(ts), torch.full((10,), 0.1))
    assert torch.allclose(timestep_transform(ts, height=256, width=256), ts, atol=1e-4)  # identity here only
    shifted = timestep_transform(ts, height=512, width=512)  # ratio 2
    assert torch.allclose(shifted, 2 * ts / (1 + ts / 1000))
    assert shifted[0] == 1000 and (shifted[1:] > ts[1:] + 1).all()
    small = sampling_timesteps(10, height=32, width=32)  # ratio 1/8
    assert torch.allclose(small, ts / 8 / (1 - 7 / 8 * ts / 1000))
    assert torch.allclose(sampling_timesteps(10, height=32, width=32, transform=False), ts)


def test_rflow_euler_steps_with_a_constant_velocity():
    z = torch.randn(1, 4, 6, 2, 2)
    c = torch.randn(1, 4, 1, 2, 2)
    ts = sampling_timesteps(10, height=256, width=256)
    calls = []

    def velocity(x, t, x_mask):
        calls.append((t.clone(), x_mask.clone()))
        garbage = torch.full_like(x, 1e6)  # the learned-sigma channels must be ignored
        return torch.cat([c.expand_as(x), garbage], dim=1)

    out = rflow_sample(velocity, z, torch.tensor([0, 0, 1, 1, 1, 1]), ts)
    assert torch.equal(out[:, :, :2], z[:, :, :2])
    assert torch.allclose(out[:, :, 2:], z[:, :, 2:] + c, atol=1e-5)  # sum of dt = 1
    assert [t.item() for t, _ in calls] == ts.tolist()
    assert all(m.tolist() == [[False, False, True, True, True, True]] for _, m in calls)


# ---- loaders -------------------------------------------------------------------------------------------


def _file_state(folder):
    state = {}
    for shard in sorted(folder.glob("*.safetensors")):
        state.update(load_file(shard))
    return state


def _assert_same(model, state):
    loaded = model.state_dict()
    assert set(loaded) == set(state)
    assert all(torch.equal(loaded[k], state[k]) for k in state)


def test_load_sharded_checkpoint(files):
    folder = files["model"]
    assert len(list(folder.glob("model-0000?-of-00002.safetensors"))) == 2
    model = load_stdit3(folder)
    assert model.config.hidden_size == 64 and model.config.depth == 2  # read from config.json
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    _assert_same(model, _file_state(folder))
    _assert_same(load_stdit3(folder / "model.safetensors.index.json"), _file_state(folder))
    half = load_stdit3(folder, dtype=torch.bfloat16)
    assert all(v.dtype == torch.bfloat16 for v in half.state_dict().values())


def test_load_single_file(tmp_path):
    write_tiny_stdit3(tmp_path, shards=1)
    state = load_file(tmp_path / "model.safetensors")
    _assert_same(load_stdit3(tmp_path / "model.safetensors"), state)
    _assert_same(load_stdit3(tmp_path), state)


def test_load_rejects_mismatched_checkpoints(tmp_path):
    write_tiny_stdit3(tmp_path, shards=1)
    file = tmp_path / "model.safetensors"
    good = load_file(file)
    cases = [
        ({k: v for k, v in good.items() if k != "rope.freqs"}, "missing keys: rope.freqs"),
        ({**good, "extra.weight": torch.zeros(1)}, "unexpected keys: extra.weight"),
        ({**good, "final_layer.scale_shift_table": torch.zeros(3, 64)}, "wrong shapes"),
    ]
    for state, message in cases:
        save_file(state, file)
        with pytest.raises(ValueError, match=message) as info:
            load_stdit3(tmp_path)
        assert "model.safetensors" in str(info.value)
    save_file(good, file)
    (tmp_path / "config.json").unlink()  # falls back to the XL/2 shapes, which the tiny weights do not fit
    with pytest.raises(ValueError, match="default XL/2 config"):
        load_stdit3(file)
    with pytest.raises(FileNotFoundError):
        load_stdit3(tmp_path / "nothing")


def test_load_rejects_an_index_that_disagrees_with_its_shards(tmp_path):
    write_tiny_stdit3(tmp_path, shards=2)
    index_file = tmp_path / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    weight_map = index["weight_map"]
    first, second = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    weight_map["rope.freqs"] = second if weight_map["rope.freqs"] == first else first  # the wrong shard
    index_file.write_text(json.dumps(index))
    with pytest.raises(
        ValueError,
        match=r"weight_map disagrees with the shards \(model-00001-of-00002.*\) on rope.freqs",
    ):
        load_stdit3(tmp_path)


def test_action_stats_flat_and_nested(tmp_path):
    flat = load_action_stats(write_stats(tmp_path / "flat.json"))
    nested = load_action_stats(write_stats(tmp_path / "nested.json", dataset="libero_spatial_no_noops"))
    for a, b in zip(flat, nested):
        assert a.shape == (7,) and a.dtype == torch.float32 and torch.equal(a, b)
    assert flat[0][-1] == -1 and flat[1][-1] == 1  # gripper
    bad = {
        "no_action.json": {"proprio": {"q01": [0.0]}},
        "two_datasets.json": {
            "a": {"action": {"q01": [0], "q99": [1]}},
            "b": {"action": {"q01": [0], "q99": [1]}},
        },
        "no_q99.json": {"action": {"q01": [0.0] * 7}},
        "lengths.json": {"action": {"q01": [0.0] * 7, "q99": [1.0] * 6}},
        "order.json": {"action": {"q01": [1.0] * 7, "q99": [1.0] * 7}},
    }
    for name, data in bad.items():
        (tmp_path / name).write_text(json.dumps(data))
        with pytest.raises(ValueError, match=name):
            load_action_stats(tmp_path / name)


def test_vae_folder_loads_offline_and_samples(files):
    vae = SDXLVAE.from_pretrained(files["vae"], micro_batch=2)
    frames = torch.rand(3, 3, 32, 32) * 2 - 1
    z1 = vae.encode(frames, torch.Generator().manual_seed(1))
    z2 = vae.encode(frames, torch.Generator().manual_seed(1))
    z3 = vae.encode(frames, torch.Generator().manual_seed(2))
    assert z1.shape == (3, 4, 4, 4)
    assert torch.equal(z1, z2) and not torch.allclose(z1, z3)  # posterior samples, not the mean
    mean = vae.module.encode(frames).latent_dist.mean * 0.13025
    assert torch.allclose(mean, z1, atol=1.0) and not torch.allclose(mean, z1)
    decoded = vae.decode(z1)
    assert decoded.shape == (3, 3, 32, 32) and decoded.dtype == torch.float32
    assert torch.allclose(decoded, vae.module.decode(z1 / 0.13025).sample, atol=1e-5)
    with pytest.raises(ValueError, match="frames"):
        vae.encode(torch.zeros(2, 4, 32, 32))


# ---- world model ---------------------------------------------------------------------------------------


def _rollout(model, images, actions, seed):
    g = torch.Generator().manual_seed(seed)
    state = model.start(images, g)
    frames, state2 = model.generate(state, actions, g)
    return state, frames, state2


def test_world_model_shapes_and_state(world_model):
    images = torch.rand(3, 3, 32, 32) * 2 - 1
    actions = torch.randn(3, STEPS, 7) * 0.3
    state, frames, state2 = _rollout(world_model, images, actions, seed=0)
    assert world_model.frames_per_step == STEPS and world_model.action_dim == 7
    assert state["latents"].shape == (3, 4, COND, 4, 4) and state["latents"].dtype == torch.float32
    assert not torch.allclose(state["latents"][:, :, 0], state["latents"][:, :, 1])  # 4 different samples
    assert frames.shape == (3, STEPS, 3, 32, 32) and frames.dtype == torch.float32
    assert torch.isfinite(frames).all() and frames.std() > 0.01
    assert state2["latents"].shape == state["latents"].shape
    # the new state is the last COND generated latents: decoding it gives the last COND frames
    last = world_model.vae.decode(state2["latents"].transpose(1, 2).flatten(0, 1)).unflatten(0, (3, COND))
    assert torch.allclose(last, frames[:, -COND:], atol=1e-5)
    frames2, _ = world_model.generate(state2, actions, torch.Generator().manual_seed(1))
    assert frames2.shape == frames.shape
    assert world_model.to("cpu") is world_model and world_model.device == torch.device("cpu")


def test_world_model_is_deterministic_and_action_conditioned(world_model):
    images = torch.rand(2, 3, 32, 32) * 2 - 1
    actions = torch.randn(2, STEPS, 7) * 0.3
    a = _rollout(world_model, images, actions, seed=0)
    b = _rollout(world_model, images, actions, seed=0)
    c = _rollout(world_model, images, actions, seed=1)
    d = _rollout(world_model, images, actions + 0.5, seed=0)
    assert torch.equal(a[0]["latents"], b[0]["latents"]) and torch.equal(a[2]["latents"], b[2]["latents"])
    assert torch.equal(a[1], b[1])
    assert not torch.allclose(a[1], c[1])
    assert torch.equal(a[0]["latents"], d[0]["latents"]) and not torch.allclose(a[1], d[1])
    # DiT micro-batches of one env give the same result
    stats = {"q01": world_model.q01, "q99": world_model.q99}
    single = OpenSoraWorldModel(
        world_model.dit, world_model.vae, **stats, image_size=(32, 32), num_steps=2, batch_size=1
    )
    e = _rollout(single, images, actions, seed=0)
    assert torch.allclose(a[1], e[1], atol=1e-5)


def test_world_model_in_bfloat16(files):
    model = OpenSoraWorldModel.from_files(
        files["model"], files["vae"], files["stats"], dtype=torch.bfloat16, image_size=(32, 32), num_steps=2
    )
    assert model.dtype == torch.bfloat16 and model.vae.dtype == torch.bfloat16
    _, frames, state = _rollout(model, torch.rand(2, 3, 32, 32) * 2 - 1, torch.randn(2, STEPS, 7) * 0.3, 0)
    assert frames.dtype == torch.float32 and state["latents"].dtype == torch.float32
    assert torch.isfinite(frames).all() and frames.std() > 0.01


def test_world_model_normalizes_actions(world_model):
    q01, q99 = world_model.q01, world_model.q99
    out = world_model.normalize_actions(torch.stack([q01, q99, (q01 + q99) / 2, q99 + (q99 - q01)]))
    expected = torch.tensor([-1.0, 1.0, 0.0, 3.0])[:, None].expand(4, 7)  # no clipping
    assert torch.allclose(out, expected, atol=1e-6)


def test_world_model_rejects_bad_input(world_model, dit):
    g = torch.Generator().manual_seed(0)
    state = world_model.start(torch.zeros(2, 3, 32, 32), g)
    for actions in (torch.zeros(2, STEPS, 6), torch.zeros(2, STEPS - 1, 7), torch.zeros(3, STEPS, 7)):
        with pytest.raises(ValueError, match="actions"):
            world_model.generate(state, actions, g)
    with pytest.raises(ValueError, match="images"):
        world_model.start(torch.zeros(2, 3, 64, 64), g)
    with pytest.raises(ValueError, match="latents"):
        world_model.generate({"latents": torch.zeros(2, 4, 3, 4, 4)}, torch.zeros(2, STEPS, 7), g)
    with pytest.raises(ValueError, match="condition_frames"):
        OpenSoraWorldModel(dit, world_model.vae, q01=world_model.q01, q99=world_model.q99, condition_frames=3)
    with pytest.raises(ValueError, match="q01"):
        OpenSoraWorldModel(dit, world_model.vae, q01=torch.zeros(6), q99=torch.ones(6))

"""The Cosmos world model on tiny random weights: DiT parity with diffusers, sampler math, the exact
shortcuts, the checkpoint loaders (real on-disk formats) and the ``WorldModel`` contract."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("diffusers")

from diffusers import CosmosTransformer3DModel  # noqa: E402
from diffusers.loaders.single_file_utils import convert_cosmos_transformer_checkpoint_to_diffusers  # noqa: E402

from envs.world_models.cosmos.model import CosmosWorldModel  # noqa: E402
from nets.cosmos_checkpoint import load_cosmos_dit  # noqa: E402
from nets.cosmos_dit import CosmosDiT  # noqa: E402
from nets.cosmos_sampler import guided_x0_fn, karras_sigmas, rf_x0, sample_2ab  # noqa: E402
from nets.cosmos_tiny import (  # noqa: E402
    build_tiny_dit,
    tiny_dit_config,
    wan_vae_to_original,
    write_tiny_dit_checkpoint,
    write_tiny_tokenizer,
)
from nets.wan_vae import WanVAE  # noqa: E402

H, W = 32, 48  # pixels; latents 4x6, DiT tokens 2x3 per latent frame
PROJ_IN = 48  # tiny stand-in for Predict2.5's 100352-wide text embeddings


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cosmos")
    paths = {name: d / f"{name}.pt" for name in ("global", "chunk", "proj")}
    models = {
        "global": write_tiny_dit_checkpoint(paths["global"]),
        "chunk": write_tiny_dit_checkpoint(paths["chunk"], action_dim=28, ema=False, seed=1),
        "proj": write_tiny_dit_checkpoint(paths["proj"], crossattn_proj_in_channels=PROJ_IN, seed=2),
    }
    paths["tokenizer"] = d / "tokenizer.pth"
    models["vae"] = write_tiny_tokenizer(paths["tokenizer"])
    return paths, models


@pytest.fixture(scope="module")
def vae(files):
    return WanVAE.from_tokenizer(files[0]["tokenizer"], dtype=torch.float32)


def _world_model(files, vae, kind="global", **options):
    dit = load_cosmos_dit(files[0][kind], dtype=torch.float32)
    options = {"image_size": (H, W), "num_steps": 2, "batch_size": 2, **options}
    return CosmosWorldModel(dit, vae, **options)


def _inputs(b=2, t=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, 16, t, H // 8, W // 8, generator=g)
    timesteps = torch.rand(b, t, generator=g)
    action = torch.randn(b, 12, 7, generator=g)
    context = torch.randn(b, 5, 32, generator=g)
    cond_mask = torch.zeros(b, t)
    cond_mask[:, 0] = 1.0
    return x, timesteps, action, context, cond_mask


# ---- DiT ----


def test_dit_matches_diffusers_cosmos_transformer():
    dit = build_tiny_dit()
    with torch.no_grad():  # diffusers has no action input: zero the action MLPs on our side
        for mlp in (dit.action_embedder_B_D, dit.action_embedder_B_3D):
            for p in mlp.parameters():
                p.zero_()
    state = {f"net.{k}": v.clone() for k, v in dit.state_dict().items() if "action_embedder" not in k}
    ref = CosmosTransformer3DModel(
        in_channels=18,  # 16 latent + condition mask + padding mask, concatenated by us
        out_channels=16,
        num_attention_heads=2,
        attention_head_dim=32,
        num_layers=2,
        text_embed_dim=32,
        adaln_lora_dim=16,
        rope_scale=(1.0, 3.0, 3.0),
        concat_padding_mask=False,
        extra_pos_embed_type=None,
    ).eval()
    ref.load_state_dict(convert_cosmos_transformer_checkpoint_to_diffusers(state), strict=True)
    for block in ref.transformer_blocks:  # diffusers' Attention default is 1e-5; Cosmos uses 1e-6
        for attn in (block.attn1, block.attn2):
            attn.norm_q.eps = attn.norm_k.eps = 1e-6

    x, t, action, context, cond_mask = _inputs()
    mask = cond_mask[:, None, :, None, None].expand(-1, 1, -1, H // 8, W // 8)
    with torch.no_grad():
        ours = dit(x, t, action, context, cond_mask)
        latents = torch.cat([x, mask, torch.zeros_like(mask)], 1)
        theirs = ref(latents, t[:, None, :, None, None], context).sample
    assert ours.shape == theirs.shape == x.shape
    assert theirs.abs().max() > 0.1
    assert (ours - theirs).abs().max() < 1e-5


@pytest.mark.parametrize("action_dim", [84, 28])
def test_actions_change_the_output(action_dim):
    dit = build_tiny_dit(tiny_dit_config(action_dim=action_dim))
    x, t, action, context, cond_mask = _inputs()
    other = action.clone()
    other[:, 8:] += 1.0  # the last 4 actions only: latent 3 in the chunk variant
    with torch.no_grad():
        out_a, out_b = dit(x, t, action, context, cond_mask), dit(x, t, other, context, cond_mask)
        emb_a, lora_a = dit.embed_action(action, cond_mask)
        emb_b, lora_b = dit.embed_action(other, cond_mask)
    assert (out_a - out_b).abs().max() > 1e-3
    if action_dim == 84:  # one embedding broadcast over all latent frames
        assert emb_a.shape == (2, 1, 64) and lora_a.shape == (2, 1, 192)
    else:  # per latent: latent 0 (condition) none, latents 1, 2 untouched by actions 8..11
        assert emb_a.shape == (2, 4, 64) and lora_a.shape == (2, 4, 192)
        assert torch.equal(emb_a[:, 0], torch.zeros_like(emb_a[:, 0]))
        assert torch.equal(emb_a[:, :3], emb_b[:, :3]) and torch.equal(lora_a[:, :3], lora_b[:, :3])
        assert not torch.equal(emb_a[:, 3], emb_b[:, 3])


def test_dit_rejects_bad_inputs():
    dit = build_tiny_dit()
    x, t, action, context, _ = _inputs()
    with pytest.raises(ValueError, match="84 action values"):
        dit(x, t, action[:, :8], context)
    with pytest.raises(ValueError, match=r"expected latents \[B, 16"):
        dit(x[:, :8], t, action, context)
    with pytest.raises(ValueError, match="timesteps"):
        dit(x, t[:, :2], action, context)


@pytest.mark.parametrize("kind", ["zeros", "proj_of_zero"])
def test_cached_cross_attention_equals_full(kind):
    dit = build_tiny_dit(tiny_dit_config(crossattn_proj_in_channels=PROJ_IN))
    x, t, action, _, cond_mask = _inputs()
    context = dit.text_context(kind, 2, 512)
    if kind == "proj_of_zero":  # GELU(bias) of crossattn_proj, repeated over the tokens
        assert torch.allclose(context[0, 0], torch.nn.functional.gelu(dit.crossattn_proj[0].bias))
    with torch.no_grad():
        full = dit(x, t, action, context, cond_mask)
        dit.cache_cross_attention(context)
        cached = dit(x, t, action, None, cond_mask)
    assert (full - cached).abs().max() < 1e-5
    if kind == "zeros":
        assert torch.equal(full, cached)
        assert all(torch.equal(b.cross_attn_const, torch.zeros(64)) for b in dit.blocks)
    with pytest.raises(ValueError, match="tokens are all equal"):
        dit.cache_cross_attention(torch.randn(1, 3, 32))


# ---- sampler ----


def test_karras_sigmas_for_ten_steps():
    sigmas = karras_sigmas(10)
    expected = [80, 45.31, 24.41, 12.38, 5.839, 2.515, 0.9654, 0.3183, 0.08509, 0.01672, 0.002]
    assert sigmas.dtype == torch.float64 and sigmas.shape == (11,)
    assert torch.allclose(sigmas, torch.tensor(expected, dtype=torch.float64), rtol=1e-3)
    assert sigmas[0] == 80.0 and abs(sigmas[-1] - 0.002) < 1e-15


def test_2ab_is_dpm_solver_pp_2m():
    """Against DPM-Solver++(2M) written in its own notation (lambda = -log sigma, alpha = 1)."""

    def x0_fn(x, sigma):
        x = x.double()
        return (torch.tanh(0.3 * x) + 0.05 * sigma * torch.sin(x)).float()

    sigmas = karras_sigmas(6)
    x_init = 80.0 * torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
    calls = []

    def counted(x, sigma):
        calls.append(sigma)
        return x0_fn(x, sigma)

    ours = sample_2ab(counted, x_init, sigmas)
    assert len(calls) == len(sigmas)

    lam = [-math.log(s) for s in sigmas.tolist()]
    x, d_prev = x_init.double(), None
    for i in range(len(lam) - 1):
        d = x0_fn(x, float(sigmas[i])).double()
        h = lam[i + 1] - lam[i]
        x = float(sigmas[i + 1] / sigmas[i]) * x - math.expm1(-h) * d
        if d_prev is not None:
            r = (lam[i] - lam[i - 1]) / h
            x = x + (math.expm1(-h) / h + 1) * (d - d_prev) / r
        d_prev = d
    reference = x0_fn(x, float(sigmas[-1]))
    assert (ours - reference).abs().max() < 1e-5


def test_cfg_with_the_uncond_branch_equals_skipping_it():
    dit = build_tiny_dit()
    x, _, action, _, cond_mask = _inputs()
    x0_cond = torch.zeros_like(x)
    x0_cond[:, :, :1] = x[:, :, :1]
    calls = []
    dit.register_forward_hook(lambda *_: calls.append(1))
    fast = guided_x0_fn(dit, x0_cond, cond_mask, action, guidance=7.0)
    faithful = guided_x0_fn(dit, x0_cond, cond_mask, action, guidance=7.0, evaluate_uncond=True)
    with torch.no_grad():
        a, n_fast = fast(80 * x, 5.0), len(calls)
        b = faithful(80 * x, 5.0)
    assert n_fast == 1 and len(calls) == 3
    assert torch.equal(a, b)
    assert torch.equal(a[:, :, 0], x[:, :, 0])  # the condition latent is kept clean
    with torch.no_grad():
        assert torch.equal(a, rf_x0(dit, 80 * x, 5.0, x0_cond, cond_mask, action))


# ---- VAE ----


def test_vae_causal_shortcuts_are_exact(vae):
    clip = torch.rand(2, 3, 13, H, W, generator=torch.Generator().manual_seed(0)) * 2 - 1
    latents = vae.encode(clip)
    assert latents.shape == (2, 16, 4, H // 8, W // 8) and latents.std() > 0.05
    assert torch.equal(vae.encode(clip[:, :, :1]), latents[:, :, :1])
    video = vae.decode(latents)
    assert video.shape == (2, 3, 13, H, W) and video.std() > 0.05
    assert torch.equal(vae.decode(latents[:, :, :3]), video[:, :, :9])


# ---- loaders ----


def test_dit_checkpoint_round_trip(files):
    paths, models = files
    raw = torch.load(paths["global"], weights_only=False)
    assert {"net.pos_embedder.seq", "net_ema.blocks.0.self_attn._extra_state", "accum_iteration"} <= set(raw)

    dit = load_cosmos_dit(paths["global"], dtype=torch.float32)
    assert isinstance(dit, CosmosDiT) and dit.dtype == torch.float32
    for key, value in models["global"].state_dict().items():
        assert torch.equal(dit.state_dict()[key], value), key
    x, t, action, context, cond_mask = _inputs()
    with torch.no_grad():
        expected = models["global"](x, t, action, context, cond_mask)
        assert torch.equal(dit(x, t, action, context, cond_mask), expected)

    ema = load_cosmos_dit(paths["global"], prefix="net_ema.")  # bf16 default
    assert ema.dtype == torch.bfloat16
    assert torch.equal(ema.blocks[1].mlp.layer2.weight, raw["net_ema.blocks.1.mlp.layer2.weight"])
    assert not torch.equal(ema.blocks[1].mlp.layer2.weight, dit.blocks[1].mlp.layer2.weight.bfloat16())

    c = dit.config
    assert (c.model_channels, c.num_blocks, c.num_heads, c.adaln_lora_dim, c.mlp_ratio) == (64, 2, 2, 16, 4.0)
    assert (c.action_dim, c.crossattn_emb_channels, c.crossattn_proj_in_channels) == (84, 32, None)
    chunk = load_cosmos_dit(paths["chunk"], dtype=torch.float32)
    assert chunk.config.action_dim == 28 and chunk.config.action_per_latent
    proj = load_cosmos_dit(paths["proj"], dtype=torch.float32)
    assert proj.config.crossattn_proj_in_channels == PROJ_IN and proj.crossattn_proj is not None

    nested = paths["global"].with_name("nested.pt")
    torch.save({"model": raw}, nested)
    assert torch.equal(load_cosmos_dit(nested, dtype=torch.float32).final_layer.linear.weight,
                       dit.final_layer.linear.weight)  # fmt: skip


def test_dit_loader_errors(files, tmp_path):
    paths, _ = files
    with pytest.raises(ValueError, match=r"no keys with prefix 'model\.'.*'net\.', 'net_ema\.'"):
        load_cosmos_dit(paths["global"], prefix="model.")
    raw = torch.load(paths["chunk"], weights_only=False)

    def broken(name, edit):
        state = dict(raw)
        edit(state)
        path = tmp_path / f"{name}.pt"
        torch.save(state, path)
        return path

    missing = broken("missing", lambda s: s.pop("net.blocks.1.mlp.layer2.weight"))
    with pytest.raises(ValueError, match=r"missing\.pt.*Missing key.*blocks\.1\.mlp\.layer2\.weight"):
        load_cosmos_dit(missing)
    extra = broken("extra", lambda s: s.update({"net.blocks.0.extra.weight": torch.zeros(2)}))
    with pytest.raises(ValueError, match=r"extra\.pt.*Unexpected key.*blocks\.0\.extra\.weight"):
        load_cosmos_dit(extra)
    shape = broken("shape", lambda s: s.update({"net.blocks.0.self_attn.v_proj.weight": torch.zeros(64, 60)}))
    with pytest.raises(ValueError, match=r"shape\.pt.*size mismatch.*v_proj"):
        load_cosmos_dit(shape)
    no_embedder = broken("no_embedder", lambda s: s.pop("net.x_embedder.proj.1.weight"))
    with pytest.raises(ValueError, match=r"no_embedder\.pt: missing 'x_embedder\.proj\.1\.weight'"):
        load_cosmos_dit(no_embedder)
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=r"corrupt\.pt: cannot read"):
        load_cosmos_dit(corrupt)


def test_tokenizer_round_trip(files, vae, tmp_path):
    paths, models = files
    raw = torch.load(paths["tokenizer"], weights_only=False)
    wan_keys = [
        "conv1.weight",
        "conv2.bias",
        "encoder.conv1.weight",
        "encoder.downsamples.0.residual.0.gamma",
    ]
    wan_keys += ["encoder.downsamples.2.resample.1.weight", "encoder.middle.1.to_qkv.weight"]
    wan_keys += ["decoder.upsamples.4.shortcut.weight", "decoder.upsamples.7.time_conv.weight"]
    wan_keys += ["decoder.upsamples.14.residual.6.bias", "decoder.head.2.weight"]
    for key in wan_keys:
        assert key in raw, key
    assert len(raw) == len(models["vae"].state_dict())
    for key, value in models["vae"].state_dict().items():
        assert torch.equal(vae.vae.state_dict()[key], value), key
    assert set(wan_vae_to_original(models["vae"].state_dict())) == set(raw)

    raw.pop("decoder.upsamples.4.shortcut.weight")
    bad = tmp_path / "tokenizer.pth"
    torch.save(raw, bad)
    with pytest.raises(ValueError, match=r"tokenizer\.pth.*base_dim 8.*conv_shortcut"):
        WanVAE.from_tokenizer(bad)


# ---- the world model ----


def test_generate_contract_and_determinism(files, vae):
    model = _world_model(files, vae)
    assert model.device == torch.device("cpu") and model.to("cpu") is model
    images = torch.rand(3, 3, H, W, generator=torch.Generator().manual_seed(0)) * 2 - 1
    state = model.start(images, torch.Generator())
    assert state["frame"].dtype == torch.uint8 and state["frame"].shape == (3, 3, H, W)
    pixels = torch.randint(0, 256, (1, 3, H, W), dtype=torch.uint8)
    assert torch.equal(model.start(pixels.float() / 127.5 - 1, torch.Generator())["frame"], pixels)

    actions = torch.rand(3, 8, 7, generator=torch.Generator().manual_seed(1)) * 2 - 1
    frames, new_state = model.generate(state, actions, torch.Generator().manual_seed(0))
    assert frames.shape == (3, 8, 3, H, W) and frames.dtype == torch.float32
    assert new_state["frame"].shape == (3, 3, H, W) and new_state["frame"].dtype == torch.uint8
    assert frames.abs().max() <= 1.0 and frames.std() > 0.05
    expected = ((frames[:, -1] / 2 + 0.5).clamp(0, 1) * 255).to(torch.uint8)
    assert torch.equal(new_state["frame"], expected)

    again, again_state = model.generate(state, actions, torch.Generator().manual_seed(0))
    assert torch.equal(frames, again) and torch.equal(new_state["frame"], again_state["frame"])
    other, _ = model.generate(state, actions, torch.Generator().manual_seed(1))
    assert (other - frames).abs().max() > 1e-3
    moved, _ = model.generate(state, -actions, torch.Generator().manual_seed(0))
    assert (moved - frames).abs().max() > 1e-3  # the actions matter
    model.batch_size = 1  # noise is drawn for all envs at once: micro-batching does not change it
    single, _ = model.generate(state, actions, torch.Generator().manual_seed(0))
    assert (single - frames).abs().max() < 1e-4

    with pytest.raises(ValueError, match=r"expected actions \[3, 8, 7\], got \[3, 12, 7\]"):
        model.generate(state, torch.zeros(3, 12, 7), torch.Generator())
    with pytest.raises(ValueError, match=r"expected images \[n, 3, 32, 48\]"):
        model.start(torch.zeros(2, 3, 32, 40), torch.Generator())
    with pytest.raises(ValueError, match="multiples of 16"):
        _world_model(files, vae, image_size=(32, 40))


SHORTCUTS = [
    "skip_uncond_branch",
    "encode_first_frame_only",
    "decode_used_latents_only",
    "cache_cross_attention",
]


@pytest.mark.parametrize("kind", ["global", "proj"])
def test_shortcuts_equal_the_faithful_computation(files, vae, kind):
    text_context = "proj_of_zero" if kind == "proj" else "zeros"
    images = torch.rand(2, 3, H, W, generator=torch.Generator().manual_seed(0)) * 2 - 1
    actions = torch.rand(2, 8, 7, generator=torch.Generator().manual_seed(1)) * 2 - 1

    def run(**options):
        model = _world_model(files, vae, kind, text_context=text_context, **options)
        state = model.start(images, torch.Generator())
        return model.generate(state, actions, torch.Generator().manual_seed(0))[0]

    fast = run()
    tol = 0.0 if kind == "global" else 1e-5  # constant vs 512-token cross-attention: rounding only
    for name in SHORTCUTS:
        assert (run(**{name: False}) - fast).abs().max() <= tol, name
    assert (run(faithful=True) - fast).abs().max() <= tol


def test_chunk_variant_and_from_files(files, vae):
    paths, _ = files
    model = _world_model(files, vae, "chunk", action_scaler=[20.0] * 6 + [1.0])
    state = model.start(torch.zeros(1, 3, H, W), torch.Generator())
    frames, _ = model.generate(state, torch.ones(1, 8, 7), torch.Generator().manual_seed(0))
    assert frames.shape == (1, 8, 3, H, W)

    loaded = CosmosWorldModel.from_files(
        paths["global"], paths["tokenizer"], prefix="net_ema.", image_size=(H, W), num_steps=1
    )
    assert loaded.dtype == torch.float32  # CPU default
    assert loaded.generate(state, torch.ones(1, 8, 7), torch.Generator())[0].shape == (1, 8, 3, H, W)
    with pytest.raises(ValueError, match="proj_of_zero"):
        _world_model(files, vae, text_context="proj_of_zero")


def test_action_scaler_stays_on_the_cpu_under_a_device_context(files, vae):
    """generate() scales the actions on the CPU; a model built inside ``with torch.device(...)`` (as
    benchmarks.world_model_step built it on CUDA) must not put its scaler on that device."""
    dit = load_cosmos_dit(files[0]["global"], dtype=torch.float32)
    with torch.device("meta"):
        model = CosmosWorldModel(dit, vae, image_size=(H, W), num_steps=1, action_scaler=[20.0] * 7)
    assert model.action_scaler.device.type == "cpu"
    state = model.start(torch.zeros(1, 3, H, W), torch.Generator())
    frames, _ = model.generate(state, torch.ones(1, 8, 7), torch.Generator().manual_seed(0))
    assert torch.isfinite(frames).all()

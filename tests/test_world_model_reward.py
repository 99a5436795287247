"""The world-model reward: RLinf's ResNet-18 success classifier in its checkpoint layout."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from envs.world_models.reward import NUM_KEYS, ResnetRewardModel, relative_rewards


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = ResnetRewardModel()
    with torch.no_grad():  # non-trivial BatchNorm statistics, so eval-mode BN is exercised
        for name, buf in m.named_buffers():
            if name.endswith("running_mean"):
                buf.normal_(0.0, 0.1)
            elif name.endswith("running_var"):
                buf.uniform_(0.5, 2.0)
    return m


def test_layout_matches_the_checkpoint(model):
    state = model.state_dict()
    assert len(state) == NUM_KEYS
    assert sum(p.numel() for p in model.parameters()) == 11_180_033
    expected = [
        "net.0.0.weight",
        "net.0.1.num_batches_tracked",
        "net.1.0.conv1.bias",
        "net.1.1.bn2.running_var",
    ]
    expected += ["net.2.0.conv3.weight", "net.4.1.conv2.weight", "net.7.weight", "net.7.bias"]
    for key in expected:
        assert key in state, key
    assert "net.1.0.conv3.weight" not in state  # the first stage keeps resolution and channels
    assert state["net.7.weight"].shape == (1, 512)


def _reference_forward(state, x):
    """The same network written as plain functional calls on the state dict."""

    def bn(x, p):
        return F.batch_norm(x, state[p + ".running_mean"], state[p + ".running_var"], state[p + ".weight"],
                            state[p + ".bias"], training=False, eps=1e-5)  # fmt: skip

    def conv(x, p, stride=1, padding=1):
        return F.conv2d(x, state[p + ".weight"], state[p + ".bias"], stride=stride, padding=padding)

    x = F.max_pool2d(F.relu(bn(conv(x, "net.0.0", 2, 3), "net.0.1")), 3, 2, 1)
    for stage in range(1, 5):
        for block in range(2):
            p = f"net.{stage}.{block}"
            stride = 2 if stage > 1 and block == 0 else 1
            y = F.relu(bn(conv(x, p + ".conv1", stride), p + ".bn1"))
            y = bn(conv(y, p + ".conv2"), p + ".bn2")
            shortcut = conv(x, p + ".conv3", stride, 0) if p + ".conv3.weight" in state else x
            x = F.relu(y + shortcut)
    x = x.mean((2, 3))
    return torch.sigmoid(F.linear(x, state["net.7.weight"], state["net.7.bias"]))[:, 0]


def test_forward_equals_an_independent_computation(model):
    frames = torch.rand(3, 3, 32, 48) * 2 - 1
    expected = _reference_forward(model.state_dict(), frames)
    assert torch.allclose(model.probability(frames), expected, atol=1e-6)
    assert torch.equal(model(frames), torch.round(expected))
    assert set(model(frames).tolist()) <= {0.0, 1.0}
    # inputs are clamped to [-1, 1]; training mode never unfreezes BatchNorm
    assert torch.equal(model.probability(frames * 5), model.probability((frames * 5).clamp(-1, 1)))
    model.train()
    assert not model.training and torch.allclose(model.probability(frames), expected, atol=1e-6)


@pytest.mark.parametrize("wrapped", [True, False])
def test_loads_real_checkpoint_formats_strictly(model, tmp_path, wrapped):
    path = tmp_path / "resnet_rm.pth"
    state = model.state_dict()
    torch.save({"model_state_dict": state} if wrapped else state, path)
    loaded = ResnetRewardModel.from_checkpoint(path)
    frames = torch.rand(2, 3, 64, 64) * 2 - 1
    assert torch.equal(loaded.probability(frames), model.probability(frames))


def test_bad_checkpoints_are_named(model, tmp_path):
    with pytest.raises(FileNotFoundError, match="resnet_rm.pth"):
        ResnetRewardModel.from_checkpoint(tmp_path / "missing" / "resnet_rm.pth")
    state = {k.replace("net.7", "fc"): v for k, v in model.state_dict().items()}
    torch.save(state, tmp_path / "renamed.pth")
    with pytest.raises(ValueError, match="renamed.pth is not a ResnetRM checkpoint"):
        ResnetRewardModel.from_checkpoint(tmp_path / "renamed.pth")
    with pytest.raises(ValueError, match=r"expected frames \[B, 3, H, W\]"):
        model(torch.zeros(2, 64, 64, 3))


def test_relative_rewards_telescope():
    coef = 5.0
    chunks = [torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]]),
              torch.tensor([[1.0, 1.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0]])]  # fmt: skip
    previous, total = torch.zeros(2), torch.zeros(2)
    rewards, previous = relative_rewards(chunks[0], previous, coef)
    assert rewards[0].tolist() == [0.0, 5.0, 0.0, -5.0]
    total += rewards.sum(1)
    rewards, previous = relative_rewards(chunks[1], previous, coef)
    assert rewards[1].tolist() == [0.0, -5.0, 0.0, 0.0]
    total += rewards.sum(1)
    assert total.tolist() == [coef * 1.0, coef * 0.0] and previous.tolist() == [5.0, 0.0]

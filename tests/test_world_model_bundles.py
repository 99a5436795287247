"""Where world-model weights are looked for: model_dir, the environment variable, the HF cache."""

from __future__ import annotations

import pytest

from envs.world_models.bundles import COSMOS_LIBERO_SPATIAL, find_bundle, missing_files


def fill(directory, bundle=COSMOS_LIBERO_SPATIAL):
    for rel in bundle.files:
        path = directory / rel.rstrip("/")
        if rel.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
            (path / "traj0.npy").write_bytes(b"x")
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"x")
    return directory


@pytest.fixture
def offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))  # read at import
    monkeypatch.delenv(COSMOS_LIBERO_SPATIAL.env_var, raising=False)
    return tmp_path


def test_model_dir_first_then_environment_variable(offline, monkeypatch):
    a, b = fill(offline / "a"), fill(offline / "b")
    monkeypatch.setenv(COSMOS_LIBERO_SPATIAL.env_var, str(b))
    assert find_bundle(COSMOS_LIBERO_SPATIAL, a) == a
    assert find_bundle(COSMOS_LIBERO_SPATIAL) == b
    (b / "resnet_rm.pth").unlink()
    with pytest.raises(FileNotFoundError, match=r"\$VLA_GYM_COSMOS_LIBERO_SPATIAL = .*missing resnet_rm.pth"):
        find_bundle(COSMOS_LIBERO_SPATIAL)


def test_hugging_face_cache_layout_is_found_offline(offline):
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = offline / "hub" / "models--tayalmanan--cosmos-robotics"
    fill(repo / "snapshots" / commit / COSMOS_LIBERO_SPATIAL.subfolder)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    found = find_bundle(COSMOS_LIBERO_SPATIAL)
    assert found == repo / "snapshots" / commit / COSMOS_LIBERO_SPATIAL.subfolder
    assert missing_files(COSMOS_LIBERO_SPATIAL, found) == []


def test_nothing_found_names_files_places_and_the_command(offline):
    with pytest.raises(FileNotFoundError) as err:
        find_bundle(COSMOS_LIBERO_SPATIAL)
    text = str(err.value)
    for part in (*COSMOS_LIBERO_SPATIAL.files, "$VLA_GYM_COSMOS_LIBERO_SPATIAL (unset)", "downloads off"):
        assert part in text
    assert (
        'hf download tayalmanan/cosmos-robotics --include "models/Cosmos-Predict2.5-LIBERO-Spatial/*"' in text
    )


def test_downloads_are_opt_in_and_pinned_to_a_revision(offline):
    with pytest.raises(ValueError, match="download=True needs revision='<commit hash>'"):
        find_bundle(COSMOS_LIBERO_SPATIAL, download=True)
    pinned, newer = "0123456789abcdef0123456789abcdef01234567", "89abcdef0123456789abcdef0123456789abcdef"
    repo = offline / "hub" / "models--tayalmanan--cosmos-robotics"
    for commit in (pinned, newer):
        fill(repo / "snapshots" / commit / COSMOS_LIBERO_SPATIAL.subfolder)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(newer)  # the repository moved on: the pin still gets its commit
    found = find_bundle(COSMOS_LIBERO_SPATIAL, revision=pinned)
    assert found == repo / "snapshots" / pinned / COSMOS_LIBERO_SPATIAL.subfolder

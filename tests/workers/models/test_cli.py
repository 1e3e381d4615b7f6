"""`python -m workers`: describe presets without allocating weights, verify checkpoints."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from workers.__main__ import main
from workers.models import loading

REPO = Path(__file__).resolve().parents[3]
GB = 1024**3


def _describe(capsys: pytest.CaptureFixture[str], preset: str) -> dict:
    assert main(["describe", preset, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _camera_params(state_dict: dict[str, list[int]]) -> int:
    return sum(
        math.prod(shape)
        for key, shape in state_dict.items()
        if ".cam_" in key or "wancamctrl" in key or "c2ws_hidden_states" in key
    )


# ---- describe ----


@pytest.mark.heavy
def test_describe_14b_shapes_and_counts(capsys) -> None:
    info = _describe(capsys, "lingbot-world-v2-14b")
    assert {"preset", "params", "components"} <= set(info)
    assert info["preset"] == "lingbot-world-v2-14b"
    assert set(info["components"]) == {"dit", "vae", "t5"}
    assert info["resolution"] == [832, 480]
    assert info["tokens_per_latent_frame"] == (480 // 16) * (832 // 16)

    dit = info["components"]["dit"]["state_dict"]
    assert dit["patch_embedding.weight"] == [5120, 36, 1, 2, 2]
    assert dit["patch_embedding_wancamctrl.weight"] == [5120, 1536]
    assert dit["time_projection.1.weight"] == [30720, 5120]
    assert dit["head.head.weight"] == [64, 5120]
    assert dit["blocks.39.cam_injector_layer1.weight"] == [5120, 5120]
    assert dit["text_embedding.0.weight"] == [5120, 4096]
    assert "blocks.40.self_attn.q.weight" not in dit

    params = info["params"]
    assert 18.4e9 <= params["dit"] <= 18.7e9
    assert 4.2e9 <= _camera_params(dit) <= 4.3e9
    # The reported counts are the state dicts' element counts (no buffers, nothing double-counted).
    for component, entry in info["components"].items():
        assert entry["params"] == params[component] == sum(math.prod(s) for s in entry["state_dict"].values())


def test_describe_1_3b_shapes_and_counts(capsys) -> None:
    info = _describe(capsys, "lingbot-world-v2-1.3b")
    dit = info["components"]["dit"]["state_dict"]
    assert 1.70e9 <= info["params"]["dit"] <= 1.72e9
    assert dit["patch_embedding.weight"] == [1536, 36, 1, 2, 2]
    assert dit["patch_embedding_wancamctrl.weight"] == [1536, 1536]
    assert dit["time_projection.1.weight"] == [9216, 1536]
    assert dit["head.head.weight"] == [64, 1536]
    assert dit["text_embedding.0.weight"] == [1536, 4096]
    assert dit["blocks.29.cam_injector_layer1.weight"] == [1536, 1536]
    assert "blocks.30.cam_injector_layer1.weight" not in dit
    # Same VAE and umT5 as the 14B release.
    assert info["components"]["t5"]["params"] == info["params"]["t5"] > 5e9


def test_describe_human_readable(capsys) -> None:
    assert main(["describe", "tiny"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("tiny, lingbot-world (random weights")
    assert [line.split(":")[0].strip() for line in out[1:]] == ["dit", "vae", "t5"]
    assert all(line.endswith(")") and "parameters" in line for line in out[1:])


def test_describe_allocates_no_weights(capsys) -> None:
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    _describe(capsys, "lingbot-world-v2-14b")
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    # 24 B parameters would be ~100 GB in fp32; meta-device building stays far below a few GB.
    assert after < before + 3 * GB


@pytest.mark.processes
def test_describe_module_entrypoint(tmp_path) -> None:
    out_path = tmp_path / "describe.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with out_path.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "workers", "describe", "lingbot-world-v2-14b", "--json"],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.PIPE,
        )
        # wait4 gives this child's own peak RSS, unaffected by anything else in the test session.
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0, proc.stderr.read().decode() if proc.stderr else ""
    info = json.loads(out_path.read_text())
    assert info["components"]["dit"]["state_dict"]["head.head.weight"] == [64, 5120]
    assert 18.4e9 <= info["params"]["dit"] <= 18.7e9
    assert usage.ru_maxrss * 1024 < 3 * GB


def test_describe_rejects_unknown_preset(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["describe", "no-such-model"])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


# ---- verify ----


def test_verify_good_checkpoint(capsys, tiny_checkpoint) -> None:
    assert main(["verify", "tiny", "--checkpoint", str(tiny_checkpoint.path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("layout: released (no model_index.json")
    assert out[1:] == ["dit: ok", "vae: ok", "t5: ok", "checkpoint matches the preset"]


def test_verify_missing_dit_key(capsys, tmp_path, tiny_checkpoint) -> None:
    ckpt = tiny_checkpoint.copy_to(tmp_path / "ckpt")
    key = "blocks.2.cam_scale_layer.weight"
    tiny_checkpoint.edit_shard(ckpt, tiny_checkpoint.weight_map[key], lambda state: state.pop(key))
    assert main(["verify", "tiny", "--checkpoint", str(ckpt)]) == 1
    out = capsys.readouterr().out
    assert f"1 missing key(s): {key}" in out
    assert "vae: ok" in out and "t5: ok" in out
    assert out.rstrip().endswith("checkpoint does NOT match the preset")


def test_verify_misshaped_vae_key(capsys, tmp_path, tiny_checkpoint) -> None:
    ckpt = tiny_checkpoint.copy_to(tmp_path / "ckpt")
    state = dict(tiny_checkpoint.vae)
    key = next(k for k, v in state.items() if v.dim() == 5)
    want = list(state[key].shape)
    state[key] = torch.zeros(1, 1, 1, 1, 1)
    torch.save(state, ckpt / loading.VAE_FILE)
    assert main(["verify", "tiny", "--checkpoint", str(ckpt)]) == 1
    out = capsys.readouterr().out
    assert f"mis-shaped {key}: expected {want}, found [1, 1, 1, 1, 1]" in out
    assert "dit: ok" in out


def test_verify_missing_files(capsys, tmp_path, tiny_checkpoint) -> None:
    ckpt = tiny_checkpoint.copy_to(tmp_path / "ckpt")
    (ckpt / loading.T5_FILE).unlink()
    assert main(["verify", "tiny", "--checkpoint", str(ckpt)]) == 1
    out = capsys.readouterr().out
    assert "t5: missing checkpoint file" in out and loading.T5_FILE in out


@pytest.mark.heavy
def test_verify_wrong_preset_reports_shapes_and_tokenizer(capsys, tiny_checkpoint) -> None:
    assert main(["verify", "lingbot-world-v2-1.3b", "--checkpoint", str(tiny_checkpoint.path)]) == 1
    out = capsys.readouterr().out
    # 1.3B has 30 blocks of 35 keys each, tiny has 4: the other 26 are missing.
    assert "910 missing key(s): blocks.10.cam_injector_layer1.bias," in out
    assert "mis-shaped blocks.0.cam_injector_layer1.weight: expected [1536, 1536], found [128, 128]" in out
    assert "tokenizer: missing" in out and "google/umt5-xxl/tokenizer.json" in out


def test_verify_non_directory(capsys, tmp_path) -> None:
    not_a_dir = tmp_path / "weights.safetensors"
    not_a_dir.write_bytes(b"")
    for path in (not_a_dir, tmp_path / "absent"):
        assert main(["verify", "tiny", "--checkpoint", str(path)]) == 1
        assert "is not a directory" in capsys.readouterr().err


def test_verify_without_a_directory_has_nothing_to_check_on_random_weights(capsys) -> None:
    # Released presets resolve through the Hugging Face cache instead (tests/workers/models/test_hub.py).
    assert main(["verify", "tiny"]) == 0
    assert (
        "tiny: random weights (seeded): the output is not a trained world; nothing to verify" in capsys.readouterr().out
    )


def test_verify_reports_corrupt_dit_shard(capsys, tmp_path, tiny_checkpoint) -> None:
    ckpt = tiny_checkpoint.copy_to(tmp_path / "ckpt")
    shard = ckpt / loading.DIT_SUBDIR / "model-00001-of-00002.safetensors"
    shard.write_bytes(b"not a safetensors file" * 4)
    assert main(["verify", "tiny", "--checkpoint", str(ckpt)]) == 1
    out = capsys.readouterr().out
    assert "dit:" in out and "vae: ok" in out

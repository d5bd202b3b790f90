"""Fetch the official HotpotQA / 2WikiMultihopQA / MuSiQue files from their authors' URLs.

Why a module of its own: the download stage must turn "the internet is not
there" into one actionable sentence (set ``data.real.url`` to a local mirror;
``file://`` works), verify a pinned checksum before anything reaches
``dest_dir``, and cope with the ways the publishers ship the data:

- HotpotQA: plain JSON files on the authors' CMU server.
- 2WikiMultihopQA: one Dropbox zip (the "full dataset" link in the README of
  github.com/Alab-NII/2wikimultihop) holding ``train.json`` / ``dev.json`` /
  ``test.json``.
- MuSiQue: ``musique_v1.0.zip`` on Google Drive (the file id used by
  StonyBrookNLP/musique's ``download_data.sh``), holding
  ``data/musique_ans_v1.0_{train,dev}.jsonl``. Drive answers large files with
  a "can't scan this file for viruses" HTML page whose form (or older
  ``confirm=`` link / ``download_warning`` cookie) leads to the file; that
  page is followed automatically.

The result in ``dest_dir`` is the official-format file (extracted from the zip
when the download is one) plus ``manifest.json`` recording where it came
from and the checksum of what was downloaded, so a later run can pin it.
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

from agent_r1.config import RealDataConfig
from agent_r1.io import atomic_path, write_json

log = logging.getLogger(__name__)

_TWOWIKI_ZIP = "https://www.dropbox.com/s/npidmtadreo6df2/data.zip?dl=1"
_MUSIQUE_ZIP = "https://drive.google.com/uc?export=download&id=1tGdADlNjWFaHLeZZGShh2IRcpO6Lv24h"

OFFICIAL_URLS: dict[str, dict[str, str]] = {
    "hotpotqa": {
        "train": "http://curtis.ml.cmu.edu/datasets/hotpot/hotpot_train_v1.1.json",
        "dev": "http://curtis.ml.cmu.edu/datasets/hotpot/hotpot_dev_distractor_v1.json",
    },
    "2wikimultihopqa": {"train": _TWOWIKI_ZIP, "dev": _TWOWIKI_ZIP},
    "musique": {"train": _MUSIQUE_ZIP, "dev": _MUSIQUE_ZIP},
}
# The official-format file each (source, split) download yields; for a zip, the member's base name.
OFFICIAL_FILES: dict[str, dict[str, str]] = {
    "hotpotqa": {"train": "hotpot_train_v1.1.json", "dev": "hotpot_dev_distractor_v1.json"},
    "2wikimultihopqa": {"train": "train.json", "dev": "dev.json"},
    "musique": {"train": "musique_ans_v1.0_train.jsonl", "dev": "musique_ans_v1.0_dev.jsonl"},
}
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


def download_official(source: str, cfg: RealDataConfig, dest_dir: Path) -> Path:
    """Fetch ``cfg.url`` (or the official URL for ``cfg.split``) into ``dest_dir``; return the data file.

    The download goes to a temporary file in ``dest_dir``; it only becomes
    ``dest_dir/<official name>`` after the sha256 check (when ``cfg.sha256`` is
    set) and, for zips, extraction of the right member. On any failure
    nothing new is left in ``dest_dir``. ``manifest.json`` records source,
    split, url, sha256 and size of what was downloaded.
    """
    if source not in OFFICIAL_URLS:
        raise ValueError(f"unknown official source {source!r}; expected one of {list(OFFICIAL_URLS)}")
    configured = cfg.url or OFFICIAL_URLS[source][cfg.split]
    url = _as_url(configured)
    member = OFFICIAL_FILES[source][cfg.split]
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    target = dest_dir / member
    fd, tmp_name = tempfile.mkstemp(prefix=".download-", suffix=".tmp", dir=dest_dir)
    tmp = Path(tmp_name)
    try:
        log.info("downloading %s %s from %s", source, cfg.split, configured)
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
        archived = None
        if zipfile.is_zipfile(tmp):
            with zipfile.ZipFile(tmp) as zf:
                archived = _zip_member(zf, member)
                with zf.open(archived) as src, atomic_path(target) as dst_path, open(dst_path, "wb") as dst:
                    shutil.copyfileobj(src, dst, _CHUNK)
        else:
            os.chmod(tmp, 0o644)
            os.replace(tmp, target)  # same directory: atomic, like agent_r1.io, without copying GBs
    except zipfile.BadZipFile as exc:
        raise DownloadError(f"{configured}: damaged zip ({exc}); delete it and download again") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    manifest = {
        "source": source,
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

"""The ``deepspeed`` launcher command that runs the train stage as ``train.num_procs`` ranks:
all on this machine, or over the hosts of a DeepSpeed hostfile (``train.hostfile``).

:func:`launch_command` only reads the hostfile, so the command it builds is tested on CPU
(tests/test_launch.py) without a second machine. Outside ``agent_r1.training`` on purpose: how
ranks are started changes no result, so this file is not part of the code hash in the trainer's
checkpoint fingerprint, and importing it does not import torch.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path

from agent_r1.config import TrainConfig

DEEPSPEED = Path(sys.executable).parent / "deepspeed"
# DeepSpeed's hostfile grammar (deepspeed/launcher/runner.py, _parse_hostfile): `host slots=N`, and it
# ignores what follows on the line (MPI's `max_slots=N`, a trailing comment).
_HOST_LINE = re.compile(r"(\S+)\s+slots=(\d+)(\s.*)?")


def read_hostfile(path: str | Path) -> dict[str, int]:
    """``{host: slots}`` in file order; ValueError naming ``train.hostfile``, the file and the line."""
    where = f"train.hostfile ({path})"
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:  # missing, a folder, no permission, binary
        raise ValueError(f"{where}: cannot be read: {exc}") from None
    hosts: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _HOST_LINE.fullmatch(line)
        if match is None or int(match.group(2)) < 1:
            raise ValueError(f"{where}, line {number}: expected `hostname slots=N` with N >= 1, got {line!r}")
        if match.group(1) in hosts:  # DeepSpeed refuses it too, but only after its ssh check
            raise ValueError(f"{where}, line {number}: {match.group(1)} is listed twice")
        hosts[match.group(1)] = int(match.group(2))
    if not hosts:
        raise ValueError(f"{where}: lists no host; one `hostname slots=N` line per machine")
    return hosts


def _loopback(host: str) -> bool:
    return host == "localhost" or host.startswith("127.") or host == "::1"


def master_addr(cfg: TrainConfig, hosts: dict[str, int]) -> str:
    """Rank 0's address: ``train.master_addr``, or the first host (where DeepSpeed puts rank 0)."""
    return cfg.master_addr or next(iter(hosts))


def check_hosts(cfg: TrainConfig, hosts: dict[str, int]) -> None:
    """What the hostfile and the other ``train`` keys must agree on, before any rank starts."""
    where = f"train.hostfile ({cfg.hostfile})"
    total = sum(hosts.values())
    if total != cfg.num_procs:
        raise ValueError(
            f"train.num_procs ({cfg.num_procs}) must equal the total slots of {where}: {total} "
            f"({', '.join(f'{h}={n}' for h, n in hosts.items())}); one rank runs per slot"
        )
    # mpich and impi start `-ppn` ranks on every host; DeepSpeed would refuse only after its ssh check
    if cfg.launcher != "pdsh" and len(set(hosts.values())) > 1:
        raise ValueError(f"train.launcher {cfg.launcher} needs the same slots on every host of {where}")
    master = master_addr(cfg, hosts)
    if len(hosts) > 1 and _loopback(master):
        raise ValueError(
            f"train.master_addr: {master} is rank 0's address for every node of {where}, but on the other "
            "nodes it is themselves: name the first host as the others reach it, or set train.master_addr"
        )


def launch_command(cfg: TrainConfig, script: Path, args: Sequence[str], port: int) -> list[str]:
    """The ``deepspeed`` command that runs ``script args`` as ``cfg.num_procs`` ranks.

    Without a hostfile: ``--num_accelerators`` ranks here, as before. With one: DeepSpeed's
    multi-node launch, one rank per slot of every host (no ``--num_nodes``/``--num_gpus``: the
    MPI launchers refuse them, and the hostfile already says it). ``port`` is used when
    ``train.master_port`` is null. ValueError (naming the key) on a bad or mismatched hostfile.
    """
    master_port = str(port if cfg.master_port is None else cfg.master_port)
    if cfg.hostfile is None:
        head = ["--num_accelerators", str(cfg.num_procs), "--master_port", master_port]
        return [str(DEEPSPEED), *head, str(script), *args]
    hosts = read_hostfile(cfg.hostfile)
    check_hosts(cfg, hosts)
    head = [
        "--hostfile", cfg.hostfile, "--master_addr", master_addr(cfg, hosts),
        "--master_port", master_port, "--launcher", cfg.launcher,
    ]  # fmt: skip
    if len(hosts) == 1:
        # DeepSpeed starts a one-host pool on this machine, without ssh, whatever the host's name;
        # its ssh check would only demand an ssh server that is never used.
        head.append("--no_ssh_check")
    return [str(DEEPSPEED), *head, str(script), *args]

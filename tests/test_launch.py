"""The train stage's launcher command (agent_r1.launch): one machine, or a DeepSpeed hostfile.

Everything here runs on CPU without a second machine: the commands built, what DeepSpeed's own
parser and pdsh runner make of a two-host one, the errors, and one real launch through the
``deepspeed`` launcher from a hostfile that lists only localhost.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_r1.accelerator import select_accelerator
from agent_r1.config import Params, ParamsError, TrainConfig, parse_params
from agent_r1.launch import DEEPSPEED, launch_command, read_hostfile
from agent_r1.stages import train as stage
from agent_r1.training.distributed import free_port

SCRIPT = Path(stage.__file__).resolve()
ARGS = ["--experiment", "grpo"]


def hostfile(tmp_path: Path, text: str) -> str:
    path = tmp_path / "hostfile"
    path.write_text(text)
    return str(path)


def test_one_machine_command_is_as_before() -> None:
    cmd = launch_command(TrainConfig(num_procs=2), SCRIPT, ARGS, 29512)
    assert cmd == [str(DEEPSPEED), "--num_accelerators", "2", "--master_port", "29512", str(SCRIPT), *ARGS]
    fixed = launch_command(TrainConfig(num_procs=2, master_port=6000), SCRIPT, ARGS, 29512)
    assert fixed[3:5] == ["--master_port", "6000"]


def test_hostfile_command(tmp_path: Path) -> None:
    path = hostfile(tmp_path, "# two GPU boxes\nnode-a slots=4\n\n  node-b slots=4 max_slots=8  \n")
    cmd = launch_command(TrainConfig(num_procs=8, hostfile=path), SCRIPT, ARGS, 29512)
    assert cmd == [
        str(DEEPSPEED), "--hostfile", path, "--master_addr", "node-a", "--master_port", "29512",
        "--launcher", "pdsh", str(SCRIPT), *ARGS,
    ]  # fmt: skip
    cfg = TrainConfig(num_procs=8, hostfile=path, master_addr="10.0.0.1", master_port=6000, launcher="mpich")
    assert launch_command(cfg, SCRIPT, ARGS, 29512)[1:9] == [
        "--hostfile", path, "--master_addr", "10.0.0.1", "--master_port", "6000", "--launcher", "mpich",
    ]  # fmt: skip


def test_one_host_hostfile_skips_the_ssh_check(tmp_path: Path) -> None:
    """DeepSpeed runs a one-host pool locally, but checks ssh to it first unless told not to."""
    path = hostfile(tmp_path, "localhost slots=2\n")
    cmd = launch_command(TrainConfig(num_procs=2, hostfile=path), SCRIPT, ARGS, 29512)
    assert cmd[cmd.index("--master_addr") + 1] == "localhost" and "--no_ssh_check" in cmd


def test_deepspeed_reads_the_command_as_meant(tmp_path: Path) -> None:
    """DeepSpeed's own parsers and pdsh runner on a two-host command: the ssh command each node
    would run (pdsh is not installed here, and nothing is run)."""
    select_accelerator()  # before deepspeed's first import: it picks its accelerator then
    from deepspeed.launcher.multinode_runner import PDSHRunner
    from deepspeed.launcher.runner import encode_world_info, fetch_hostfile, parse_args, parse_inclusion_exclusion

    path = hostfile(tmp_path, "node-a slots=2\nnode-b slots=2\n")
    cmd = launch_command(TrainConfig(num_procs=4, hostfile=path), SCRIPT, ARGS, 29512)
    args = parse_args(cmd[1:])
    assert (args.hostfile, args.master_addr, args.master_port, args.launcher) == (path, "node-a", 29512, "pdsh")
    assert (args.num_nodes, args.num_gpus, args.user_script, args.user_args) == (-1, -1, str(SCRIPT), ARGS)
    pool = fetch_hostfile(path)
    assert pool == read_hostfile(path)
    active = parse_inclusion_exclusion(pool, "", "")
    pdsh, _, _ = PDSHRunner(args, encode_world_info(active)).get_cmd({}, active)
    assert pdsh[:6] == ["pdsh", "-S", "-f", "1024", "-w", "node-a,node-b"]
    remote = " ".join(pdsh[6:]).strip()  # after the (here empty) exports
    assert remote.startswith(f"cd {os.path.abspath('.')}; {sys.executable} -u -m deepspeed.launcher.launch")
    assert "--node_rank=%n --master_addr=node-a --master_port=29512" in remote
    assert remote.endswith(f"{SCRIPT} --experiment grpo")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("node-a slots=2\n# a comment\nnode-b slots two\n", "line 3: expected `hostname slots=N` with N >= 1, got 'node-b"),
        ("node-a slots=0\n", "line 1: expected"),
        ("node-a\n", "line 1: expected"),
        ("node-a slots=2\nnode-a slots=2\n", "line 2: node-a is listed twice"),
        ("# nothing but comments\n\n", "lists no host"),
    ],
)
def test_bad_hostfile_names_the_key_file_and_line(tmp_path: Path, text: str, needle: str) -> None:
    path = hostfile(tmp_path, text)
    with pytest.raises(ValueError, match=r"^train\.hostfile") as err:
        launch_command(TrainConfig(num_procs=4, hostfile=path), SCRIPT, ARGS, 29512)
    assert path in str(err.value) and needle in str(err.value)


@pytest.mark.parametrize("name", ["missing", "."])
def test_unreadable_hostfile(tmp_path: Path, name: str) -> None:
    path = str(tmp_path / name)
    with pytest.raises(ValueError, match=rf"^train\.hostfile \({path}\): cannot be read"):
        launch_command(TrainConfig(num_procs=2, hostfile=path), SCRIPT, ARGS, 29512)


@pytest.mark.parametrize(
    ("text", "train", "needle"),
    [
        ("node-a slots=2\nnode-b slots=2\n", {"num_procs": 3}, "train.num_procs (3) must equal the total slots of train.h"),
        ("node-a slots=4\nnode-b slots=2\n", {"num_procs": 6, "launcher": "impi"}, "needs the same slots on every host"),
        ("localhost slots=2\nnode-b slots=2\n", {"num_procs": 4}, "train.master_addr: localhost is rank 0's address"),
    ],
)
def test_hostfile_and_other_keys_must_agree(tmp_path: Path, text: str, train: dict, needle: str) -> None:
    cfg = TrainConfig(hostfile=hostfile(tmp_path, text), **train)
    with pytest.raises(ValueError) as err:
        launch_command(cfg, SCRIPT, ARGS, 29512)
    assert needle in str(err.value)


@pytest.mark.parametrize(
    ("train", "needle"),
    [
        ({"hostfile": "hosts"}, "train.hostfile: spreads train.num_procs ranks"),
        ({"num_procs": 2, "master_addr": "node-a"}, "train.master_addr and train.launcher apply only with a train.hostfile"),
        ({"num_procs": 2, "launcher": "impi"}, "apply only with a train.hostfile"),
        ({"num_procs": 2, "hostfile": "hosts", "launcher": "openmpi"}, "train.launcher: must be one of"),
        ({"master_port": 70000}, "train.master_port: must be <= 65535"),
    ],
)
def test_schema_checks_the_launch_keys_without_reading_the_file(train: dict, needle: str) -> None:
    with pytest.raises(ParamsError) as err:
        parse_params({"train": train})
    assert needle in str(err.value)


def test_stage_checks_the_hostfile_before_any_other_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    params = Params().model_copy(update={"train": TrainConfig(num_procs=2, hostfile=str(tmp_path / "missing"))})
    # indexes and questions do not exist either: the hostfile is what is named
    with pytest.raises(ValueError, match=r"^train\.hostfile .*missing\): cannot be read"):
        stage.train(params, "grpo", indexes=tmp_path / "no-index", val_questions=tmp_path / "no.parquet")


def test_relaunch_runs_this_stage_again_and_exits_with_its_status(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["train.py", *ARGS, "--set", "train.seed=1"])
    cmd = stage.stage_launch_command(TrainConfig(num_procs=2, master_port=6000))
    assert cmd == [
        str(DEEPSPEED), "--num_accelerators", "2", "--master_port", "6000", str(SCRIPT), *ARGS, "--set", "train.seed=1",
    ]  # fmt: skip
    ran: list[list[str]] = []
    monkeypatch.setattr(stage.subprocess, "call", lambda c: ran.append(c) or 3)
    with pytest.raises(SystemExit) as exit_:
        stage.relaunch_under_deepspeed(cmd)
    assert ran == [cmd] and exit_.value.code == 3


RANK_SCRIPT = """
import json, os, sys
from pathlib import Path
out = Path(sys.argv[sys.argv.index("--out") + 1])
keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
(out / f"rank{os.environ['RANK']}.json").write_text(json.dumps({k: os.environ[k] for k in keys}))
"""


def test_localhost_hostfile_launches_two_ranks_without_ssh(tmp_path: Path) -> None:
    """The one real launch: DeepSpeed's launcher from `localhost slots=2`, a script that only
    writes what each rank was told (no model, no process group)."""
    script = tmp_path / "ranks.py"
    script.write_text(RANK_SCRIPT)
    port = free_port()
    cfg = TrainConfig(num_procs=2, hostfile=hostfile(tmp_path, "localhost slots=2\n"))
    cmd = launch_command(cfg, script, ["--out", str(tmp_path)], port)
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(cmd)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert seen == [
        {"RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": str(r), "MASTER_ADDR": "localhost", "MASTER_PORT": str(port)}
        for r in range(2)
    ]

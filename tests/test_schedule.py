"""flows/schedule.py against a real local Prefect server started here."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
POLLS = 240  # x 0.5 s: a bound so a broken server fails the test instead of hanging it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, what: str, proc: subprocess.Popen | None = None):
    for _ in range(POLLS):
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: process exited with {proc.returncode}")
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"gave up waiting for {what}")


def post(url: str, body: dict) -> list | None:
    """The JSON list a filter endpoint returns, or None while the (busy) server does not answer."""
    try:
        r = httpx.post(url, json=body, timeout=30)
    except httpx.HTTPError:
        return None
    return r.json() if r.status_code == 200 and r.json() else None


@contextmanager
def prefect_server(folder: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """A real `prefect server start` on a free port, its state in ``folder``: (API URL, its env)."""
    port = free_port()
    env = {
        **os.environ, "PREFECT_HOME": str(folder / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1", "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "1",
        "PREFECT_UI_ENABLED": "false",
    }
    env.pop("PREFECT_API_URL", None)
    log = open(folder / "server.log", "w")  # a file, not a pipe: an unread pipe fills up and stalls the server
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
    )
    api = f"http://127.0.0.1:{port}/api"

    def healthy() -> bool:
        try:
            return httpx.get(f"{api}/health", timeout=10).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(healthy, "prefect server health", proc)
        yield api, env
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture
def server(prefect_api: tuple[str, dict[str, str]]) -> tuple[str, dict[str, str]]:
    return prefect_api  # the session's server (conftest.py)


def deployments(api: str, name: str) -> list | None:
    return post(f"{api}/deployments/filter", {"deployments": {"name": {"any_": [name]}}})


def assert_one_run_at_a_time(dep: dict) -> None:
    """The deployment as the server holds it: never two runs at once; a run due while one
    runs is cancelled, not queued."""
    assert dep["global_concurrency_limit"]["limit"] == 1, dep  # (`concurrency_limit` is a deprecated always-None)
    assert dep["concurrency_options"]["collision_strategy"] == "CANCEL_NEW", dep


def test_serving_the_schedule_creates_scheduled_runs(server, tmp_path: Path) -> None:
    api, env = server
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["schedule"] = {"deployment": "test-nightly", "cron": "0 3 * * *", "timezone": "UTC",
                          "targets": ["prepare"], "force": False}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    log = open(tmp_path / "serve.log", "w+")
    serve = subprocess.Popen(
        [sys.executable, "-m", "flows.schedule", "--params", str(tmp_path / "params.yaml"), "--repo", str(tmp_path)],
        cwd=ROOT, env={**env, "PREFECT_API_URL": api, "PYTHONPATH": str(ROOT)},
        stdout=log, stderr=subprocess.STDOUT, text=True,
    )
    try:
        dep = wait_for(lambda: deployments(api, "test-nightly"), "the served deployment", serve)[0]
        assert dep["parameters"] == {"targets": ["prepare"], "force": False, "repo": str(tmp_path.resolve())}
        assert dep["schedules"][0]["schedule"]["cron"] == "0 3 * * *"
        assert_one_run_at_a_time(dep)

        def scheduled_runs():
            return post(f"{api}/flow_runs/filter", {
                "deployments": {"id": {"any_": [dep["id"]]}},
                "flow_runs": {"state": {"type": {"any_": ["SCHEDULED"]}}},
            })

        runs = wait_for(scheduled_runs, "a scheduled flow run", serve)
        times = sorted(run["expected_start_time"] for run in runs)
        assert all("T03:00:00" in t for t in times), times  # 03:00 UTC, as the cron says
    finally:
        serve.send_signal(signal.SIGINT)  # Ctrl-C, as a user stops it
        try:  # serve's shutdown sometimes lingers a minute; what it does then is not this test's subject
            serve.wait(timeout=10)
        except subprocess.TimeoutExpired:
            serve.kill()
        log.close()


def test_the_registered_deployment_runs_one_at_a_time(server, tmp_path: Path) -> None:
    """`--once` registers the deployment the server then schedules: limited the same way as `serve`."""
    api, env = server
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["schedule"]["deployment"] = "test-once"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    proc = subprocess.run(
        [sys.executable, "-m", "flows.schedule", "--params", str(tmp_path / "params.yaml"), "--repo", str(tmp_path),
         "--once"],
        cwd=ROOT, env={**env, "PREFECT_API_URL": api, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_one_run_at_a_time(deployments(api, "test-once")[0])


def test_a_bad_cron_names_the_params_key(tmp_path: Path) -> None:
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["schedule"]["cron"] = "61 3 * * *"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    proc = subprocess.run([sys.executable, "-m", "flows.schedule", "--params", str(tmp_path / "params.yaml")],
                          cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2 and "schedule.cron" in proc.stderr, proc.stderr


def test_network_stages_retry_with_backoff_and_others_do_not() -> None:
    from flows.pipeline import stage_task

    download = stage_task("download")
    assert download.retries == 3
    assert list(download.retry_delay_seconds) == [10, 20, 40]
    assert stage_task("index").retries == 0 and stage_task("train@grpo").retries == 0


def test_dvc_sends_no_usage_reports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Offline: this repo's DVC config, and the environment the flows give DVC in any
    other repo, keep DVC from reporting usage after each command."""
    from tasks.dvc_stage import stage_env

    monkeypatch.delenv("DVC_NO_ANALYTICS", raising=False)
    # no user- or machine-wide DVC config decides it for us
    clean = {**os.environ, "DVC_GLOBAL_CONFIG_DIR": str(tmp_path / "g"), "DVC_SYSTEM_CONFIG_DIR": str(tmp_path / "s")}
    probe = [sys.executable, "-c", "from dvc.analytics import is_enabled; print(is_enabled())"]

    def analytics(cwd: Path, env: dict[str, str]) -> str:
        return subprocess.run(probe, cwd=cwd, env=env, capture_output=True, text=True, check=True).stdout.strip()

    other = tmp_path / "other"
    other.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=other, check=True)
    quiet = {**clean, "DVC_NO_ANALYTICS": "1"}
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=other, env=quiet, check=True)
    assert analytics(other, clean) == "True"  # dvc init's default: the probe can tell
    assert analytics(ROOT, clean) == "False"  # .dvc/config
    flow_env = {**stage_env(), **{k: clean[k] for k in ("DVC_GLOBAL_CONFIG_DIR", "DVC_SYSTEM_CONFIG_DIR")}}
    assert analytics(other, flow_env) == "False"  # what a flow gives every dvc command


def test_every_flow_turns_telemetry_off_before_prefect_loads() -> None:
    """`python -m flows.X` imports the flows package first: the switches are set, Prefect not yet loaded."""
    from tasks.offline import TELEMETRY_OFF

    env = {k: v for k, v in os.environ.items() if k not in TELEMETRY_OFF}
    env["PYTHONPATH"] = str(ROOT)
    probe = "import os, sys, flows; print([os.environ.get(k) for k in sys.argv[1:]], 'prefect' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", probe, *TELEMETRY_OFF], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == f"{list(TELEMETRY_OFF.values())} False"

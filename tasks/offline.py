"""Offline by design: the environment switches that keep DVC and Prefect from reporting usage.

The one place they are listed. ``flows/__init__.py`` applies them to every flow's own
process before any flow module loads Prefect, and ``tasks.dvc_stage.stage_env`` gives them
to every command a flow starts (DVC in another repository has no ``.dvc/config`` to say so).
"""

from __future__ import annotations

from collections.abc import MutableMapping

TELEMETRY_OFF = {
    "DVC_NO_ANALYTICS": "1",  # DVC: otherwise a background `dvc daemon analytics` reports after each command
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",  # the Prefect server's usage reports
    "DO_NOT_TRACK": "1",  # the Prefect SDK's (and any tool honouring the convention)
}


def telemetry_off(env: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """``env`` with each switch set, unless it is set already (an explicit choice wins)."""
    for key, value in TELEMETRY_OFF.items():
        env.setdefault(key, value)
    return env

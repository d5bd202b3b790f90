"""Prefect flows over the DVC pipeline.

Importing the package turns usage telemetry off (tasks/offline.py) before any flow
module loads Prefect: ``python -m flows.X`` imports this first.
"""

import os

from tasks.offline import telemetry_off

telemetry_off(os.environ)

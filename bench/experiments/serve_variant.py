"""Run ``serve`` with one change applied where requests are served: in its front workers.

The main process takes serve's command line and starts its workers as ``python -m <module>`` (the
variant's own module); there, the change is applied before the worker runs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import smtriton.serve.cli
import smtriton.serve.worker


def run(module: str, change: Callable[[], None]) -> None:
    """Serve (as the main process), or ``change()`` and serve as one of its workers (started with the
    worker's own arguments)."""
    if any(arg.startswith("--channel-fd") for arg in sys.argv[1:]):
        change()
        smtriton.serve.worker.main(sys.argv[1:])
    else:
        smtriton.serve.cli.main(worker_module=module)

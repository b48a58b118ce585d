"""Run ``serve`` with one change applied where requests are served: in its front workers.

The variant's module names a worker entry that applies the change, then runs serve's own worker.
"""

from __future__ import annotations

import smtriton.serve.owner.cli


def run(entry: str) -> None:
    """Serve with ``entry`` (``module:function``, a function like :func:`smtriton.serve.http.worker.run` that
    applies the change and calls it) as every front worker."""
    smtriton.serve.owner.cli.main(worker=entry)

"""Waiting for a SageMaker resource to settle, printing its status between checks.

Only a failure status reported by SageMaker fails the wait. An error while asking (throttling, an
expired token, a dropped connection, a 5xx) says nothing about the resource: the wait goes on, with
the pause doubling up to :data:`MAX_BACKOFF_S`, until the status is seen again or patience runs out.
A refused permission cannot heal by waiting: it ends the wait as :class:`WaitTimeout`, which callers
never roll back.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from smtriton.aws.resources import DeployError, WaitTimeout, error_code, error_text, is_access_denied

Progress = Callable[[str], None]
Describe = Callable[[], Mapping[str, Any] | None]  # None: the resource does not exist

MAX_BACKOFF_S = 300.0


@dataclass
class Poller:
    """Checks every ``poll_s`` seconds for at most ``timeout_s``; ``sleep`` and ``clock`` are the test's hooks."""

    progress: Progress
    poll_s: float = 30.0
    timeout_s: float = 3600.0
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic

    def until(
        self,
        what: str,
        describe: Describe,
        *,
        status_key: str,
        done: Collection[str],
        failed: Collection[str] = (),
        gone_is_done: bool = False,
        reason: Callable[[Mapping[str, Any]], str | None] = lambda d: d.get("FailureReason"),
        hint: str = "",
    ) -> Mapping[str, Any] | None:
        """The description once its ``status_key`` is in ``done`` (None once gone, with ``gone_is_done``);
        :class:`DeployError` once it is in ``failed`` or gone otherwise; :class:`WaitTimeout` on patience."""
        from botocore.exceptions import BotoCoreError, ClientError

        start = self.clock()
        errors_in_a_row = 0
        status = "?"
        while True:
            try:
                described = describe()
            except (ClientError, BotoCoreError) as exc:
                if is_access_denied(exc):
                    raise WaitTimeout(
                        f"cannot read the status of {what} ({error_text(exc)}); SageMaker goes on with it{hint}"
                    ) from None
                errors_in_a_row += 1
                pause = min(self.poll_s * 2**errors_in_a_row, max(MAX_BACKOFF_S, self.poll_s))
                self.progress(
                    f"{what}: status not read ({error_code(exc) or type(exc).__name__}), asking again in {pause:.0f} s"
                )
                self._pause(what, status, start, pause, hint)
                continue
            errors_in_a_row = 0
            if described is None:
                if gone_is_done:
                    self.progress(f"{what}: deleted")
                    return None
                raise DeployError(f"{what} no longer exists")
            status = str(described.get(status_key, "?"))
            if status in done:
                self.progress(f"{what}: {status}")
                return described
            if status in failed:  # SageMaker's reasons can run over lines: the error is one
                raise DeployError(f"{what} is {status}: {' '.join((reason(described) or 'no reason given').split())}")
            self.progress(f"{what}: {status} ({self.clock() - start:.0f} s)")
            self._pause(what, status, start, self.poll_s, hint)

    def _pause(self, what: str, status: str, start: float, seconds: float, hint: str) -> None:
        if self.clock() - start > self.timeout_s:
            raise WaitTimeout(f"{what} still {status} after {self.timeout_s:.0f} s; SageMaker goes on with it{hint}")
        self.sleep(seconds)

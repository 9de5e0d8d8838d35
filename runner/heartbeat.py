"""Background heartbeat: proves liveness to the control plane and carries its cancel request back.

Cancellation is level-triggered: while a run is ``cancelling`` every heartbeat answer says
``{"action": "quiesce"}``. The runner must then stop and exit 0 *without* posting ``/result`` — the server
owns the terminal status. Because the driver thread may be blocked in a 12-minute ``/permission`` wait,
quiescing cannot be cooperative; the callback is expected to end the process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from core.wire import EXIT_AUDIENCE_MISMATCH, EXIT_GATEWAY_GONE
from runner.gateway import AudienceMismatch, ControlPlane, GatewayGone, log

DEFAULT_HEARTBEAT_SECS = 10.0


def renewal_interval(token_ttl_secs: float | None) -> float | None:
    """Renew at a third of the tokens' lifetime: two chances more before they would lapse."""
    if token_ttl_secs is None or token_ttl_secs <= 0:
        return None
    return token_ttl_secs / 3


class Heartbeat:
    """Posts a heartbeat immediately and then every ``interval_s`` seconds on a daemon thread."""

    def __init__(
        self,
        gateway: ControlPlane,
        interval_s: float,
        *,
        on_quiesce: Callable[[], None],
        on_fatal: Callable[[int], None],
        renew_every_s: float | None = None,
    ) -> None:
        self._gateway = gateway
        self._interval_s = interval_s
        # Tokens are minted with a TTL; a run that outlives it renews them well before they lapse.
        self._renew_every_s = renew_every_s
        self._renewed_at = time.monotonic()
        self._on_quiesce = on_quiesce
        self._on_fatal = on_fatal
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fluidbox-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop beating; an in-flight answer is ignored. Does not wait for the thread."""
        self._stopped.set()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _loop(self) -> None:
        while not self._stopped.is_set():
            try:
                action = self._gateway.heartbeat()
            except AudienceMismatch:
                self._on_fatal(EXIT_AUDIENCE_MISMATCH)
                return
            except GatewayGone as exc:
                log(f"{exc}; giving up")
                self._on_fatal(EXIT_GATEWAY_GONE)
                return
            except Exception as exc:  # the heartbeat must outlive any single bad answer
                if self._stopped.is_set():
                    return
                log(f"heartbeat error: {exc}")
                action = None
            if self._stopped.is_set():
                return
            if action == "quiesce":
                self._on_quiesce()
                return
            if self._renew_every_s is not None and time.monotonic() - self._renewed_at >= self._renew_every_s:
                try:
                    if self._gateway.renew_tokens():
                        self._renewed_at = time.monotonic()
                except Exception as exc:  # retried on the next beat
                    log(f"token renewal error: {exc}")
            self._stopped.wait(self._interval_s)

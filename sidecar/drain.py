"""Stopping ``memwarden serve`` on SIGTERM without dropping requests: drain, then a graceful stop.

`DrainingServer` is uvicorn's `Server` (0.55: ``handle_exit`` is the signal handler it installs for SIGINT
and SIGTERM, ``on_tick`` its once-per-100-ms check) with SIGTERM handled in three steps:

1. at once, readiness fails (`sidecar.app.Services.draining`: ``/_memwarden/readyz`` answers 503), so a load
   balancer or a Kubernetes Service takes the process out of rotation;
2. for ``SHUTDOWN_DRAIN_S`` seconds everything is still served as before — requests in flight and new ones
   that a balancer not yet updated sends;
3. then uvicorn's graceful shutdown: the listener closes, idle connections are closed, requests in flight
   get up to ``SHUTDOWN_TIMEOUT_S`` seconds to finish (uvicorn's ``timeout_graceful_shutdown``; then they are
   cancelled), the application's lifespan shutdown runs, and the process exits with status 0.

A second SIGTERM during the drain starts step 3 at once. SIGINT (Ctrl-C) is uvicorn's own: an immediate
graceful stop, a second one forces it. Unlike uvicorn, the SIGTERM is not raised again once the server has
stopped, so the exit status is 0 (a stop asked for and carried out), not -15.
"""

from __future__ import annotations

import signal
import sys
import time
from types import FrameType
from typing import Any

import uvicorn


class DrainingServer(uvicorn.Server):
    """`uvicorn.Server` draining on SIGTERM (module docstring). `services`: the app's
    `sidecar.app.Services` (its ``draining`` flag); `drain_s`: seconds of step 2 (0: none)."""

    def __init__(self, config: uvicorn.Config, services: Any, drain_s: float) -> None:
        super().__init__(config)
        self.services = services
        self.drain_s = drain_s
        self.drain_until: float | None = None  # monotonic time the drain ends; None: no SIGTERM yet
        self._announced = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig != signal.SIGTERM:
            super().handle_exit(sig, frame)
            return
        if self.drain_until is None and self.drain_s > 0 and not self.should_exit:
            self.services.draining = True
            self.drain_until = time.monotonic() + self.drain_s
            return
        self.services.draining = True
        self.should_exit = True  # no drain, or a second SIGTERM: stop now (gracefully)

    async def on_tick(self, counter: int) -> bool:
        until = self.drain_until
        if until is not None:
            if not self._announced:  # said here, not in the signal handler
                self._announced = True
                sys.stderr.write(f"memwarden: SIGTERM: not ready; serving for {self.drain_s:g} s (SHUTDOWN_DRAIN_S), "
                                 f"then in-flight requests get up to {self.config.timeout_graceful_shutdown:g} s "
                                 "(SHUTDOWN_TIMEOUT_S)\n")
                sys.stderr.flush()
            if time.monotonic() >= until:
                self.should_exit = True
        return await super().on_tick(counter)

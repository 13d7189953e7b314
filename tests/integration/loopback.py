"""One HTTP server base for the loopback peers the integration tests start in threads.

``socketserver`` prints a traceback to ``sys.stderr`` when a handler raises, typically a
``BrokenPipeError`` when Prometheus gives up on a scrape. These servers run for the whole
session, so such a print lands in whatever test is capturing stderr at that moment (CI saw one
in a CLI test that checks its error is a single line). Errors go to ``logging`` instead, as one
line without the traceback: on CPython 3.11 formatting a traceback parses source lines with
``ast`` (for the carets), and a parse in this thread racing one in a test's thread fails the
test's with "AST constructor recursion depth mismatch" (gh-106905; CI saw that too).
"""

from __future__ import annotations

import logging
import sys
from http.server import ThreadingHTTPServer
from typing import Any

log = logging.getLogger("tests.loopback")


class LoopbackServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.warning("loopback server %s: request from %s failed: %r", self.server_address, client_address,
                    sys.exc_info()[1])

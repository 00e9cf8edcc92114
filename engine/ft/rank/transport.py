"""The healing transport: a replica that is behind fetches a live peer's state over HTTP, as
tensors and plain values only.

torchft's own HTTPTransport serves `torch.save` output on every interface and loads what it
receives with `weights_only=False`, i.e. by unpickling arbitrary objects: whoever can answer the
request could run code in the replica. This transport keeps torchft's protocol (the Manager
calls `metadata`, `send_checkpoint`, `disallow_checkpoint`, `recv_checkpoint`) but listens only
on the address the ranks' process group uses, and loads with `weights_only=True`, the way
checkpoints are loaded: a payload holding anything but tensors, numbers, strings, lists, tuples
and dicts is refused (`HealingRefused`), never executed.
"""
from __future__ import annotations

import io
import threading
import urllib.request
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional

import torch
from torch.utils._pytree import tree_map
from torchft.checkpointing.transport import CheckpointTransport


class HealingRefused(RuntimeError):
    """What a peer sent is not tensors-only state."""


def load_tensors_only(payload: bytes) -> Any:
    """Load a healing payload without executing anything it contains."""
    try:
        return torch.load(io.BytesIO(payload), weights_only=True, map_location="cpu")
    except Exception as err:  # torch raises UnpicklingError (or RuntimeError) for any foreign object
        raise HealingRefused(f"healing payload refused (not tensors-only state): {str(err).splitlines()[0]}") from None


def _to_cpu(state: Any) -> Any:
    return tree_map(lambda v: v.detach().to("cpu", copy=True) if isinstance(v, torch.Tensor) else v, state)


class TensorOnlyTransport(CheckpointTransport[Any]):
    """Serves this replica's state at http://HOST:PORT/state/STEP while a peer heals from it."""

    def __init__(self, host: str, timeout: timedelta) -> None:
        self.host, self.timeout = host, timeout
        self._staged = threading.Condition()
        self._payload: Optional[bytes] = None
        self._step = -1
        transport = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                payload, step = transport._wait_for(self.path)
                if payload is None:
                    self.send_error(404, f"no state for {self.path} (serving step {step})")
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:  # quiet: the rank's log says what matters
                pass

        self._server = ThreadingHTTPServer((host, 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="ft-heal-server", daemon=True)
        self._thread.start()

    def _wait_for(self, path: str) -> tuple[Optional[bytes], int]:
        """A peer may ask before this replica has staged its state for the round (both learn of
        the quorum at once): wait for it, up to the timeout."""
        with self._staged:
            self._staged.wait_for(lambda: self._payload is not None and path == f"/state/{self._step}",
                                  timeout=self.timeout.total_seconds())
            if self._payload is not None and path == f"/state/{self._step}":
                return self._payload, self._step
            return None, self._step

    def metadata(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/state/"

    def send_checkpoint(self, dst_ranks: list[int], step: int, state_dict: Any, timeout: timedelta) -> None:
        buffer = io.BytesIO()
        torch.save(_to_cpu(state_dict), buffer)
        with self._staged:
            self._payload, self._step = buffer.getvalue(), step
            self._staged.notify_all()

    def disallow_checkpoint(self) -> None:
        with self._staged:
            self._payload = None

    def recv_checkpoint(self, src_rank: int, metadata: str, step: int, timeout: timedelta) -> Any:
        with urllib.request.urlopen(f"{metadata}{step}", timeout=timeout.total_seconds()) as response:
            return load_tensors_only(response.read())

    def shutdown(self, wait: bool = True) -> None:
        self._server.shutdown()
        self._server.server_close()

"""TableService: the owner's `replay.table.Table` served to learner processes over a Unix socket.

Learners in other processes (torchrun ranks) sample one store: they map its rings and control block
by handle, gather and stale-check windows themselves, and wait on the rate limiter's process-shared
condition, but the selector's state (priorities, use counts, the one RNG) stays in the owner. The
owner's `TableService` answers their requests against its table, each serialised by ``Table.lock``
exactly as the owner's own sampling threads are, so the union of every learner's draws is a draw
sequence of one table and a priority update is seen by the next draw of anyone.

Requests (a tuple, pickled by `multiprocessing.connection`; the reply is ``("ok", value)`` or
``("error", exception)``):

- ``("draw", k, length, pad)``: `Table.draw` of up to ``k`` windows; the reply holds ``got``, ``N``,
  the window table ``int64 [5, got]`` (`replay.table.META_FIELDS` order), the probabilities
  ``float64 [got]`` and the incarnation. Items that ``max_times_sampled`` removed are counted in the
  rate limiter here, so a learner killed before it reads the reply leaves the counters right;
- ``("update", keys, priorities)``: `Table.update_priorities`, the number applied;
- ``("mass",)``: `Table.selector_mass`; ``("hello",)``: ``prioritized``, the incarnation, the
  store's id and the issuers of keys it accepts.

One daemon thread accepts connections (authenticated with the handle's random key,
``multiprocessing.connection``'s HMAC challenge) and one daemon thread serves each learner. The
service holds no lock between requests: a learner that dies (SIGKILL) only closes its connection.
A draw whose reply no one reads still counted as sampled in the selector (``max_times_sampled``).

>>> service = TableService(table, limiter)          # in the owner (`ReplayStore.learner` starts it)
>>> service.address, service.authkey                # what a `replay.learner.StoreLearner` carries
>>> service.stop()                                  # before the table is closed

References
----------
Reverb's table server (one table behind a server that many sampler clients call); GEAR (Wang et
al., ICML 2023) shares trajectory memory between trainers, whose selection runs decentralised.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import socket
import tempfile
import threading
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from typing import Any

import numpy as np

from replay.learner import LearnerHandle
from replay.rate_limiter import RateLimiterState
from replay.storage import StoreHandle
from replay.table import META_FIELDS, Table

__all__ = ["TableService"]

logger = logging.getLogger(__name__)

SOCKET_NAME = "table.sock"


class TableService:
    """Serve ``table`` to learner processes (see the module docstring); started on construction.

    Parameters
    ----------
    table : Table
        The owner's table.
    limiter : RateLimiterState
        The owner's rate limiter (draws that remove items count their deletes in it).

    Attributes
    ----------
    address : str
        Path of the Unix socket (in a fresh private directory).
    authkey : bytes
        32 random bytes; a client must hold them to connect.
    """

    def __init__(self, table: Table, limiter: RateLimiterState) -> None:
        self.table = table
        self.limiter = limiter
        self.authkey = secrets.token_bytes(32)
        self.run_dir = tempfile.mkdtemp(prefix="graphrl-replay-")  # mode 0700: only this user connects
        self.address = os.path.join(self.run_dir, SOCKET_NAME)
        self.requests = 0  # requests served (all learners)
        self._lock = threading.Lock()
        self._stopped = False
        self._conns: dict[int, socket.socket] = {}
        self._threads: list[threading.Thread] = []
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.bind(self.address)
            self._sock.listen(64)
        except BaseException:
            self._sock.close()
            shutil.rmtree(self.run_dir, ignore_errors=True)
            raise
        self._acceptor = threading.Thread(target=self._accept_loop, name="replay-table-service", daemon=True)
        self._acceptor.start()

    def learner_handle(self, store: StoreHandle, staging_slots: int) -> LearnerHandle:
        """The `replay.learner.LearnerHandle` of this service for the store ``store`` names."""
        return LearnerHandle(store, self.address, self.authkey, self.table.prioritized, staging_slots)

    @property
    def connected(self) -> int:
        """Learner connections open now."""
        with self._lock:
            return len(self._conns)

    # -- connections
    def _accept_loop(self) -> None:
        while True:
            try:
                sock, _ = self._sock.accept()
            except OSError:
                return  # stop() shut the socket down
            with self._lock:
                if self._stopped:
                    sock.close()
                    return
                thread = threading.Thread(
                    target=self._serve, args=(sock,), name="replay-table-learner", daemon=True
                )
                self._conns[id(sock)] = sock
                self._threads = [t for t in self._threads if t.is_alive()] + [thread]
            thread.start()

    def _serve(self, sock: socket.socket) -> None:
        conn = Connection(os.dup(sock.fileno()))
        try:
            deliver_challenge(conn, self.authkey)
            answer_challenge(conn, self.authkey)
            while True:
                request = conn.recv()
                conn.send(self._answer(request))
        except (EOFError, OSError) as exc:  # the learner closed, died, or stop() shut the socket
            logger.debug("a learner's connection closed: %s", exc)
        except Exception as exc:  # noqa: BLE001 - an unauthenticated or broken client: drop it
            logger.warning("dropped a replay learner connection: %s", exc)
        finally:
            conn.close()
            with self._lock:
                self._conns.pop(id(sock), None)
            sock.close()

    # -- requests
    def _answer(self, request: Any) -> tuple[str, Any]:
        try:
            op = request[0]
            with self._lock:
                self.requests += 1
            if op == "draw":
                return "ok", self._draw(int(request[1]), int(request[2]), str(request[3]))
            if op == "update":
                return "ok", self.table.update_priorities(request[1], request[2])
            if op == "mass":
                return "ok", self.table.selector_mass()
            if op == "hello":
                return "ok", {"prioritized": self.table.prioritized, "incarnation": self.table.incarnation,
                             "max_times_sampled": self.table.max_times_sampled,
                             "store_id": self.table.store_id, "lineage": list(self.table.lineage),
                             "priority_limit": self.table.priority_limit}
            raise ValueError(f"unknown table request {op!r}")
        except Exception as exc:  # noqa: BLE001 - the learner re-raises it as its own call's error
            return "error", exc

    def _draw(self, k: int, length: int, pad: str) -> tuple[int, int, np.ndarray, np.ndarray, int]:
        meta = {name: np.zeros(k, dtype=np.int64) for name in META_FIELDS}
        prob = np.zeros(k)
        got, table_size, removed = self.table.draw(k, length, pad, 0, meta, prob)
        if removed:
            self.limiter.delete(removed)
        cols = np.stack([meta[name][:got] for name in META_FIELDS])
        return got, table_size, cols, prob[:got], self.table.incarnation

    # -- lifetime
    def stop(self) -> None:
        """Close the socket and every connection and wait for the serving threads (a draw in progress
        finishes first); idempotent. Call before the table is closed."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            conns = list(self._conns.values())
        for sock in [self._sock, *conns]:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by its peer
        self._acceptor.join()
        self._sock.close()
        with self._lock:
            threads = list(self._threads)
        for t in threads:
            t.join()
        shutil.rmtree(self.run_dir, ignore_errors=True)

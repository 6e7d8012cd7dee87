"""The actor ↔ learner link of real-world RL: one TCP connection carrying roborl.wire frames (msgpack).

    actor → learner   hello {session, next_seq}      learner → actor   welcome {received, version, weights, config}
    actor → learner   batch {session, seq, rows, episodes}
                                                     learner → actor   weights {version, weights}   after updates
                                                     learner → actor   ack {durable}   a checkpoint holds seq ≤ durable
                                                     learner → actor   done {}         the run is over

Acknowledged means durable: the learner acknowledges a batch only once a checkpoint holds it, so a learner
killed at any moment loses nothing it acknowledged. The actor keeps every unacknowledged batch; on
(re)connecting it resends those after the `received` the learner names. A live learner names the last batch
it queued, a restarted one what its checkpoint holds, so no batch is counted twice or skipped. Batches the
actor made but had not sent when it was killed were never acknowledged: those are the only ones lost.
"""
from __future__ import annotations

import queue
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from roborl.wire import PeerClosed, WireError, pack, read_frame, unpack, write_frame


def parse_address(address: str) -> tuple[str, int]:
    """"HOST:PORT" -> (host, port); ValueError names what is wrong."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"'{address}' is not HOST:PORT (e.g. 127.0.0.1:7100)")
    if int(port) > 65535:
        raise ValueError(f"'{address}': the port must be in 0..65535")
    return host, int(port)


class Connection:
    """One framed socket; `send` is safe from several threads."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock, self.fd = sock, sock.fileno()
        self._send_lock = threading.Lock()

    def send(self, message: dict) -> None:
        payload = pack(message)
        with self._send_lock:
            write_frame(self.fd, payload)

    def recv(self, timeout: float | None = None) -> dict:
        message = unpack(read_frame(self.fd, timeout))
        if not isinstance(message, dict) or "type" not in message:
            raise WireError("a link message must be a map with a 'type'")
        return message

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


LINK_ERRORS = (OSError, PeerClosed, WireError, TimeoutError)


class LearnerLink:
    """The learner's end: listens for one actor at a time (a newer one replaces it), queues the batches it
    sends, publishes weights and acknowledges what checkpoints hold."""

    def __init__(self, host: str, port: int, config: dict) -> None:
        self.config = config
        self.server = socket.create_server((host, port))
        bound_host, bound_port = self.server.getsockname()[:2]
        self.address = f"{bound_host}:{bound_port}"
        self.received: dict[str, int] = {}  # session -> last seq absorbed (what the next checkpoint holds)
        self.queued: dict[str, int] = {}  # session -> last seq queued (absorbed or waiting)
        self.batches: queue.Queue = queue.Queue()
        self.weights: tuple[int, dict] | None = None
        self.conn: Connection | None = None
        self.session: str | None = None
        self.connections = 0
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="learner-link").start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                sock, _ = self.server.accept()
            except OSError:
                return
            conn = Connection(sock)
            try:
                hello = conn.recv(timeout=10.0)
                if hello["type"] != "hello" or not isinstance(hello.get("session"), str):
                    raise WireError("the first message of an actor must be hello {session}")
            except LINK_ERRORS:
                conn.close()
                continue
            session = hello["session"]
            with self._lock:
                if self.conn is not None:
                    self.conn.close()
                self.conn, self.session = conn, session
                self.connections += 1
                version, weights = self.weights or (-1, {})
                try:
                    conn.send({"type": "welcome", "received": self.queued.get(session, -1), "version": version,
                               "weights": weights, "config": self.config})
                except LINK_ERRORS:
                    continue
            threading.Thread(target=self._read, args=(conn, session), daemon=True, name="learner-link-read").start()

    def _read(self, conn: Connection, session: str) -> None:
        while True:
            try:
                message = conn.recv()
            except LINK_ERRORS:
                return
            if message["type"] != "batch":
                continue
            seq = int(message["seq"])
            with self._lock:
                if seq <= self.queued.get(session, -1):
                    continue  # a resend of what this learner already has
                self.queued[session] = seq
            self.batches.put((session, seq, message))

    def restore(self, received: dict[str, int]) -> None:
        """What a checkpoint holds, session by session: a resumed learner names it to its actor."""
        with self._lock:
            self.received, self.queued = dict(received), dict(received)

    @property
    def connected(self) -> bool:
        return self.conn is not None

    def publish(self, version: int, weights: dict[str, np.ndarray]) -> None:
        """New weights: sent to the actor now, and to any actor that connects later."""
        with self._lock:
            self.weights = (version, weights)
            conn = self.conn
        self._send(conn, {"type": "weights", "version": version, "weights": weights})

    def take(self, rows: int, check: Callable[[], None] | None = None) -> list[dict]:
        """Every batch queued, and at least `rows` transitions: the learner waits for the actor as long as it
        takes, and a learner slower than its robot takes the whole backlog at once (SERL's learner trains on
        everything that has arrived, so the actor's data and the weights it runs stay fresh). `check` is called
        every half second of waiting (it raises to give up)."""
        out, got = [], 0
        while True:
            try:
                session, seq, message = self.batches.get(timeout=0.5) if got < rows else self.batches.get_nowait()
            except queue.Empty:
                if got >= rows:
                    return out
                if check is not None:
                    check()
                continue
            out.append(message)
            got += len(message["rows"].get("reward", ()))
            self.received[session] = seq

    def acknowledge(self) -> None:
        """A checkpoint now holds everything absorbed: tell the actor, which may then forget it."""
        with self._lock:
            conn, session = self.conn, self.session
        if session is not None and session in self.received:
            self._send(conn, {"type": "ack", "durable": self.received[session]})

    def finish(self) -> None:
        with self._lock:
            conn = self.conn
        self._send(conn, {"type": "done"})

    def _send(self, conn: Connection | None, message: dict) -> None:
        if conn is None:
            return
        try:
            conn.send(message)
        except LINK_ERRORS:
            with self._lock:
                if self.conn is conn:
                    self.conn = None

    def close(self) -> None:
        self._closed = True
        try:
            self.server.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread, which holds the port until then
        except OSError:
            pass
        self.server.close()
        if self.conn is not None:
            self.conn.close()


class ActorLink:
    """The actor's end: keeps every batch until the learner acknowledges it, (re)connects in the background
    and resends what the learner lacks; holds the newest weights it was sent."""

    def __init__(self, address: str, session: str, reconnect_s: float = 300.0) -> None:
        self.address, self.session, self.reconnect_s = parse_address(address), session, reconnect_s
        self.outbox: list[tuple[int, dict]] = []  # (seq, message), unacknowledged
        self.next_seq = 0
        self.sent_rows = 0  # transitions handed to `send`
        self.acknowledged_rows = 0  # of those, the ones the learner acknowledged (a checkpoint holds them)
        self.sent_upto = -1
        self.durable = -1
        self.weights: tuple[int, dict] | None = None
        self.config: dict | None = None
        self.done = threading.Event()
        self.lost = threading.Event()  # the learner stayed away for reconnect_s
        self.welcomed = threading.Event()
        self.conn: Connection | None = None
        self._cond = threading.Condition()
        threading.Thread(target=self._run, daemon=True, name="actor-link").start()

    def send(self, rows: dict[str, Any], episodes: list[dict]) -> int:
        """Queue a batch of transitions (and the episodes that ended in it); returns its seq."""
        with self._cond:
            seq = self.next_seq
            self.next_seq += 1
            self.sent_rows += len(rows.get("reward", ()))
            self.outbox.append((seq, {"type": "batch", "session": self.session, "seq": seq, "rows": rows,
                                      "episodes": episodes}))
            self._cond.notify_all()
        return seq

    def unacknowledged(self) -> int:
        with self._cond:
            return len(self.outbox)

    def _connect(self) -> Connection:
        conn = Connection(socket.create_connection(self.address, timeout=5.0))
        conn.sock.settimeout(None)
        conn.send({"type": "hello", "session": self.session, "next_seq": self.next_seq})
        welcome = conn.recv(timeout=30.0)
        if welcome["type"] != "welcome":
            raise WireError(f"the learner answered hello with {welcome['type']!r}")
        with self._cond:
            self.sent_upto = int(welcome["received"])
            self.config = welcome["config"]
            if welcome["version"] >= 0:
                self.weights = (int(welcome["version"]), welcome["weights"])
        self.welcomed.set()
        return conn

    def _run(self) -> None:
        lost_since = time.monotonic()
        while not self.done.is_set():
            try:
                conn = self._connect()
            except LINK_ERRORS:
                if time.monotonic() - lost_since > self.reconnect_s:
                    self.lost.set()
                    with self._cond:
                        self._cond.notify_all()
                    return
                time.sleep(0.5)
                continue
            self.conn = conn
            reader = threading.Thread(target=self._read, args=(conn,), daemon=True, name="actor-link-read")
            reader.start()
            try:
                while reader.is_alive() and not self.done.is_set():
                    with self._cond:
                        self._cond.wait_for(lambda: any(s > self.sent_upto for s, _ in self.outbox) or
                                            not reader.is_alive() or self.done.is_set(), timeout=0.5)
                        todo = [(s, m) for s, m in self.outbox if s > self.sent_upto]
                    for seq, message in todo:
                        conn.send(message)
                        self.sent_upto = seq
            except LINK_ERRORS:
                pass
            conn.close()
            self.conn = None
            lost_since = time.monotonic()

    def _read(self, conn: Connection) -> None:
        while True:
            try:
                message = conn.recv()
            except LINK_ERRORS:
                break
            kind = message["type"]
            with self._cond:
                if kind == "weights":
                    self.weights = (int(message["version"]), message["weights"])
                elif kind == "ack":
                    self.durable = max(self.durable, int(message["durable"]))
                    kept = [(s, m) for s, m in self.outbox if s > self.durable]
                    self.acknowledged_rows += sum(len(m["rows"].get("reward", ())) for s, m in self.outbox
                                                  if s <= self.durable)
                    self.outbox = kept
                elif kind == "done":
                    self.done.set()
                self._cond.notify_all()
            if kind == "done":
                break
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        self.done.set()
        if self.conn is not None:
            self.conn.close()

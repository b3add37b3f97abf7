"""Turns at `strop serve`'s one engine, shared fairly between clients.

A generation runs in chunks (`strop.serve.generation`), each chunk one turn. When a turn ends, the next goes to the
waiting client address served longest ago, and within an address to the connection served longest ago (ties: the
one that has waited longest). So a client with six generations on six connections takes one turn in seven when a
seventh connection asks, and that newcomer waits for at most the chunk already running, however much the others
have queued (with one lock, it waited for all of their work, in whatever order the lock let threads in).

    turns = Turns()
    with turns.turn(address="127.0.0.1", connection=7):
        ...  # one chunk on the engine
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

# when each address and connection last had a turn, kept for this many of them (the oldest forgotten first):
# one forgotten looks new, and goes first once, which is all it can gain
REMEMBERED = 4096


@dataclass(frozen=True)
class _Ticket:
    address: Hashable
    connection: Hashable
    arrival: int


class Turns:
    """One turn at a time; see the module's docstring for who goes next."""

    def __init__(self):
        self._changed = threading.Condition()
        self._busy = False
        self._waiting: list[_Ticket] = []
        self._served: OrderedDict[tuple[str, Hashable], int] = OrderedDict()
        self._clock = itertools.count(1)
        self._arrivals = itertools.count()

    @property
    def busy(self) -> bool:
        """Whether a turn is being taken now."""
        return self._busy

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @contextmanager
    def turn(self, address: Hashable, connection: Hashable) -> Iterator[None]:
        """Wait for this client's turn, hold it for the body of the `with`, then pass it on."""
        ticket = _Ticket(address, connection, next(self._arrivals))
        with self._changed:
            self._waiting.append(ticket)
            try:
                while self._busy or self._next() is not ticket:
                    self._changed.wait()
            except BaseException:       # interrupted while waiting: whoever is next now must hear of it
                self._waiting.remove(ticket)
                self._changed.notify_all()
                raise
            self._waiting.remove(ticket)
            self._busy = True
            self._mark_served(ticket)
        try:
            yield
        finally:
            with self._changed:
                self._busy = False
                self._changed.notify_all()

    def _next(self) -> _Ticket:
        return min(self._waiting, key=lambda t: (self._served.get(("address", t.address), 0),
                                                 self._served.get(("connection", t.connection), 0), t.arrival))

    def _mark_served(self, ticket: _Ticket) -> None:
        now = next(self._clock)
        for key in (("address", ticket.address), ("connection", ticket.connection)):
            self._served[key] = now
            self._served.move_to_end(key)
        while len(self._served) > REMEMBERED:
            self._served.popitem(last=False)

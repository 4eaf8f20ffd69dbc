"""MariaDB GTIDs: the server-independent name of a source transaction, and what a server holds of them.

A MariaDB GTID is ``domain-server_id-sequence`` (``0-1-77``). Two forms of a set of them matter here:

* a **GTID position** (``gtid_binlog_pos``, ``BINLOG_GTID_POS(file, pos)``, the capture's ``gtid_pos`` in its
  ledger record): the last GTID of each domain, ``"0-1-77,1-5-3"``. It names a point in the binlog on every
  server of a replication cluster: with ``gtid_strict_mode`` sequence numbers only grow within a domain and
  every server applies a domain's transactions in the same order.
* a **GTID state** (``gtid_binlog_state``): the last sequence number of each ``(domain, server_id)`` the server
  has in its binlog, ``"0-1-95,0-2-110"``. A GTID ``d-s-n`` is in the server's binlog when the state holds
  ``d-s-m`` with ``m >= n`` (strict mode: server ``s`` wrote ``n`` before ``m``, replicas apply them in order).
  Comparing sequence numbers per domain only would be wrong after a failover: a promoted replica that lost the
  old primary's last transactions ``0-1-96..100`` and then took writes of its own (``0-2-96..110``) has higher
  sequence numbers but not those transactions.

:func:`missing` is the divergence check of every resume (:mod:`exactly_once_provider.capture.resume`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

_GTID = re.compile(r"^\s*(\d+)-(\d+)-(\d+)\s*$")


@dataclass(frozen=True, order=True)
class Gtid:
    """One MariaDB GTID."""

    domain: int
    server_id: int
    seq: int

    @classmethod
    def parse(cls, text: str) -> Gtid:
        """Return the GTID ``text`` names (``"0-1-77"``).

        :raises ValueError: ``text`` is not ``domain-server_id-sequence``.
        """
        match = _GTID.match(str(text))
        if not match:
            raise ValueError(f"{text!r} is not a MariaDB GTID: use 'domain-server_id-sequence', e.g. '0-1-77'.")
        return cls(int(match.group(1)), int(match.group(2)), int(match.group(3)))

    def __str__(self) -> str:
        return f"{self.domain}-{self.server_id}-{self.seq}"


GtidPosition = dict[int, Gtid]  # domain -> last GTID of that domain


def parse_list(text: str | None) -> list[Gtid]:
    """Return the GTIDs of a comma-separated list (``""`` and ``None`` are the empty list).

    :param text: e.g. ``"0-1-77,1-5-3"`` (what ``gtid_binlog_pos``/``gtid_binlog_state`` hold).
    """
    return [Gtid.parse(part) for part in (text or "").split(",") if part.strip()]


def parse_position(text: str | None) -> GtidPosition:
    """Return the GTID position ``text`` names: one GTID per domain.

    :param text: e.g. ``"0-1-77,1-5-3"``.
    :raises ValueError: a domain appears twice (that is a GTID state, not a position).
    """
    position: GtidPosition = {}
    for gtid in parse_list(text):
        if gtid.domain in position:
            raise ValueError(
                f"GTID position {text!r} names domain {gtid.domain} twice: a position holds the last "
                "GTID of each domain (gtid_binlog_pos), not a state (gtid_binlog_state)."
            )
        position[gtid.domain] = gtid
    return position


def format_position(position: Mapping[int, Gtid]) -> str:
    """Return the text form of a GTID position, domains in order (``"0-1-77,1-5-3"``)."""
    return ",".join(str(position[domain]) for domain in sorted(position))


def advance(position: GtidPosition, gtid: str) -> None:
    """Move ``position`` past the transaction ``gtid`` (the last GTID of its domain is now ``gtid``)."""
    parsed = Gtid.parse(gtid)
    position[parsed.domain] = parsed


@dataclass(frozen=True)
class ServerIdentity:
    """Which server a connection reaches and the GTIDs its binlog holds (MariaDB: ``gtid_binlog_state``)."""

    server_id: int
    is_mariadb: bool
    gtid_state: list[Gtid] | None  # None: not MariaDB


@dataclass(frozen=True)
class MissingRange:
    """Transactions delivered downstream that a server's binlog does not hold.

    ``first`` is None when the server holds no transaction of ``server_id`` in ``domain`` at all.
    """

    domain: int
    server_id: int
    first: int | None
    last: int

    def __str__(self) -> str:
        if self.first == self.last:
            return f"{self.domain}-{self.server_id}-{self.last}"
        if self.first is None:
            return (
                f"every GTID of server {self.server_id} in domain {self.domain} up to {self.domain}-"
                f"{self.server_id}-{self.last}"
            )
        return f"{self.domain}-{self.server_id}-{self.first} .. {self.domain}-{self.server_id}-{self.last}"

    def touches(self, table_position: Mapping[int, Gtid]) -> bool:
        """Return whether a table whose last delivered change is at ``table_position`` changed in this range."""
        last = table_position.get(self.domain)
        return last is not None and (self.first is None or last.seq >= self.first)


def missing(delivered: Mapping[int, Gtid], state: Iterable[Gtid]) -> list[MissingRange]:
    """Return the delivered transactions the server's binlog does not hold (empty: nothing is missing).

    :param delivered: the GTID position after the last transaction delivered downstream.
    :param state: the server's ``gtid_binlog_state`` (last sequence of each domain and server id).
    """
    held: dict[tuple[int, int], int] = {}
    for gtid in state:
        key = (gtid.domain, gtid.server_id)
        held[key] = max(held.get(key, 0), gtid.seq)
    found = []
    for domain in sorted(delivered):
        last = delivered[domain]
        have = held.get((domain, last.server_id))
        if have is None or have < last.seq:
            found.append(MissingRange(domain, last.server_id, None if have is None else have + 1, last.seq))
    return found


__all__ = [
    "Gtid",
    "GtidPosition",
    "MissingRange",
    "ServerIdentity",
    "advance",
    "format_position",
    "missing",
    "parse_list",
    "parse_position",
]

"""The names of every key and pub/sub channel the gateway uses in a shared store.

Each begins with the prefix ``<namespace>:<upstream>`` (``gateway.records.keys``), so
that a Redis ACL confined to ``~<namespace>:*`` and ``&<namespace>:*`` allows all of
them and ``SCAN MATCH <namespace>:*`` finds all of them:

- ``<prefix>:e:<query>|<caller>``: an entry; ``...:lease`` after it, its fill lease;
- ``<prefix>:{<prefix>:gen}``: the generation whose change purges everything, and
  ``<prefix>:{<prefix>:gen}:<route>`` that of one route;
- ``<prefix>:{<prefix>:gen}:invalidate`` and ``...:invalidated``: the near caches'
  invalidations and their confirmations (channels);
- ``<prefix>:{<prefix>:r}``: the number of the latest purge by record, and
  ``<prefix>:{<prefix>:r}:<digest>`` the entries that hold one record and the number of
  its last purge (a sorted set); the digest is of the record's reference, so that no
  id (free text for an account) shapes a key; ``...:<digest>:v``, the versions of the
  record the latest fills noted, by scope (``cache.record_consistency``). They share
  one slot, so that one script notes every record an entry holds;
- ``<prefix>:fleet``: the fleet's announcements (a hash);
- ``<prefix>:fleet-ready``: each process's readiness, as it last announced it (a hash);
- ``<prefix>:index-size``: the records' index's size, as one instance last measured it;
- ``<prefix>:claim:<name>``: a name claimed once for a while (``CacheBackend.claim``:
  the signed change notices already taken);
- ``<prefix>:probe``: the readiness probe's write.

The braces are a Redis Cluster hash tag, after the prefix: the generations and the
channels share one slot (see :func:`shared_slot`), the tag holding the whole prefix so
that gateways of other namespaces or upstreams spread over other slots.
"""

from __future__ import annotations

import functools
import hashlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.cache.entry import CacheKey

# The parts after the prefix.
ENTRY_PART = "e"
GENERATION_PART = "gen"
LEASE_SUFFIX = ":lease"
FLEET_PART = "fleet"
PROBE_PART = "probe"
CLAIM_PART = "claim"
# after a record's set: its hash of versions
VERSIONS_SUFFIX = b":v"
RECORD_PART = "r"
INVALIDATION_CHANNEL = "invalidate"
ACK_CHANNEL = "invalidated"


def entry_prefix(prefix: str) -> str:
    """What the key of every entry of ``prefix`` begins with."""
    return f"{prefix}:{ENTRY_PART}:"


def shared_slot(prefix: str) -> str:
    """What the purge generations and the pub/sub channels of a prefix begin with, its
    hash tag after the prefix: one Redis Cluster slot, so that one MGET reads the two
    generations an entry is checked against, and so that the node that holds the
    generations is the one every subscriber listens on (when it stalls, a purge's
    outcome is unknown and every near cache goes off with it)."""
    return f"{prefix}:" + "{" + f"{prefix}:{GENERATION_PART}" + "}"


def generation_key(prefix: str, route: str | None) -> str:
    """The generation whose change purges everything (route None) or one route."""
    return shared_slot(prefix) + ("" if route is None else f":{route}")


def lease_key(key: CacheKey) -> str:
    """The key held by the one instance filling ``key`` (see records.pipeline)."""
    return key.text + LEASE_SUFFIX


def invalidation_channel(prefix: str) -> str:
    """The near caches' channel of invalidations, in the generations' slot."""
    return f"{shared_slot(prefix)}:{INVALIDATION_CHANNEL}"


def ack_channel(prefix: str) -> str:
    """The channel of the confirmations of invalidations, in the generations' slot."""
    return f"{shared_slot(prefix)}:{ACK_CHANNEL}"


def fleet_key(prefix: str) -> str:
    """The hash of the fleet's announcements."""
    return f"{prefix}:{FLEET_PART}"


def fleet_ready_key(prefix: str) -> str:
    """The hash of each instance's readiness, as it last announced it."""
    return f"{prefix}:{FLEET_PART}-ready"


def probe_key(prefix: str) -> str:
    """The key the readiness probe writes and reads."""
    return f"{prefix}:{PROBE_PART}"


def index_size_key(prefix: str) -> str:
    """The records' index's size as last measured (``<keys> <bytes>``)."""
    return f"{prefix}:index-size"


def claim_key(prefix: str, name: str) -> str:
    """The key that holds ``name`` claimed (``CacheBackend.claim``)."""
    return f"{prefix}:{CLAIM_PART}:{name}"


def record_slot(prefix: str) -> str:
    """What every key of the records' index begins with, its hash tag after the
    prefix: one Redis Cluster slot, so that one script notes every record an entry
    holds, and one purges a record, atomically."""
    return f"{prefix}:" + "{" + f"{prefix}:{RECORD_PART}" + "}"


def record_sequence_key(prefix: str) -> str:
    """The number of the latest purge by record."""
    return record_slot(prefix)


@functools.lru_cache(maxsize=16_384)
def record_key(prefix: str, ref: str) -> str:
    """The sorted set of the entries that hold the record ``ref`` (``expense:<id>``);
    remembered, since a store names up to 40 records and most come again (accounts,
    clients and users are held by many entries)."""
    digest = hashlib.sha256(ref.encode()).hexdigest()[:32]
    return f"{record_slot(prefix)}:{digest}"

"""``ibacmp``, the default resolution provider (behavior.md §4, §8-§14, mad-protocol.md).

Rooms: ``provider`` (the Provider API), ``endpoint`` (the port, and an endpoint's lifecycle,
joins, addresses and the host it is to its protocol and resolver), ``traffic`` (its QP's
receive loop, responses and requests), ``bulk`` (the bulk route table), ``groups``
(multicast joins), ``protocol`` (ACM MADs received), ``resolution`` (the cache state machine
driven by clients and peers), ``routes`` (SA path queries, local paths), ``cache``
(destination cache: its entries' state machine), with ``keys`` (canonical addresses),
``entry`` (an entry and what waits on it), ``deadlines`` (expiry by the second), ``eviction``
(the bound) and ``publication`` (the route table for the client loop); ``preload`` (hosts and
route files), ``persistence`` (cache file), ``counters`` (the seven counters and an
endpoint's statistics).

C defects fixed here, all without changing what travels on the wire: 23-26 (SM change drops
routes, a reopened endpoint joins and preloads again, failed joins are retried with a
backoff, only joined groups are advertised and matched), 31-34 (routes dropped on SM/LID
changes, a bounded cache with background expiry, fresh SA queries, case-insensitive name
keys), 36 (preloaded entries learn the peer's QPN), 37-39 (any number of groups up to the six
that fit, bounded MGID counts, SA replies checked and BUSY retried), 43 (a definite SA
failure at the responder is sent to the requester at once), 45 (GID and LID requests are
answered, no stale-TID responses), 46 (completion errors cost nothing), 47 (rates above EDR).
"""

"""The fleet: which backends serve (the ``--backend`` list and ``--backend-dns`` answers,
``discovery`` and ``dns_admission``), how it changes and what each serves (``membership``), each
one's health (``health``), the retired ones still draining (``retire``) and what each is believed
to hold (``holdings``, the one record the router and the reuse sender read). It knows nothing of
the choice among them (``mmgate.routing``)."""

from mmgate.fleet.holdings import BackendHoldings, processed_bytes, session_token
from mmgate.fleet.membership import Fleet

__all__ = ["BackendHoldings", "Fleet", "processed_bytes", "session_token"]

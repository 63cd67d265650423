"""``mmgate serve``, the composition root: settings → flags (``cli``), embedded engines
(``engines``) and the running gateway (``start``). Only this package wires the others together."""

from mmgate.serve.engines import start_embedded_engines
from mmgate.serve.start import RunningGateway, start_gateway

__all__ = ["RunningGateway", "start_embedded_engines", "start_gateway"]

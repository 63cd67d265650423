"""``mmgate bench``: a multimodal session benchmark for any OpenAI-compatible endpoint.

Modules, one job each: ``dataset`` (AIPerf single_turn / multi_turn JSONL), ``synth`` (sliding-window
generator), ``images`` + ``image_server`` (images as data: URLs or from a loopback origin),
``planner`` (``--uuid-and-strip``, pure), ``payload`` (request bodies), ``client`` (HTTP + SSE),
``load`` (load generation), ``records`` + ``stats`` (measurements), ``overhead`` (the client measuring itself),
``report`` / ``plots`` / ``compare`` / ``progress`` (output), ``runner`` (a whole run), ``cli``.
Output needs the ``bench`` extra (rich; matplotlib for plots): the names here import neither.
"""

from mmgate.bench.dataset import Session, Turn, load_dataset
from mmgate.bench.errors import BenchError, DatasetError, ResultFileError
from mmgate.bench.settings import BenchSettings
from mmgate.bench.synth import SlidingWindowSpec, generate_sliding_window

__all__ = [
    "BenchError", "BenchSettings", "DatasetError", "ResultFileError", "Session", "SlidingWindowSpec", "Turn",
    "generate_sliding_window", "load_dataset",
]

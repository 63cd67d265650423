"""An image decode process imports what decoding needs and nothing else: the forkserver imports
``mmgate.media.decode_worker`` before the gateway listens (``mmgate.media.decode_procs``), so what it
pulls in is start-up time (the loader's aiohttp, redis and pydantic cost ~0.5 s)."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("aiohttp", "redis", "pydantic", "orjson", "prometheus_client", "opentelemetry", "mmgate.media.loader")


def test_the_decode_worker_imports_pillow_and_validation_only() -> None:
    code = ("import json, sys, mmgate.media.decode_worker\n"
            "print(json.dumps([m if m.startswith('mmgate') else m.split('.')[0] for m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    loaded = set(json.loads(out))
    assert "PIL" in loaded and "mmgate.media.validate" in loaded
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))

"""vLLM's real chat-part parser as an oracle: how vLLM 0.32 reads a content part, and what it then
acts on (a URL it loads, a uuid it honours). It runs ``vllm_parser_oracle.py`` under the vLLM venv's
interpreter (``MMGATE_VLLM_VENV``, default ``<repo>/.venv-vllm``, as ``tests/support/vllm.py``), so
the answer comes from vLLM's own code, not from our reading of it."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
ORACLE = Path(__file__).with_name("vllm_parser_oracle.py")
# Part types vLLM loads a URL for (the content is the URL) and media types whose uuid it honours.
URL_TYPES = frozenset({"image_url", "input_image", "audio_url", "video_url"})
MEDIA_TYPES = frozenset({"image_url", "input_image", "image_pil", "image_embeds", "audio_embeds", "video_embeds",
                         "audio_url", "input_audio", "video_url"})


def vllm_python() -> Path:
    """The vLLM venv's interpreter (``tests/support/vllm.py`` finds it; ``VllmUnavailable`` if none)."""
    from tests.support.vllm import VllmSetup

    return VllmSetup.locate().python


@dataclass(frozen=True)
class Reading:
    """How vLLM reads one part."""

    type: str | None
    content: Any
    uuid: str | None
    error: str | None

    @property
    def url(self) -> str | None:
        """The URL vLLM would load for this part (None: it loads none)."""
        if self.error is None and self.type in URL_TYPES and isinstance(self.content, str) and self.content:
            return self.content
        return None

    @property
    def honoured_uuid(self) -> str | None:
        """The uuid vLLM would use as a cache key for this part (None: none)."""
        return self.uuid if self.error is None and self.type in MEDIA_TYPES else None

    def describe(self) -> str:
        if self.error is not None:
            return "400 (" + self.error.split(":", 1)[0] + ")"
        what = str(self.type)
        if self.url is not None:
            what += " → loads " + ("data: URL" if self.url.startswith("data:") else self.url)
        elif self.type in MEDIA_TYPES and self.content is None:
            what += " (no data)"
        if self.honoured_uuid is not None:
            what += f", uuid {self.honoured_uuid}"
        return what


class VllmParser:
    """One long-lived oracle process (vLLM's import takes ~10-30 s); ``read(parts)``."""

    def __init__(self, python: Path, timeout_s: float = 180) -> None:
        self._proc = subprocess.Popen(
            [str(python), "-P", str(ORACLE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, env={**os.environ, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"},
        )
        self._lock = threading.Lock()
        first = self._line(timeout_s)
        if not first.get("ready"):
            raise RuntimeError(f"vLLM parser oracle did not start: {first}")

    def _line(self, timeout_s: float) -> Any:
        assert self._proc.stdout is not None
        box: list[str] = []
        reader = threading.Thread(target=lambda: box.append(self._proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(timeout_s)
        if not box or not box[0]:
            self.close()
            raise RuntimeError("vLLM parser oracle gave no answer (timed out or exited)")
        return json.loads(box[0])

    def read(self, parts: list[Any]) -> list[Reading]:
        with self._lock:
            assert self._proc.stdin is not None
            self._proc.stdin.write(json.dumps(parts) + "\n")
            self._proc.stdin.flush()
            answers = self._line(60)
        return [Reading(a.get("type"), a.get("content"), a.get("uuid"), a.get("error")) for a in answers]

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(10)

"""Make PyPI's torchvision importable beside CPU torch (run with the vLLM venv's python).

PyPI's torchvision wheel is a CUDA build; beside ``torch+cpu`` its C ops are absent, and
``import torchvision`` dies in ``torchvision/_meta_registrations.py`` with "operator
torchvision::nms does not exist" (``torch.library.register_fake`` of an op nobody defined).
transformers' Qwen2-VL image processor needs ``torchvision.transforms.v2``, which needs none of
those ops. This rewrites the two ``register_fake("torchvision::...")`` decorators to register only
when ``torchvision.extension._has_ops()`` is true, the same guard the file already uses for its
``register_meta`` decorators. Idempotent: a patched file is left alone. Exit status 1, with the
reason, when the file is not the one this was written for.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

MARKER = "# mmgate: register_fake only when the C ops exist"
GUARD = f'''
{MARKER}
def _register_fake_if_ops(name):
    if torchvision.extension._has_ops():
        return torch.library.register_fake(name)
    return lambda fn: fn

'''
DECORATOR = '@torch.library.register_fake("torchvision::'
ANCHOR = "@functools.lru_cache(None)\ndef get_meta_lib():"


def main() -> int:
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        print("patch_torchvision: torchvision is not installed in this interpreter", file=sys.stderr)
        return 1
    path = Path(spec.origin).with_name("_meta_registrations.py")
    text = path.read_text()
    if MARKER in text:
        print(f"patch_torchvision: {path} already patched", file=sys.stderr)
        return 0
    if DECORATOR not in text or ANCHOR not in text:
        print(f"patch_torchvision: {path} does not look like torchvision 0.2x's file; not patched",
              file=sys.stderr)
        return 1
    text = text.replace(ANCHOR, GUARD.lstrip("\n") + ANCHOR, 1)
    text = text.replace(DECORATOR, '@_register_fake_if_ops("torchvision::')
    path.write_text(text)
    print(f"patch_torchvision: patched {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

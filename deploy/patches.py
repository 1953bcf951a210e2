"""Idempotent fixes to installed third-party packages that CPU-only serving needs.

Run by ``scripts/bootstrap.sh`` after installing; each fix says why it exists. A fix that no
longer finds its target (the package changed) is reported, never forced.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

# Dynamo's Qwen multimodal helper imports transformers' torchvision image processor at import
# time, and no CPU torchvision exists here; the PIL variant has the same `smart_resize`.
QWEN_IMPORT = ("from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize",
               "from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize")


def _module_file(module: str) -> Path | None:
    spec = importlib.util.find_spec(module.split(".")[0])
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(spec.submodule_search_locations[0], *module.split(".")[1:]).with_suffix(".py")


def patch(module: str, old: str, new: str) -> str:
    path = _module_file(module)
    if path is None or not path.exists():
        return f"skip {module}: not installed"
    text = path.read_text()
    if new in text:
        return f"ok   {module}: already patched"
    if old not in text:
        return f"WARN {module}: expected line not found; not patched"
    path.write_text(text.replace(old, new))
    return f"done {module}"


def main() -> int:
    print(patch("dynamo.vllm.multimodal_utils.models.qwen", *QWEN_IMPORT))
    return 0


if __name__ == "__main__":
    sys.exit(main())

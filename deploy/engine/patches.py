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
QWEN_IMPORT = (
    "from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize",
    "from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize",
)


# vLLM rewinds a seeded request's generator when its sampled token is discarded (e.g. a chunked
# prefill step). CPU generators have no offset, so with seeded requests under load the engine
# core dies ("CPU Generator does not use offset") and takes every request with it. On CPU the
# rewind is skipped: a seeded request that was chunked may sample differently, nothing crashes.
SEEDED_DISCARD = (
    """            if gen is not None:
                gen.set_offset(gen.get_offset() - 4)""",
    """            if gen is not None and gen.device.type != "cpu":  # flywheel: CPU has no offset
                gen.set_offset(gen.get_offset() - 4)""",
)


# NIXL's Python wrapper hard-codes a zero poll timeout for the UCX backend's progress thread
# (``pthrDelay`` microseconds): an idle P/D worker spins a core in poll(..., 0), on 2 cores the
# workers' discovery keep-alives starve and their registrations lapse. Events still wake the
# thread through the UCX workers' fds, so 100 ms is only a fallback wake-up (measured: idle
# P/D stack 1.9 -> 0.05 cores busy; see shared/notes/found-2026-12-01.md). vLLM loads whichever
# variant the `nixl` package picks, so both are patched. The delay is the workers'
# `worker.nixl_progress_delay_us`, passed as NIXL_PTHR_DELAY_US.
NIXL_DELAY = (
    "        agent_config.pthrDelay = 0\n",
    "        agent_config.pthrDelay = int(__import__('os').environ.get('NIXL_PTHR_DELAY_US', "
    "'100000'))  # flywheel: a fallback wake-up, not a busy poll\n",
)
NIXL_DELAY_BEFORE = "        agent_config.pthrDelay = 100000  # flywheel: 100 ms fallback, not a busy poll\n"

# The LM-head re-tie after an in-place reload was a patch here; it is a vLLM general plugin now
# (deploy/engine/vllm_plugin.py). A vLLM this patched is put back, so that the plugin alone does
# it. The patches left have no plugin point: an import at module load in Dynamo, a line inside a
# vLLM runner method, and a constant in NIXL's agent config.
RETIE_HEAD_PATCHED = (
    """def finalize_layerwise_reload(*args, **kwargs):
    finalize_layerwise_processing(*args, **kwargs)
    # flywheel: re-tie a tied LM head to the embedding just loaded, then repack its GEMM
    model = args[0] if args else kwargs["model"]
    head, inner = getattr(model, "lm_head", None), getattr(model, "model", None)
    embed = getattr(inner, "embed_tokens", None)
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    if tied and head is not None and embed is not None and hasattr(head, "quant_method"):
        head.quant_method.tie_weights(head, embed)
        head.quant_method.process_weights_after_loading(head)
""",
    """def finalize_layerwise_reload(*args, **kwargs):
    finalize_layerwise_processing(*args, **kwargs)
""",
)


def _module_file(module: str) -> Path | None:
    spec = importlib.util.find_spec(module.split(".")[0])
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(spec.submodule_search_locations[0], *module.split(".")[1:]).with_suffix(".py")


def patch(module: str, old: str, new: str, earlier: tuple[str, ...] = ()) -> str:
    """``old`` -> ``new`` in ``module``'s file; ``earlier``: what an earlier version of this fix
    wrote, replaced too."""
    path = _module_file(module)
    if path is None or not path.exists():
        return f"skip {module}: not installed"
    text = path.read_text()
    if new in text:
        return f"ok   {module}: already patched"
    old = next((o for o in (old, *earlier) if o in text), None)
    if old is None:
        return f"WARN {module}: expected line not found; not patched"
    path.write_text(text.replace(old, new))
    return f"done {module}"


def undo(module: str, patched: str, original: str) -> str:
    """Put back what an earlier fix here wrote into ``module``'s file."""
    path = _module_file(module)
    if path is None or not path.exists():
        return f"skip {module}: not installed"
    text = path.read_text()
    if patched not in text:
        return f"ok   {module}: not patched"
    path.write_text(text.replace(patched, original))
    return f"undone {module}"


def main() -> int:
    print(patch("dynamo.vllm.multimodal_utils.models.qwen", *QWEN_IMPORT))
    print(patch("vllm.v1.worker.gpu_model_runner", *SEEDED_DISCARD))
    print(undo("vllm.model_executor.model_loader.reload.layerwise", *RETIE_HEAD_PATCHED))
    for variant in ("nixl_cu12", "nixl_cu13"):
        print(patch(f"{variant}._api", *NIXL_DELAY, earlier=(NIXL_DELAY_BEFORE,)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A vLLM general plugin (entry point ``vllm.general_plugins``, loaded by every vLLM process:
the engine core and each worker) that re-ties a tied LM head after an in-place reload.

vLLM's in-place reload (``reload_weights``, behind ``/update_weights``) loads layer by layer.
A tied LM head (``tie_word_embeddings``: the tiny model's) has no tensor of its own in the
checkpoint, so the reload puts its *old* tensors back ("ParallelLMHead: Failed to load
weights"), and on CPU its GEMM was prepacked from them too: the engine then samples from the
new body through the old embedding. Measured on the warmed tiny model: the served greedy tokens
were 3.4-5.6 nats below the new weights' argmax. After the reload the head is tied to the
embedding just loaded and its GEMM is packed again.

vLLM has no hook after a layer-wise reload, so the plugin wraps
``finalize_layerwise_reload`` where it is looked up: its module, the ``reload`` package that
re-exports it, and the GPU model runner (which the CPU runner inherits) if it has already
imported it by name. Runs in vLLM's processes only; imports nothing of ours."""

from __future__ import annotations

import sys

_MARK = "_flywheel_reties_head"
_HOLDERS = (
    "vllm.model_executor.model_loader.reload.layerwise",
    "vllm.model_executor.model_loader.reload",
    "vllm.model_executor.model_loader.reload.torchao_decorator",
    "vllm.v1.worker.gpu_model_runner",
)


def retie_head(model) -> None:
    """Tie a tied LM head to the model's embedding again and repack its GEMM."""
    head, inner = getattr(model, "lm_head", None), getattr(model, "model", None)
    embed = getattr(inner, "embed_tokens", None)
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    if tied and head is not None and embed is not None and hasattr(head, "quant_method"):
        head.quant_method.tie_weights(head, embed)
        head.quant_method.process_weights_after_loading(head)


def register() -> None:
    """vLLM calls this once per process (and may call it again: it is idempotent)."""
    from vllm.model_executor.model_loader.reload import layerwise

    original = layerwise.finalize_layerwise_reload
    if getattr(original, _MARK, False):
        return

    def finalize_layerwise_reload(*args, **kwargs):
        result = original(*args, **kwargs)
        retie_head(args[0] if args else kwargs["model"])
        return result

    setattr(finalize_layerwise_reload, _MARK, True)
    for name in _HOLDERS:
        module = sys.modules.get(name)
        if module is not None and getattr(module, "finalize_layerwise_reload", None) is original:
            module.finalize_layerwise_reload = finalize_layerwise_reload

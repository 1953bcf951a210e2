"""A vLLM general plugin (entry point ``vllm.general_plugins``, loaded by every vLLM process:
the engine core and each worker) with two fixes that have no other hook.

**The LM head after an in-place reload.** vLLM's in-place reload (``reload_weights``, behind
``/update_weights``) loads layer by layer. A tied LM head (``tie_word_embeddings``: the tiny
model's) has no tensor of its own in the checkpoint, so the reload puts its *old* tensors back
("ParallelLMHead: Failed to load weights"), and on CPU its GEMM was prepacked from them too: the
engine then samples from the new body through the old embedding. Measured on the warmed tiny
model: the served greedy tokens were 3.4-5.6 nats below the new weights' argmax. After the
reload the head is tied to the embedding just loaded and its GEMM is packed again. vLLM has no
hook after a layer-wise reload, so the plugin wraps ``finalize_layerwise_reload`` where it is
looked up: its module, the ``reload`` package that re-exports it, and the GPU model runner
(which the CPU runner inherits) if it has already imported it by name.

**A base request batched with adapter requests, on CPU.** A token without an adapter has the
LoRA index -1; the GPU kernels skip it, but the PyTorch ops the CPU platform runs index the
stacked adapters with it, and -1 is the *last* slot: the base request got that slot's adapter
(measured: with 3 adapters loaded in 2 slots, 29 of 30 base requests sent beside one adapter's
traffic answered that adapter's tokens; vLLM PR 48421, open, reports the same). Its rows' inputs
are zeroed before the gather, so their delta is zero, whatever slot the clamped index reads.

Runs in vLLM's processes only; imports nothing of ours."""

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


# the CPU LoRA ops that gather adapters by token index, and where they are looked up by name
_NO_LORA_OPS = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")
_LORA_OPS_HOLDERS = ("vllm.lora.ops.torch_ops.lora_ops", "vllm.lora.ops.torch_ops", "vllm.lora.punica_wrapper.punica_cpu")


def without_adapter_rows(op):
    """``op`` (inputs, stacked weights, output, token indices, ...) with the tokens of index -1
    (no adapter) given a zero delta instead of the last slot's."""

    def skipping_no_lora_tokens(inputs, weights, output, indices, *args, **kwargs):
        none = indices < 0
        if bool(none.any()):
            inputs = inputs.masked_fill(none.unsqueeze(-1), 0)
            indices = indices.clamp(min=0)
        return op(inputs, weights, output, indices, *args, **kwargs)

    setattr(skipping_no_lora_tokens, _MARK, True)
    return skipping_no_lora_tokens


def _mask_no_lora_tokens() -> None:
    import vllm.lora.ops.torch_ops  # noqa: F401  (the package and its lora_ops module)

    for name in _NO_LORA_OPS:
        original = getattr(sys.modules[_LORA_OPS_HOLDERS[0]], name)
        if getattr(original, _MARK, False):
            continue
        wrapped = without_adapter_rows(original)
        for holder in _LORA_OPS_HOLDERS:  # lora_ops' own sgmv_* find the wrapped one there too
            module = sys.modules.get(holder)
            if module is not None and getattr(module, name, None) is original:
                setattr(module, name, wrapped)


def register() -> None:
    """vLLM calls this once per process (and may call it again: it is idempotent)."""
    from vllm.model_executor.model_loader.reload import layerwise

    _mask_no_lora_tokens()

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

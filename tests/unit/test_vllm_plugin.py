"""The LM-head re-tie is a vLLM general plugin, not an edit of site-packages: declared as an
entry point vLLM loads in every process, and wrapping the reload where vLLM looks it up.
(That the re-tie is right is the full-swap integration tests' job: a real reload, real tokens.)"""

from importlib.metadata import entry_points

from deploy.engine import patches, vllm_plugin


def test_the_plugin_is_an_entry_point_vllm_loads():
    found = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert found.get("flywheel_retie_head") == "deploy.engine.vllm_plugin:register"


def test_registering_wraps_the_layerwise_reload_once_wherever_vllm_looks_it_up():
    from vllm.model_executor.model_loader import reload
    from vllm.model_executor.model_loader.reload import layerwise

    vllm_plugin.register()
    wrapped = layerwise.finalize_layerwise_reload
    assert getattr(wrapped, vllm_plugin._MARK, False) and reload.finalize_layerwise_reload is wrapped
    vllm_plugin.register()  # vLLM may load plugins more than once in a process
    assert layerwise.finalize_layerwise_reload is wrapped


def test_site_packages_carry_no_retie_edit():
    path = patches._module_file("vllm.model_executor.model_loader.reload.layerwise")
    assert "flywheel: re-tie" not in path.read_text()


def test_a_token_without_an_adapter_gets_no_delta_from_the_last_slot():
    """vLLM's CPU LoRA ops gather the stacked adapters by token index, and -1 (no adapter) read
    the last slot: a base request batched beside an adapter's got that adapter (vLLM PR 48421)."""
    import torch
    from vllm.lora.ops import torch_ops
    from vllm.lora.ops.torch_ops import lora_ops

    vllm_plugin.register()
    torch.manual_seed(0)
    a, b = torch.randn(2, 4, 8), torch.randn(2, 6, 4)  # 2 slots: shrink 8 -> 4, expand 4 -> 6
    x, indices = torch.randn(4, 8), torch.tensor([0, -1, 1, -1])
    no_lora = indices < 0

    shrunk = torch.zeros(4, 4)
    torch_ops.bgmv_shrink(x, a, shrunk, indices, 1.0)
    assert torch.equal(shrunk[no_lora], torch.zeros(2, 4))
    assert torch.allclose(shrunk[0], a[0] @ x[0]) and torch.allclose(shrunk[2], a[1] @ x[2])

    base = torch.randn(4, 6)  # the base layer's output the deltas are added to
    expanded = base.clone()
    torch_ops.bgmv_expand(shrunk, b, expanded, indices, add_inputs=True)
    assert torch.equal(expanded[no_lora], base[no_lora])
    assert torch.allclose(expanded[2], base[2] + b[1] @ shrunk[2])

    sliced = base.clone()
    torch_ops.bgmv_expand_slice(shrunk, b[:, :3], sliced, indices, 3, 3, add_inputs=True)
    assert torch.equal(sliced[no_lora], base[no_lora])
    # a prefill's ops (sgmv_*) explode the per-sequence indices and call the same, wrapped, ops
    prefill = base.clone()
    lora_ops.sgmv_expand(shrunk, b, prefill, torch.tensor([0, 2]), torch.tensor([2, 2]), torch.tensor([-1, 1]), 2, 2, 4, True)
    assert torch.equal(prefill[:2], base[:2]) and not torch.equal(prefill[2:], base[2:])

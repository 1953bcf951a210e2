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

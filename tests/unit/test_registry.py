import pytest

from feedback.registry import BASE, Registry, RegistryError


def test_lineage_promotion_and_rollback_history(tmp_path):
    reg = Registry(tmp_path / "ckpts.json")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    reg.register("v1", "lora", tmp_path / "a", "base-model", dataset={"content_hash": "abc", "rows": 3})
    reg.register("v2", "lora", tmp_path / "b", "base-model", parent="v1")
    assert reg.get("v2").parent == "v1" and reg.get("v1").dataset["content_hash"] == "abc"
    assert reg.current("tiny") == BASE
    reg.promote("tiny", "v1")
    reg.promote("tiny", "v2")
    assert reg.current("tiny") == "v2" and reg.previous("tiny") == "v1"
    reg.pop("tiny")
    assert reg.current("tiny") == "v1" and reg.previous("tiny") == BASE


def test_bad_registrations_are_refused(tmp_path):
    reg = Registry(tmp_path / "ckpts.json")
    (tmp_path / "a").mkdir()
    with pytest.raises(RegistryError, match="not a directory"):
        reg.register("v1", "lora", tmp_path / "missing", "m")
    with pytest.raises(RegistryError, match="kind"):
        reg.register("v1", "qlora", tmp_path / "a", "m")
    with pytest.raises(RegistryError, match="parent"):
        reg.register("v1", "lora", tmp_path / "a", "m", parent="nope")
    reg.register("v1", "lora", tmp_path / "a", "m")
    with pytest.raises(RegistryError, match="already"):
        reg.register("v1", "lora", tmp_path / "a", "m")
    with pytest.raises(RegistryError, match="never been moved"):
        reg.previous("tiny")

"""The GB200 NVL72 manifests render from the profile and validate offline; the validator refuses
what a cluster would refuse (unknown fields, wrong types, flags Dynamo or vLLM do not have)."""

import copy
from pathlib import Path

import pytest
import yaml

from deploy.stack.config import load_config
from deploy.cluster.manifest_check import validate
from deploy.cluster.manifests import render, to_yaml, total_gpus

RENDERED = Path(__file__).parents[2] / "deploy" / "cluster" / "k8s" / "gb200-nvl72.yaml"


@pytest.fixture(scope="module")
def cfg():
    return load_config("gb200-nvl72", environ={})


@pytest.fixture(scope="module")
def docs(cfg):
    return render(cfg)


def graph(docs):
    return next(d for d in docs if d["kind"] == "DynamoGraphDeployment")


def args_of(svc):
    a = svc["extraPodSpec"]["mainContainer"]["args"]
    return {k: v for k, v in zip(a, a[1:] + [""]) if k.startswith("--")}


def test_the_profile_renders_valid_manifests_identical_to_the_committed_ones(cfg, docs):
    assert validate(docs) == []
    assert RENDERED.read_text() == to_yaml(docs, cfg), "run: flywheel manifests --out deploy/cluster/k8s/gb200-nvl72.yaml"
    assert list(yaml.safe_load_all(RENDERED.read_text())) == docs


def test_the_graph_is_the_rack_the_issue_describes(cfg, docs):
    services = graph(docs)["spec"]["services"]
    prefill, decode = services["VllmPrefillWorker"], services["VllmDecodeWorker"]
    assert (prefill["replicas"], decode["replicas"]) == (3, 12)  # P:D 1:4
    assert total_gpus(cfg.cluster) == 72
    p, d = args_of(prefill), args_of(decode)
    assert p["--data-parallel-size"] == "8" and "--enable-expert-parallel" in p and prefill["multinode"]["nodeCount"] == 2
    assert d["--tensor-parallel-size"] == "4" and "multinode" not in decode
    assert p["--max-num-batched-tokens"] == "4096"  # per GPU: every DEP rank schedules alone
    assert p["--disaggregation-mode"] == "prefill" and d["--disaggregation-mode"] == "decode"
    for svc, a in ((prefill, p), (decode, d)):
        assert a["--kv-cache-dtype"] == "nvfp4_ds_mla"
        assert {"name": "VLLM_KV_CACHE_LAYOUT", "value": "BLHNC"} in svc["envs"]
        assert "NixlConnector" in a["--kv-transfer-config"] and "MooncakeStoreConnector" in a["--kv-transfer-config"]
    domain = next(d for d in docs if d["kind"] == "ComputeDomain")
    assert domain["spec"]["numNodes"] == 3 * 2 + 12
    assert "--router-session-affinity-ttl-secs" in args_of(services["Frontend"])


@pytest.mark.parametrize(
    "breakage, expected",
    [
        (lambda g, docs: g["spec"]["services"]["VllmDecodeWorker"].update(replica=3), "'replica' was unexpected"),
        (lambda g, docs: g["spec"]["services"]["Frontend"].update(componentType="gateway"), "'gateway' is not one of"),
        (lambda g, docs: g["spec"]["services"]["VllmPrefillWorker"]["multinode"].update(nodeCount=1), "less than the minimum"),
        (
            lambda g, docs: g["spec"]["services"]["VllmDecodeWorker"]["extraPodSpec"]["mainContainer"].update(imagePull="x"),
            "'imagePull' was unexpected",
        ),
        (
            lambda g, docs: g["spec"]["services"]["VllmDecodeWorker"]["extraPodSpec"]["mainContainer"]["args"].extend(
                ["--kv-cache-dtype", "nvfp5"]
            ),
            "invalid choice: 'nvfp5'",
        ),
        (
            lambda g, docs: g["spec"]["services"]["VllmDecodeWorker"]["extraPodSpec"]["mainContainer"]["args"].append(
                "--kv-cache-layout"
            ),
            "unrecognized arguments",
        ),
        (
            lambda g, docs: g["spec"]["services"]["Frontend"]["extraPodSpec"]["mainContainer"]["args"].extend(
                ["--router-mode", "fastest"]
            ),
            "invalid choice: 'fastest'",
        ),
        (lambda g, docs: docs[1]["spec"].update(replicas="one"), "'one' is not of type"),
        (lambda g, docs: docs[3]["data"].update({"mooncake.json": '{"global_segment_size": 0}'}), "global_segment_size > 0"),
    ],
)
def test_the_validator_refuses_what_a_cluster_would_refuse(docs, breakage, expected):
    broken = copy.deepcopy(docs)
    breakage(graph(broken), broken)
    errors = validate(broken)
    assert any(expected in e for e in errors), errors


def test_shapes_the_rack_cannot_hold_are_refused_before_rendering():
    with pytest.raises(ValueError, match="104 GPUs requested"):
        render(load_config("gb200-nvl72", ["cluster.decode.replicas=20"], environ={}))
    with pytest.raises(ValueError, match="whole 4-GPU nodes"):
        render(load_config("gb200-nvl72", ["cluster.prefill.gpus=6"], environ={}))


def test_each_dedicated_deployment_is_a_graph_of_its_own_that_validates(cfg, tmp_path):
    """`flywheel manifests` renders the gateway's desired state: one DynamoGraphDeployment per
    live dedicated deployment, its replicas, its checkpoint, its team's name on it."""
    import json

    from typer.testing import CliRunner

    from deploy.cli.main import app

    def dep(dep_id, version, replicas, status="RUNNING", lora=None):
        return {
            "id": dep_id,
            "team": "red",
            "served_model": f"red/{version}",
            "checkpoint_version": version,
            "model_path": f"/checkpoints/{version}",
            "lora_path": lora,
            "replicas": {"desired": replicas},
            "status": status,
        }

    state = {
        "dep-00000000000a": dep("dep-00000000000a", "v3", 3),
        "dep-00000000000b": dep("dep-00000000000b", "l1", 1, lora="/checkpoints/l1"),
        "dep-00000000000c": dep("dep-00000000000c", "base", 2),
        "dep-00000000000d": dep("dep-00000000000d", "v2", 1, status="DELETING"),
    }
    path = tmp_path / "deployments.json"
    path.write_text(json.dumps(state))
    out = tmp_path / "all.yaml"
    result = CliRunner().invoke(app, ["manifests", "--dedicated", str(path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    docs = list(yaml.safe_load_all(out.read_text()))
    assert validate(docs) == []
    name = cfg.cluster.name
    graphs = {d["metadata"]["name"].removeprefix(name): d for d in docs if d["kind"] == "DynamoGraphDeployment"}
    assert set(graphs) == {"", "-dep-00000000000a", "-dep-00000000000b", "-dep-00000000000c"}  # not the deleting one
    full = graphs["-dep-00000000000a"]
    worker = full["spec"]["services"]["VllmWorker"]
    args = args_of(worker)
    assert worker["replicas"] == 3 and full["metadata"]["labels"]["flywheel/team"] == "red"
    assert args["--model"] == "/checkpoints/v3" and args["--served-model-name"] == "red/v3"
    assert "--disaggregation-mode" not in args and "--kv-transfer-config" not in args
    lora = graphs["-dep-00000000000b"]
    assert args_of(lora["spec"]["services"]["VllmWorker"])["--model"] == cfg.cluster.model
    assert lora["metadata"]["annotations"]["flywheel/lora-path"] == "/checkpoints/l1"
    assert args_of(graphs["-dep-00000000000c"]["spec"]["services"]["VllmWorker"])["--model"] == cfg.cluster.model
    missing = CliRunner().invoke(app, ["manifests", "--dedicated", str(tmp_path / "none.json")])
    assert missing.exit_code == 2 and "no such file" in missing.output

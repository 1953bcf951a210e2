"""Offline validation of rendered cluster manifests, without a cluster.

- Built-in kinds (Deployment, Service, ConfigMap) and every Kubernetes object embedded in the
  Dynamo graph (the pod spec, its main container, env vars) against Kubernetes' own OpenAPI
  schemas in strict mode (unknown fields are errors, as `kubectl apply` makes them), from the
  `kubernetes-validate` package.
- DynamoGraphDeployment and ComputeDomain against schemas written here from the Dynamo operator's
  CRD (nvidia.com/v1alpha1; ai-dynamo/dynamo deploy/operator/api/v1alpha1) and the NVIDIA DRA
  driver's ComputeDomain: the fields we use, their types, enums and bounds; unknown fields refused.
- The worker and frontend command lines through Dynamo's and vLLM's own argument parsers (so a
  misspelt flag or an unsupported --kv-cache-dtype fails here), the KV connector config through
  vLLM's KVTransferConfig and connector registry, the Mooncake store config through vLLM's reader.
"""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
from functools import lru_cache

import jsonschema
from referencing import Registry, Resource

K8S_VERSION = "1.37.0"
_str_map = {"type": "object", "additionalProperties": {"type": "string"}}
_quantities = {
    "type": "object",
    "additionalProperties": False,
    "properties": {k: {"type": "string"} for k in ("cpu", "memory", "gpu", "gpuType")} | {"custom": _str_map},
}
_meta = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63},
        "namespace": {"type": "string"},
        "labels": _str_map,
        "annotations": _str_map,
    },
}

SERVICE_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "componentType": {"enum": ["frontend", "worker", "prefill", "decode", "planner", "epp", "default"]},
        "subComponentType": {"type": "string"},
        "replicas": {"type": "integer", "minimum": 0},
        "multinode": {
            "type": "object",
            "required": ["nodeCount"],
            "additionalProperties": False,
            "properties": {"nodeCount": {"type": "integer", "minimum": 2}},
        },
        "resources": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "requests": _quantities,
                "limits": _quantities,
                "claims": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name"],
                        "additionalProperties": False,
                        "properties": {"name": {"type": "string"}, "request": {"type": "string"}},
                    },
                },
            },
        },
        "envs": {"type": "array"},
        "envFromSecret": {"type": "string"},
        "sharedMemory": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"disabled": {"type": "boolean"}, "size": {"type": ["string", "integer"]}},
        },
        "volumeMounts": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string"},
                    "mountPoint": {"type": "string"},
                    "useAsCompilationCache": {"type": "boolean"},
                },
            },
        },
        "extraPodSpec": {"type": "object"},
        "extraPodMetadata": {"type": "object"},
        "annotations": _str_map,
        "labels": _str_map,
        "dynamoNamespace": {"type": "string"},
        "globalDynamoNamespace": {"type": "boolean"},
    },
}
DGD_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "nvidia.com/v1alpha1"},
        "kind": {"const": "DynamoGraphDeployment"},
        "metadata": _meta,
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "backendFramework": {"enum": ["sglang", "vllm", "trtllm"]},
                "envs": {"type": "array"},
                "services": {"type": "object", "maxProperties": 25, "additionalProperties": SERVICE_SCHEMA},
            },
        },
    },
}
COMPUTE_DOMAIN_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "resource.nvidia.com/v1beta1"},
        "kind": {"const": "ComputeDomain"},
        "metadata": _meta,
        "spec": {
            "type": "object",
            "required": ["channel"],
            "additionalProperties": False,
            "properties": {
                "numNodes": {"type": "integer", "minimum": 0},
                "channel": {
                    "type": "object",
                    "required": ["resourceClaimTemplate"],
                    "additionalProperties": False,
                    "properties": {
                        "resourceClaimTemplate": {
                            "type": "object",
                            "required": ["name"],
                            "additionalProperties": False,
                            "properties": {"name": {"type": "string"}},
                        }
                    },
                },
            },
        },
    },
}
OWN_SCHEMAS = {"DynamoGraphDeployment": DGD_SCHEMA, "ComputeDomain": COMPUTE_DOMAIN_SCHEMA}


def _errors(validator, obj, where: str) -> list[str]:
    return [
        f"{where}.{'.'.join(map(str, e.absolute_path))}: {e.message}".replace("..", ".").rstrip(".")
        for e in validator.iter_errors(obj)
    ]


@lru_cache
def _k8s_validator(filename: str):
    import kubernetes_validate.utils as kv

    folder = f"kubernetes-json-schema/v{K8S_VERSION}-local-strict"
    schema = kv.schema_contents(f"{folder}/{filename}", K8S_VERSION)
    defs = kv.schema_contents(f"{folder}/_definitions.json", K8S_VERSION)
    registry = Resource.from_contents(defs) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


def k8s_errors(kind_file: str, obj: dict, where: str) -> list[str]:
    """``kind_file`` names a schema of the bundle, e.g. ``container-v1.json``."""
    return _errors(_k8s_validator(kind_file), obj, where)


def builtin_errors(doc: dict) -> list[str]:
    group = doc["apiVersion"].split("/")[0] if "/" in doc["apiVersion"] else ""
    suffix = f"-{group.split('.')[0]}" if group else ""
    version = doc["apiVersion"].split("/")[-1]
    return k8s_errors(f"{doc['kind'].lower()}{suffix}-{version}.json", doc, doc["kind"])


def _parse_errors(parse, args: list[str], where: str) -> list[str]:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parse(args)
    except SystemExit:  # argparse exits 2 after printing usage and the reason
        reason = [line for line in err.getvalue().splitlines() if "error:" in line] or [err.getvalue()[-300:]]
        return [f"{where}: {reason[-1].split('error:', 1)[-1].strip()}"]
    except (ValueError, TypeError) as exc:
        return [f"{where}: {exc}"]
    return []


def _worker_parse(args: list[str]) -> None:
    # The worker's own split of Dynamo and vLLM flags (vLLM turns --kv-transfer-config into its
    # KVTransferConfig); the engine config itself needs the model's files, so it is not built here.
    from dynamo.vllm.args import _parse_cli_args

    _, vllm_args = _parse_cli_args(args)
    if vllm_args.kv_transfer_config is not None:
        connectors_known(vllm_args.kv_transfer_config)


def connectors_known(config) -> None:
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    nested = (config.kv_connector_extra_config or {}).get("connectors", [])
    for name in [config.kv_connector, *(c.get("kv_connector") for c in nested)]:
        if name not in KVConnectorFactory._registry:
            raise ValueError(f"unknown KV connector {name!r}")


def _frontend_parse(args: list[str]) -> None:
    import argparse
    from dynamo.frontend.frontend_args import FrontendArgGroup, FrontendConfig

    parser = argparse.ArgumentParser(prog="dynamo.frontend")
    FrontendArgGroup().add_arguments(parser)
    FrontendConfig.from_cli_args(parser.parse_args(args)).validate()


def service_errors(name: str, svc: dict) -> list[str]:
    where = f"DynamoGraphDeployment.spec.services.{name}"
    pod = dict(svc.get("extraPodSpec", {}))
    main = pod.pop("mainContainer", None)
    errs = k8s_errors("podspec-v1.json", {"containers": [], **pod}, f"{where}.extraPodSpec")
    for i, env in enumerate(svc.get("envs", [])):
        errs += k8s_errors("envvar-v1.json", env, f"{where}.envs[{i}]")
    if main is None:
        return errs + [f"{where}: no extraPodSpec.mainContainer"]
    errs += k8s_errors("container-v1.json", {"name": "main", **main}, f"{where}.extraPodSpec.mainContainer")
    module = (main.get("command") or [None, None, None])[2]
    parse = {"dynamo.vllm": _worker_parse, "dynamo.frontend": _frontend_parse}.get(module)
    if parse is None:
        return errs + [f"{where}: command {main.get('command')} is not a Dynamo component this check knows"]
    return errs + _parse_errors(parse, main.get("args", []), f"{where} {module}")


def mooncake_errors(doc: dict) -> list[str]:
    from vllm.distributed.mooncake_store import MooncakeStoreConfig

    out = []
    for key, text in doc.get("data", {}).items():
        if key.startswith("mooncake"):
            with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
                f.write(text)
                f.flush()
                try:
                    cfg = MooncakeStoreConfig.from_file(f.name)
                except (ValueError, TypeError, json.JSONDecodeError) as exc:
                    out.append(f"ConfigMap {doc['metadata']['name']}/{key}: {exc}")
                    continue
            if not (cfg.master_server_address and cfg.metadata_server):
                out.append(f"ConfigMap {doc['metadata']['name']}/{key}: no master or metadata server")
    return out


def validate(docs: list[dict]) -> list[str]:
    """Every problem found, as readable lines; empty when the manifests are valid."""
    errs: list[str] = []
    for doc in docs:
        kind = doc.get("kind")
        if kind in OWN_SCHEMAS:
            errs += _errors(jsonschema.Draft202012Validator(OWN_SCHEMAS[kind]), doc, kind)
            if kind == "DynamoGraphDeployment" and isinstance(doc.get("spec", {}).get("services"), dict):
                for name, svc in doc["spec"]["services"].items():
                    errs += service_errors(name, svc)
        else:
            errs += builtin_errors(doc)
            if kind == "ConfigMap":
                errs += mooncake_errors(doc)
    return errs

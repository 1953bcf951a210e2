"""Request bodies in ``/openapi.json``: the routes parse their raw bodies themselves (so every
error keeps the OpenAI shape and unknown OpenAI fields pass through), and declare here the
pydantic model that parsing enforces, so clients' generators and fuzzers see what a route takes.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, TypeAdapter

_REF = "#/components/schemas/{model}"
_DEFS: dict[str, Any] = {}  # every model named by a body schema, for components.schemas


def json_body(*models: type[BaseModel]) -> dict:
    """``openapi_extra`` for a route whose JSON body is one of ``models``."""
    schemas = []
    for model in models:
        schema = TypeAdapter(model).json_schema(ref_template=_REF)
        _DEFS.update(schema.pop("$defs", {}))
        _DEFS[model.__name__] = schema
        schemas.append({"$ref": _REF.format(model=model.__name__)})
    body = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": body}}}}


def install(app: FastAPI) -> None:
    """Add the body models to the document FastAPI generates."""
    generate = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            doc = generate()
            doc.setdefault("components", {}).setdefault("schemas", {}).update(_DEFS)
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi

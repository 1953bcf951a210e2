"""The grammar an engine enforces for a request's tools (xgrammar structural tags -> EBNF).

The structural tag describes the GLM tool-call format, in either layout:
``glm47`` writes ``<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>``
inline; ``glm45`` puts a newline between the parts. Only declared names can follow
``<tool_call>``, and each tool's arguments follow its (bounded) JSON Schema in GLM's XML style
(values of string-only arguments raw, everything else JSON: ``serve.tools.arg_values``).
``tool_choice``: ``auto`` allows text and calls, ``required`` allows only calls (at least one),
a named choice allows only that tool, ``none`` allows text with no tool-call markup at all;
``parallel_tool_calls: false`` stops after the first call. Dynamo passes EBNF to vLLM as
``guided_grammar`` (it rejects a structural-tag ``response_format``), so the tag is compiled to
EBNF here, once per distinct tool set.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Literal

from serve.tools.definitions import ToolRequest

MARKUP = ["<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"]
Layout = Literal["glm47", "glm45"]


def structural_tag(req: ToolRequest, layout: Layout = "glm47") -> dict:
    from xgrammar.structural_tag import (
        AnyTextFormat,
        JSONSchemaFormat,
        OrFormat,
        StructuralTag,
        TagFormat,
        TagsWithSeparatorFormat,
        TriggeredTagsFormat,
    )

    newline = "\n" if layout == "glm45" else ""
    whitespace = 1  # one separator character at most: weak models otherwise emit whitespace forever

    def tag(tool) -> TagFormat:
        return TagFormat(
            begin=f"<tool_call>{tool.name}{newline}",
            content=JSONSchemaFormat(json_schema=tool.grammar_schema, style="glm_xml", max_whitespace_cnt=whitespace),
            end=f"{newline}</tool_call>" if layout == "glm45" else "</tool_call>",
        )

    if req.choice == "none":
        fmt = AnyTextFormat(excludes=MARKUP)
    elif req.choice in ("named", "required"):
        tags = [tag(req.by_name()[req.named])] if req.choice == "named" else [tag(t) for t in req.tools]
        if req.parallel:
            fmt = TagsWithSeparatorFormat(tags=tags, separator=newline, at_least_one=True)
        else:  # exactly one call (stop_after_first does not end the grammar by itself)
            fmt = tags[0] if len(tags) == 1 else OrFormat(elements=tags)
    else:
        fmt = TriggeredTagsFormat(
            triggers=["<tool_call>"], tags=[tag(t) for t in req.tools], excludes=MARKUP[1:], stop_after_first=not req.parallel
        )
    return StructuralTag(format=fmt).model_dump(mode="json")


class _Grammars:
    """Compiled grammars by their structural tag, the least recently used dropped past
    ``max_chars`` in all (a count alone would let 512 grammars of large tool sets take GBs)."""

    def __init__(self, max_chars: int = 64 << 20):
        self.max_chars, self.chars = max_chars, 0
        self._lock, self._by_tag = threading.Lock(), OrderedDict()

    def get(self, tag_json: str) -> str:
        with self._lock:
            ebnf = self._by_tag.get(tag_json)
            if ebnf is not None:
                self._by_tag.move_to_end(tag_json)
                return ebnf
        import xgrammar as xgr

        ebnf = str(xgr.Grammar.from_structural_tag(tag_json))
        with self._lock:
            if tag_json not in self._by_tag:
                self._by_tag[tag_json] = ebnf
                self.chars += len(tag_json) + len(ebnf)
            while self.chars > self.max_chars and len(self._by_tag) > 1:
                old_tag, old = self._by_tag.popitem(last=False)
                self.chars -= len(old_tag) + len(old)
        return ebnf


GRAMMARS = _Grammars()


def load_compiler() -> None:
    """Import xgrammar ahead of the first request with tools. Its import pulls in torch and
    transformers (~3 s, much of it in C that holds the GIL), which would otherwise stall every
    stream on the gateway the first time any team sends tools."""
    import xgrammar  # noqa: F401


def grammar_for(req: ToolRequest, layout: Layout = "glm47") -> str:
    """EBNF for ``guided_grammar``; cached per distinct tools / choice / layout."""
    return GRAMMARS.get(json.dumps(structural_tag(req, layout), sort_keys=True))

"""Numerics with no serving logic (NVFP4 KV quantisation, sparse-MLA decode, KV layouts).

Importable without a GPU. Named like PyPI's unrelated ``kernels`` package; transformers probes
for that one by distribution metadata, which ours does not provide (tests/unit/test_packaging.py).
"""

"""Tool calls that never break: request checks, the grammar the engine enforces, the GLM parser,
and validation of every call returned."""

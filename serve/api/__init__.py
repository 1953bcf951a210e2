"""The gateway's own routes, one module-level router per resource: completions (and the hot
path's entry), models, status (health, metrics, usage) and admin (aliases, deployments, and the
engine's admin routes in ``serve.engine_admin`` and ``serve.weights``). The routers of the trace
SQL, feedback and Batch APIs live beside the parts they serve; ``serve.app`` includes them all."""

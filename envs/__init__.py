"""verifiers environments and the rollout runner; they reach the platform only over HTTP."""

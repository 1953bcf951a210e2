"""The process side of a blue-green deploy (feedback/hotswap.py moves the aliases between them).

``start_beside`` starts the other slot's deployment (deploy/stack/slots.py) on a checkpoint, beside the
serving one, and waits until its frontend lists the model. ``retire`` makes that slot the stack's
(recorded in ``run/deployment.json``), hands supervision over to it, and stops the old slot's
processes: the supervisor is stopped first so it does not restart them, then started again on
the new slot.
"""

from __future__ import annotations

from deploy.stack.config import StackConfig
from deploy.stack.dynamo_graph import deployment_components
from deploy.stack.launcher import console, start_components, supervisor_component
from deploy.stack.processes import ProcessManager
from deploy.stack.slots import SlotState, for_slot, write_state
from deploy.stack.run_state import stack_lock


class BlueGreen:
    def __init__(self, cfg: StackConfig):
        self.blue, self.green = cfg, None

    def start_beside(self, model_dir: str | None) -> str:
        """Start the other slot on ``model_dir`` (None: the profile's model); its deployment name."""
        self.green = for_slot(self.blue, 1 - self.blue.slot, model_dir)
        console.print(f"starting {self.green.deployment_name} on {self.green.serving_model_path}")
        with stack_lock(self.blue.run_dir):
            start_components(self.green, deployment_components(self.green))
        return self.green.deployment_name

    def retire(self, old: str, version: str) -> None:
        """The new slot is the stack's from now on; stop the old one (``old``, already drained)."""
        assert self.green is not None and old == self.blue.deployment_name, (old, self.blue.deployment_name)
        pm = ProcessManager(self.blue.run_dir)
        with stack_lock(self.blue.run_dir):
            write_state(self.blue.run_dir, SlotState(self.green.slot, self.green.serving_model_dir, version))
            pm.stop("supervisor")
            for comp in reversed(deployment_components(self.blue)):
                pm.stop(comp.name)
            if self.blue.supervisor.enabled:
                pm.start(supervisor_component(self.green), boost=False)
        console.print(f"stopped {old}; {self.green.deployment_name} serves {version}")

    def abandon(self, new: str) -> None:
        """Stop the slot :meth:`start_beside` started (the deploy did not go through)."""
        assert self.green is not None and new == self.green.deployment_name
        pm = ProcessManager(self.blue.run_dir)
        for comp in reversed(deployment_components(self.green)):
            pm.stop(comp.name)
        console.print(f"stopped {new}; {self.blue.deployment_name} still serves")

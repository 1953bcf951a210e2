"""The feedback loop's own room: rollouts -> export -> train -> register -> release -> eval.

It is handed a gateway URL and a team key (``loop.target.LoopTarget``) and reaches the stack the
way any client does: rollouts and swaps over HTTP, the trace store by SQL, the registry's file.
It never starts or stops the stack; ``flywheel loop`` (``deploy/cli/loop.py``) does that.
"""

"""Compiled optimizers on pjrt keep their step counters on the device, as on CUDA.

Dynamo traces `optimizer.step()` with `capturable=True` when every parameter of a group
is a CUDA or XPU tensor and the group's state is new (torch/_dynamo/variables/optimizer.py,
`_set_capturable`): the state's `step` counters are then created on the device. For any
other device the group stays non-capturable, its `step` counters are created on the CPU, and
Dynamo's `move_step_if_cpu` moves them to the parameters' device at the *next* group's
`_init_group`, while the step is being traced: the graph then increments the CPU counter it
already read, the optimizer's state holds a new device tensor that is never written, and
from the second step on every group but the last uses a stale step count (a silently
different bias correction in Adam/AdamW). On the CPU `.to("cpu")` is a no-op, so only
accelerators other than CUDA/XPU see it.

The fix is the CUDA behaviour: groups whose parameters are all on pjrt and whose state is
new become capturable, so their counters start on the device and nothing is moved mid-trace.
"""
from __future__ import annotations

import functools


def _new_pjrt_group(group: dict, state) -> bool:
    params = group.get("params", [])
    return ("capturable" in group and bool(params)
            and all(p.device.type == "pjrt" and p not in state for p in params))


def install() -> None:
    """Wrap Dynamo's OptimizerVariable._set_capturable (idempotent)."""
    from torch._dynamo.variables.optimizer import OptimizerVariable

    original = OptimizerVariable._set_capturable
    if getattr(original, "_pjrt", False):
        return

    @functools.wraps(original)
    def _set_capturable(self, tx):
        for group in self.value.param_groups:
            if _new_pjrt_group(group, self.value.state):
                group["capturable"] = True
        return original(self, tx)

    _set_capturable._pjrt = True
    OptimizerVariable._set_capturable = _set_capturable

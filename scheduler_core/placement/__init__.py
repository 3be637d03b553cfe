"""Placement primitives the scheduling path and the simulators share: tasks and workload shapes
(:mod:`~scheduler_core.placement.model`, with the tightest fit on a node's GPUs) and the share policies that
score a task on every node (:mod:`~scheduler_core.placement.policies`)."""

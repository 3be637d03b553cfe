"""Pure scheduling core of eks-gpu-scheduler: numpy and the standard library only.

Subpackages, each answering one question; imports point down this list, never up:

- :mod:`~scheduler_core.k8s`: Kubernetes objects as the scheduler reads them (names, quantities,
  GPU models, the node table, pod demand, annotations, node labels);
- :mod:`~scheduler_core.placement`: placement primitives (tasks, tightest fit, workload shapes) and the
  share policies that score them;
- :mod:`~scheduler_core.scoring`: whole-GPU filter and score, locality, where a share goes;
- :mod:`~scheduler_core.state`: who holds which GPU (cluster state, snapshot, ledger, readings);
- :mod:`~scheduler_core.extender`: the kube-scheduler extender (wire, view, verdicts, preempt, explain);
- :mod:`~scheduler_core.deletion_cost`: pod deletion-cost policies and the scale-down order;
- :mod:`~scheduler_core.simulator`: the trace and locality simulators, their trace readers and synthetic
  clusters; they import the production core above, nothing on the scheduling path imports them.

Entry points are named after what kube-scheduler calls: ``filter_nodes``, ``score_nodes``,
``normalize_scores``; :class:`scheduler_core.extender.Extender` is the wire-level facade every
adapter shares.
"""

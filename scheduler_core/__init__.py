"""Pure scheduling core of eks-gpu-scheduler: numpy and the standard library only.

Subpackages, each answering one question; imports point down this list, never up:

- :mod:`~scheduler_core.k8s`: Kubernetes objects as the scheduler reads them (names, quantities,
  GPU models, the node table, pod demand, annotations, node labels);
- :mod:`~scheduler_core.sharing` (model and policies): the fractional-GPU model and its placement
  policies; its simulators are for measuring, never on the scheduling path;
- :mod:`~scheduler_core.scoring`: whole-GPU filter and score, locality, where a share goes;
- :mod:`~scheduler_core.state`: who holds which GPU (cluster state, snapshot, ledger, readings);
- :mod:`~scheduler_core.extender`: the kube-scheduler extender (wire, view, verdicts, preempt, explain);
- :mod:`~scheduler_core.deletion_cost`: pod deletion-cost policies and the scale-down order.

Entry points are named after what kube-scheduler calls: ``filter_nodes``, ``score_nodes``,
``normalize_scores``; :class:`scheduler_core.extender.Extender` is the wire-level facade every
adapter shares.
"""

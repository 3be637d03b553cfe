"""GPU-sharing placement policies, one module each, behind one interface and one registry.

A policy scores the feasible nodes for a task: ``score(ctx, task, nodes) -> (scores, gpus)``, where
``scores`` are integers (higher is better; the simulator takes the top score and gives ties to the
node that comes first in an order shuffled once per run, as the authors' simulator does: see
:mod:`scheduler_core.simulator.simulate`) and
``gpus`` gives, per node, the GPU a sharing task would take (-1 for other tasks, which take
:func:`scheduler_core.placement.model.whole_gpus`). The six published policies follow ``FGD_NOTES.md``
sections 5-6 exactly, integer flooring included; ``fgd_cpu`` is ours.

Each policy is declared once, in :data:`_POLICIES`: its scorer, and what the extender needs to know
to run it (:class:`Policy`). Adding one is a module with a ``score`` function and a line there; the
extender runs it as :class:`scheduler_core.scoring.policy.SharePolicy` when the line says
``extender=True``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from scheduler_core.placement.model import Task
from scheduler_core.placement.policies import bestfit, dotprod, fgd, fgd_cpu, gpu_clustering, gpu_packing, random
from scheduler_core.placement.policies.base import Context, Scorer, Scores
from scheduler_core.placement.policies.memo import ScoreMemo


@dataclass(frozen=True)
class Policy:
    """A placement policy as declared: its scorer, and what the extender needs to run it.

    Attributes
    ----------
    score : Scorer
        The policy itself; calling a :class:`Policy` calls it, so the simulator runs it as any scorer.
    extender : bool
        Offered as the extender's share policy (``SHARE_POLICY``).
    reads_cpu : bool
        Scores against each node's free CPU, GPU model and the typical pod shapes (FGD's inputs); where
        the extender has none of those, ``fallback`` places the pod instead.
    places_all_pods : bool
        Places whole GPUs and pods without GPUs too, on each GPU's free milli; otherwise only shares,
        and whole GPUs go by best fit and pods without GPUs by kube-scheduler's plugins.
    fallback : str
        The policy that places a pod when this one has nothing to score against ("" for none needed).
    per_node : bool
        A node's score depends on that node's row alone (free milli per GPU, free CPU, model) and the
        typical shapes, so it can be kept until the row changes (:mod:`.memo`): FGD's.
    """

    score: Scorer
    extender: bool = False
    reads_cpu: bool = False
    places_all_pods: bool = False
    fallback: str = ""
    per_node: bool = False

    def __call__(self, ctx: Context, task: Task, nodes: npt.NDArray[np.intp]) -> Scores:
        return self.score(ctx, task, nodes)

    def incremental(self) -> Scorer:
        """This policy as a scorer for one run over one cluster whose rows change in place (the
        simulator's): with :attr:`per_node`, each node's score is kept per task shape until its row
        changes (a fresh :class:`~.memo.ScoreMemo` per call of this method); otherwise the policy."""
        if not self.per_node:
            return self
        memo, score = ScoreMemo(), self.score

        def scorer(ctx: Context, task: Task, nodes: npt.NDArray[np.intp]) -> Scores:
            cluster = ctx.cluster

            def inputs(
                positions: npt.NDArray[np.intp],
            ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
                at = nodes[positions]
                return cluster.gpu_left[at], cluster.cpu_left[at], cluster.model_id[at]

            return memo.scores(
                None, task, nodes, cluster.gpu_left.shape[1], inputs,
                lambda positions: score(ctx, task, nodes[positions]),
            )  # fmt: skip

        return scorer


_POLICIES: dict[str, Policy] = {
    "fgd_cpu": Policy(
        fgd_cpu.score, extender=True, reads_cpu=True, places_all_pods=True, fallback="gpu_packing", per_node=True
    ),
    "gpu_packing": Policy(gpu_packing.score, extender=True),
    "bestfit": Policy(bestfit.score, extender=True),
    "dotprod": Policy(dotprod.score, extender=True),
    "fgd": Policy(fgd.score, per_node=True),
    "gpu_clustering": Policy(gpu_clustering.score),
    "random": Policy(random.score),
}
"""Every policy, by name; the extender's first is its default."""

__all__ = ["Context", "Policy", "Scorer", "Scores", "registry"]


def registry() -> dict[str, Policy]:
    """Every policy by name (a new dict each call); each is a :data:`Scorer`."""
    return dict(_POLICIES)

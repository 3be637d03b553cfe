"""GPU-sharing placement policies, one module each, behind one interface.

A policy scores the feasible nodes for a task: ``score(ctx, task, nodes) -> (scores, gpus)``, where
``scores`` are integers (higher is better; the simulator takes the top score and gives ties to the
node that comes first in an order shuffled once per run, as the authors' simulator does: see
:mod:`scheduler_core.sharing.simulate`) and
``gpus`` gives, per node, the GPU a sharing task would take (-1 for other tasks, which take
:func:`scheduler_core.sharing.model.whole_gpus`). The six published policies follow ``FGD_NOTES.md``
sections 5-6 exactly, integer flooring included; ``fgd_cpu`` is ours.
"""

from __future__ import annotations

from scheduler_core.sharing.policies import bestfit, dotprod, fgd, fgd_cpu, gpu_clustering, gpu_packing, random
from scheduler_core.sharing.policies.base import Context, Scorer, Scores

_POLICIES: dict[str, Scorer] = {
    "random": random.score,
    "dotprod": dotprod.score,
    "gpu_clustering": gpu_clustering.score,
    "gpu_packing": gpu_packing.score,
    "bestfit": bestfit.score,
    "fgd": fgd.score,
    "fgd_cpu": fgd_cpu.score,  # ours
}

__all__ = ["Context", "Scorer", "Scores", "registry"]


def registry() -> dict[str, Scorer]:
    """Every policy by name (a new dict each call)."""
    return dict(_POLICIES)

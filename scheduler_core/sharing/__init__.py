"""Fractional GPU sharing: the placement model, its policies, and the trace and locality simulators.

Production code reads :mod:`~scheduler_core.sharing.model` and :mod:`~scheduler_core.sharing.policies`;
the simulators (:mod:`~scheduler_core.sharing.simulate`, :mod:`~scheduler_core.sharing.locality_sim`) are for
measuring placement quality and are never imported on the scheduling path.
"""

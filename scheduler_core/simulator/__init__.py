"""The simulators, for measuring placement quality, never on the scheduling path: the openb trace replay
(:mod:`~scheduler_core.simulator.simulate`, fed by :mod:`~scheduler_core.simulator.traces`), the locality
simulator (:mod:`~scheduler_core.simulator.locality_sim`) and the synthetic clusters of the demo, the
benchmarks and the tests (:mod:`~scheduler_core.simulator.synthetic`). They import the production core; the
core never imports them."""

"""The application layer: each component's settings, its composition from them, and the service that
carries out what the core decides (the reads and writes, the waits, the metrics and logs, the HTTP status
of each answer). The transports only translate: ``lambdas/<name>/handler.py`` for Lambda events and
``gpu-scheduler serve``, ``refresh node-state`` and ``refresh deletion-cost`` on the command line.

- :mod:`~application.extender`: filter, prioritize, bind and preempt (``build()``, ``ExtenderService``,
  ``ExtenderSettings``);
- :mod:`~application.node_state`: the node-state refresher (labels, snapshot, reconciles, reports);
- :mod:`~application.deletion_cost`: the deletion-cost refresher.
"""

"""A GPU share's lifecycle at run time, in one package: what happens to a share from its bind to its
release, and to the pods the product makes for shares.

- :mod:`~shares.binder`: the ``bind`` verb's I/O (the GPU ledger, the reservation pod, the Binding with
  the share's device), with its rollbacks; its writes to a node's ledger item take turns in
  :mod:`~shares.ledger_writes`, its deadline is :mod:`~shares.bind_deadline`'s, and what a failed bind
  answers is :mod:`~shares.bind_answers`';
- :mod:`~shares.reservations`: reservation pods through the API (open by the bind, close by whoever
  releases a GPU's last share, reconcile by the node-state refresher);
- :mod:`~shares.reserve_gpu`: the program a reservation pod runs (which GPU it was given, reported on
  its own pod), shipped to the pods in a ConfigMap;
- :mod:`~shares.placeholders`: the placeholder pods kept for shares that fit nowhere (the node-state
  refresher's job; the bind retires a placeholder a node has room for).

The objects themselves are generated in ``manifests/`` (``reservation.py``, ``placeholder.py``,
``share_env.py``), which this package imports; the ledger's arithmetic is in
:mod:`scheduler_core.state.ledger` and its store in :mod:`adapters.gpu_ledger`.
"""

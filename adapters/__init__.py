"""Adapters between ``scheduler_core`` and the outside world (allocator, snapshot stores, AWS).

Shared by the CLI (``gpu_scheduler``) and the Lambda handlers (``lambdas/``); each sits behind a
small interface that tests can swap.
"""

"""The handlers build their service at import, from the environment, as Lambda does: pytest's doctest
collection would import them with the test process's environment. Their doctests run instead in
``tests/lambdas/extender/test_handler.py``, under a fresh import with a handler's environment."""

collect_ignore_glob = ["*/handler.py"]

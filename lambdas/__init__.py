"""AWS Lambda handlers: one package per function (``lambdas/<name>/handler.py``)."""

"""The CDK app: one construct per unit, one stack that wires them and does every grant (``stack.py``),
and ``app.py``, which reads context and creates the stack."""

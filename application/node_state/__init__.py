"""The node-state refresher's application layer, shared by its Lambda handler and
``gpu-scheduler refresh node-state``."""

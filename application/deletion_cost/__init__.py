"""The deletion-cost refresher's application layer, shared by its Lambda handler and
``gpu-scheduler refresh deletion-cost``."""

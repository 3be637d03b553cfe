"""The consolidator's application layer, shared by its Lambda handler and ``gpu-scheduler consolidate``."""

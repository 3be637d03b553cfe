"""Command line and local server of eks-gpu-scheduler (the adapters around ``scheduler_core``)."""

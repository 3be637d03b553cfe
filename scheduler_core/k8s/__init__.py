"""Kubernetes objects as the scheduler reads them: names, quantities, GPU models, nodes, pods, annotations."""

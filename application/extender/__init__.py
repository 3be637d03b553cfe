"""The kube-scheduler extender's application layer, shared by the Lambda handler and ``gpu-scheduler serve``."""

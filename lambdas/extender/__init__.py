"""The kube-scheduler extender on AWS Lambda, behind a private API Gateway REST API."""

"""The autoscaler's edges: the Prometheus endpoints of inference replicas it scrapes."""

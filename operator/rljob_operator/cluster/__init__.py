"""What talks to the Kubernetes API server: the client, the applier of plans, the watch, the queue, leadership."""

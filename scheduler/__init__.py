"""Gandiva's central scheduler: cluster state in SQL, the gRPC API, the policy and the CLIs."""

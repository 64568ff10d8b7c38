"""Helpers shared by the multi-process, cluster and chaos tests."""

"""Batching: requests of one model merged."""

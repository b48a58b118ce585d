"""Sending: the way to Triton and to the owner."""

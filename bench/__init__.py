"""The benchmark: NVIDIA's SageMaker front end vs serve vs a hand-written proxy (python -m bench)."""

"""``smtriton perf``: load-test a Triton model through SageMaker's contract
(serve, the local endpoint, a real endpoint).

The hot loop only sends pre-built bodies, so the numbers measure the server, and each step reports the
client's own CPU so that a saturated client is named rather than mistaken for a slow server.
"""

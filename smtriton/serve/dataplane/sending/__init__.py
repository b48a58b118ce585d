"""The way to Triton and to the owner, and what happens when Triton is down.

``upstream.py``: the clients for Triton's current ports, each request read and made ready, and sent
(large inputs through shared memory, merged where ``batching/`` may); ``sender.py``: how each kind of
inference goes (stateless, of a sequence, streamed, a body of records); ``waiting.py``: Triton down or
restarting costs a stateless request latency, not its answer (it waits, and is sent again once, on
probation); ``mirror.py``: what the owner told this worker (Triton's state, the MME records, the invokes
in flight); ``owner_link.py``: the questions to the owner; ``sessions.py``: a request's side of its
session.
"""

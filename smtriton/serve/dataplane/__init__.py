"""A front worker's protocol-neutral work (no HTTP here): an inference request from its head to its answer,
in rooms by the life of a request.

- ``plane.py``: ``DataPlane.invoke``, the one call, read as the story of one request; ``request.py``: what
  it takes and gives; ``answers.py``: Triton's answer made SageMaker's;
- ``reading/``: a body read into an inference, once, as Triton will read it;
- ``batching/``: where requests of one model get merged, and Triton's answer split back;
- ``records/``: bodies of several records (batch transform's JSON Lines and CSV rows), a line a record;
- ``sending/``: the way to Triton and to the owner, and what happens when Triton is down.

Each room imports only rooms before it: request, reading, answers, batching, records, sending, plane
(``tests/unit/test_layout.py``).
"""

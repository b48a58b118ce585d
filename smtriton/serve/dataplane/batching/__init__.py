"""Where a request gets merged: requests of one model that a worker holds at the same moment, merged along
the batch dimension into one Triton request, and Triton's answer split back, each client getting the
answer it would have had alone.

``coalescing.py``: when (while the model's earlier requests are with Triton; a body's records among
themselves); ``row_time.py``: while it pays (Triton's execution time per row of the model, from its
statistics); ``rule.py``: which models (from Triton's configuration); ``mergeable.py``: which requests
(every size checked as Triton checks a request alone); ``merging.py``: the merged request, and its answer
split back by ``answer_rows.py`` from Triton's own text and bytes; ``json_text.py``: JSON text walked by
index, its values not built.
"""

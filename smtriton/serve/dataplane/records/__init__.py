"""Bodies of several records, batch transform's mini-batches, answered a line a record, in order.

``multirecord.py``: JSON Lines, one KServe v2 request a line; ``csvrows.py``: ``text/csv`` rows of a
model's one numeric input, their values read by one rule in ``csv_values.py``; ``record_check.py``: each
record checked against its model before any is sent; ``record_answers.py``: the answer written in order,
a bounded window of Triton requests in flight, and what a failed record does.
"""

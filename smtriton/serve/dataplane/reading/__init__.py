"""A request's body read into an inference, once, as Triton will read it.

``body.py``: the body held (whole, or in the pieces a binary request came in), inflated, given back once
read; ``inference.py``: the one reading (:class:`~smtriton.serve.dataplane.reading.inference.Inference`),
what would crash Triton refused; ``codec.py``: content types ⇄ Triton's binary extension;
``transcode.py``: JSON re-encoded binary; ``large_json.py``, ``json_numbers.py``: JSON bodies past 8 MiB
read in slices, the event loop served; ``images.py``: an encoded image made the request it stands for.
"""

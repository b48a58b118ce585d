"""A front worker's HTTP side: the process that answers clients (uvicorn with serve's protocol, the data
routes' fast path and ASGI adapter, the control app), each request one call into the worker's data plane."""

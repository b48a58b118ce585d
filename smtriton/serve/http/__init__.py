"""A front worker's HTTP edge: the process that answers clients (uvicorn with its protocol, the routes,
the control app) over the worker's data plane."""

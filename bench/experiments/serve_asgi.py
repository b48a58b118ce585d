"""``serve`` unchanged, except that the data routes go through uvicorn's stock httptools protocol and
the ASGI app (the path before the protocol-level fast path): the A/B for that change. Same flags as
``serve``."""

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

import smtriton.serve.cli
import smtriton.serve.server

if __name__ == "__main__":
    smtriton.serve.server.data_protocol = lambda routes: HttpToolsProtocol  # type: ignore[assignment,misc]
    smtriton.serve.cli.main()

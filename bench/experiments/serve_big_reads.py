"""``serve`` unchanged, except that uvicorn stops reading a request body only past 4 MiB buffered
instead of 64 KiB: a test of whether its pause/resume round trips cost large bodies (NOTES.md,
"Large bodies"). Same flags as ``serve``."""

import uvicorn.protocols.http.h11_impl
import uvicorn.protocols.http.httptools_impl

import smtriton.serve.cli

if __name__ == "__main__":
    for module in (uvicorn.protocols.http.httptools_impl, uvicorn.protocols.http.h11_impl):
        module.HIGH_WATER_LIMIT = 4 * 1024 * 1024  # type: ignore[attr-defined]
    smtriton.serve.cli.main()

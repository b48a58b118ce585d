"""``serve`` unchanged, except that large JSON requests are not re-encoded binary (the A/B of
serve/dataplane/transcode.py in one run). Same flags as ``serve``."""

import os

import smtriton.serve.owner.cli

if __name__ == "__main__":
    os.environ["SMTRITON_TRANSCODE_JSON_MIN_BYTES"] = "0"
    smtriton.serve.owner.cli.main()

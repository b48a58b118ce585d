"""The options of a batch transform job, the same in `smtriton transform` and `smtriton local-transform`
(:mod:`smtriton.aws.batch_job`): a job tried here takes the flags, and the defaults, of the job on AWS."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from smtriton.aws.batch_job import DEFAULT_CONTENT_TYPE, DEFAULT_INSTANCE_TYPE, DEFAULT_SPLIT_TYPE, MAX_PAYLOAD_MB

# The defaults, for the commands' signatures.
CONTENT_TYPE = DEFAULT_CONTENT_TYPE
SPLIT_TYPE = DEFAULT_SPLIT_TYPE
INSTANCE_TYPE = DEFAULT_INSTANCE_TYPE

ContentTypeOpt = Annotated[
    str,
    typer.Option(
        help="Content type of every request: application/json, application/jsonlines (a KServe v2 request a "
        "line), text/csv (a row a line, for a model with one [batch, n] numeric input) or binary+json"
    ),
]
SplitTypeOpt = Annotated[
    str, typer.Option(help="None: each object (file) is one request; Line: split by line (JSON Lines, CSV)")
]
BatchStrategyOpt = Annotated[
    Optional[str],  # noqa: UP045 - typer needs Optional at runtime on 3.10
    typer.Option(
        help="SingleRecord (a line a request) or MultiRecord (as many lines as fit MaxPayloadInMB) "
        "[default: the container's /execution-parameters answer (serve's: MultiRecord), else SingleRecord]"
    ),
]
AcceptOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(help="Accept of every request: application/jsonlines turns CSV rows' answers into JSON lines"),
]
MaxPayloadOpt = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(help=f"MaxPayloadInMB, 0-{MAX_PAYLOAD_MB} (0: no limit) [default: the container's answer, else 6]"),
]
MaxConcurrentOpt = Annotated[
    Optional[int],  # noqa: UP045
    typer.Option(
        help=f"MaxConcurrentTransforms per instance, times MaxPayloadInMB at most {MAX_PAYLOAD_MB} "
        "[default: the container's answer, else 1]"
    ),
]
InstanceTypeOpt = Annotated[
    str, typer.Option(help="Instance type: one of botocore's TransformInstanceType (no ml.p4d, p5, p6)")
]
KmsKeyOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        help="KMS key (id, ARN or alias) of the output (KmsKeyId) and of the storage volume (VolumeKmsKeyId), "
        "except on local NVMe storage (g4dn, g5, g6, g6e), which the instance encrypts"
    ),
]

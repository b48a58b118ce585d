"""Options more than one `smtriton` command takes, each defined once: its help, metavar and bounds.
A command gives each its own default where they differ (``duration`` of a perf step and of a tune
trial's step, say); the meaning is the same wherever it appears."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

# An AWS call's place and credentials (deploy, invoke, push-image, perf of an endpoint by name).
RegionOpt = Annotated[
    Optional[str],  # noqa: UP045 - typer needs Optional at runtime on 3.10
    typer.Option(help="AWS region [default: $AWS_REGION, else the boto3 session's]"),
]
ProfileOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(help="AWS profile [default: the boto3 session's]"),
]
# Which endpoint and model a request goes to (invoke, perf).
EndpointUrlOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(
        help="SageMaker Runtime API to call instead of AWS's, as the AWS CLI's --endpoint-url "
        "(e.g. smtriton local-endpoint's http://127.0.0.1:8090)"
    ),
]
TargetModelOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(help="Multi-model endpoints: the archive to run (TargetModel), relative to the model data prefix"),
]
# What serve serves (deploy, local-endpoint).
DefaultModelOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(help="SME: SAGEMAKER_TRITON_DEFAULT_MODEL_NAME, when the repository has several models"),
]
# The requests a load generator makes from a model's config, and how it measures them (perf, tune).
ShapeOpt = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Option(
        metavar="NAME=D1,D2", help="An input's shape without the batch dim, for variable (-1) dims [default: 1]"
    ),
]
BatchSizeOpt = Annotated[int, typer.Option(min=1, help="Batch dim of each generated request (batching models)")]
InputSeedOpt = Annotated[int, typer.Option("--seed", help="Seed of the random inputs")]
WarmupOpt = Annotated[float, typer.Option(min=0, help="Seconds of unmeasured load before each step")]
DurationOpt = Annotated[float, typer.Option(min=0.1, help="Measured seconds per step")]

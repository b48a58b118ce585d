"""`smtriton build-image | push-image | deploy | delete-endpoint | invoke`: from the Dockerfile to a live endpoint.

AWS credentials, region and account come from the standard boto3 chain (environment, profile, role);
``AWS_ENDPOINT_URL`` (boto3's own setting) points every client at another endpoint, e.g. a local stack.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from smtriton.aws.docker_image import LABEL_BASE, TARGETS, BuildSpec, SubprocessRunner
from smtriton.cli_options import DefaultModelOpt, EndpointUrlOpt, ProfileOpt, RegionOpt, TargetModelOpt
from smtriton.errors import ToolError

console = Console(stderr=True)

TargetOpt = Annotated[str, typer.Option(help=f"Dockerfile target: {' or '.join(TARGETS)} (CPU-only, no NGC image)")]
BaseOpt = Annotated[
    Optional[str],  # noqa: UP045 - typer needs Optional at runtime on 3.10
    typer.Option(
        help="Base image: BASE_IMAGE of the triton target (NVIDIA's nvcr.io/nvidia/tritonserver:<YY.MM>-py3 by "
        "default; <account>.dkr.ecr.<region>.amazonaws.com/sagemaker-tritonserver:<YY.MM>-py3 for GPU "
        "multi-model endpoints), or CPU_BASE_IMAGE of the cpu target"
    ),
]
PlatformOpt = Annotated[str, typer.Option(help="Target platform ('' for the builder's own)")]
BuildArgOpt = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Option(
        "--build-arg", metavar="KEY=VALUE", help="Passed to docker build (repeatable), e.g. TORCH_VERSION=2.13.0"
    ),
]


def _say(message: str) -> None:
    console.print(escape(message), highlight=False, soft_wrap=True)


def _fail(message: str) -> ToolError:
    """A failure to raise; `smtriton` prints it as one line and exits 1."""
    return ToolError(message)


def _pairs(values: list[str] | None, what: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for value in values or []:
        key, sep, rest = value.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{what} {value!r} is not KEY=VALUE")
        pairs[key] = rest
    return pairs


def parse_input(text: str, default_dtype: str) -> tuple[str, Any]:
    """``NAME=@FILE``, ``NAME=FILE.npy`` or ``NAME=JSON[:DTYPE]`` -> (name, numpy array).

    ``@FILE`` (curl's convention) is the file's bytes as one BYTES element, shape [1, 1]: a batch of one,
    as a batching model with a ``dims: [1]`` BYTES input (an encoded image) takes it. DTYPE is a Triton
    (INT64) or numpy (int64) name and defaults to ``default_dtype``, so each input can have its own."""
    import numpy as np

    from smtriton import dtypes

    name, sep, value = text.partition("=")
    if not sep or not name:
        raise typer.BadParameter(
            f"{text!r}: write NAME=@FILE, NAME=FILE.npy or NAME=JSON[:DTYPE], e.g. ids=[[1,2]]:INT64"
        )
    if value.startswith("@"):
        try:
            return name, np.array([[Path(value[1:]).read_bytes()]], dtype=object)
        except OSError as exc:
            raise typer.BadParameter(f"{text!r}: {exc.strerror or exc}: {value[1:]}") from None
    if value.endswith(".npy"):
        try:
            return name, np.load(value, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise typer.BadParameter(f"{text!r}: {exc}") from None
    dtype = default_dtype
    head, colon, tail = value.rpartition(":")
    if colon and tail and not tail.endswith(("]", "}", '"')):
        value, dtype = head, tail
    try:
        numpy_type = dtypes.numpy_dtype(dtype.upper()) if dtype.upper() in dtypes.TRITON_DTYPES else np.dtype(dtype)
    except (TypeError, ValueError):
        raise typer.BadParameter(f"{text!r}: {dtype!r} is not a dtype (e.g. INT64, FP32, int64, float32)") from None
    try:
        return name, np.asarray(json.loads(value), dtype=numpy_type)
    except ValueError as exc:
        raise typer.BadParameter(f"{text!r}: the value is not a JSON list of numbers ({exc})") from None


def _session(region: str | None, profile: str | None, endpoint_url: str | None = None):
    from smtriton.aws.session import aws_session

    return aws_session(region, profile, endpoint_url)


def _build_spec(tag: str, target: str, base_image: str | None, platform: str, build_arg: list[str] | None) -> BuildSpec:
    if target not in TARGETS:
        raise typer.BadParameter(f"--target must be one of {', '.join(TARGETS)}")
    return BuildSpec(
        tag=tag,
        target=target,
        base_image=base_image,
        platform=platform or None,
        build_args=_pairs(build_arg, "--build-arg"),
    )


def build_image_command(
    tag: Annotated[str, typer.Option(help="Local image name:tag")] = "smtriton:latest",
    target: TargetOpt = "triton",
    base_image: BaseOpt = None,
    platform: PlatformOpt = "linux/amd64",
    build_arg: BuildArgOpt = None,
    dry_run: Annotated[bool, typer.Option(help="Print the docker command instead of running it")] = False,
) -> None:
    """Build the serving image with docker buildx (the Dockerfile at the project root)."""
    from smtriton.aws.docker_image import build_argv, build_image

    spec = _build_spec(tag, target, base_image, platform, build_arg)
    if dry_run:
        print(" ".join(build_argv(spec)))
        return
    build_image(spec, SubprocessRunner())
    print(tag)


def push_image_command(
    repository: Annotated[str, typer.Option(help="ECR repository (created when missing)")] = "smtriton",
    tag: Annotated[str, typer.Option(help="Image tag in the repository")] = "latest",
    target: TargetOpt = "triton",
    base_image: BaseOpt = None,
    platform: PlatformOpt = "linux/amd64",
    build_arg: BuildArgOpt = None,
    no_build: Annotated[
        bool, typer.Option("--no-build", help="Push an image built before (--local-image) instead of building")
    ] = False,
    local_image: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="Local image to push with --no-build [default: smtriton:<tag>]"),
    ] = None,
    region: RegionOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """Build the image, create the ECR repository if missing, log docker in, tag, push; print the image URI."""
    from smtriton.aws.ecr import push_image

    session = _session(region, profile)
    build = None if no_build else _build_spec(f"smtriton:{tag}", target, base_image, platform, build_arg)
    result = push_image(
        session,
        repository,
        tag,
        SubprocessRunner(),
        build=build,
        local_image=local_image or f"smtriton:{tag}",
        progress=_say,
    )
    print(result.image_uri)


ImageOpt = Annotated[str, typer.Option(help="Image URI in ECR (smtriton push-image prints it)")]
RoleOpt = Annotated[str, typer.Option(help="SageMaker execution role ARN (reads the model data and the image)")]
EnvOpt = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Option(
        "--env", metavar="KEY=VALUE", help="Container variable (repeatable), e.g. SAGEMAKER_TRITON_LOG_INFO=false"
    ),
]
TagOpt = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Option("--tag", metavar="KEY=VALUE", help="Extra resource tag (repeatable)"),
]
PollOpt = Annotated[float, typer.Option(help="Seconds between status checks")]
SubnetOpt = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Option("--subnet", metavar="SUBNET_ID", help="VPC subnet (repeatable; with --security-group): VpcConfig"),
]
SecurityGroupOpt = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Option("--security-group", metavar="SG_ID", help="VPC security group (repeatable; with --subnet)"),
]
NetworkIsolationOpt = Annotated[
    bool, typer.Option("--network-isolation", help="No network in or out of the container (EnableNetworkIsolation)")
]
KmsKeyOpt = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(help="KMS key (id, ARN or alias) for the storage volume and every S3 output (KmsKeyId)"),
]


def _hosting(
    subnet: list[str] | None,
    security_group: list[str] | None,
    network_isolation: bool,
    kms_key: str | None,
    model_download_timeout: int | None = None,
    volume_size: int | None = None,
) -> Any:
    from smtriton.aws.hosting import Hosting

    return Hosting(model_download_timeout, volume_size, tuple(subnet or ()), tuple(security_group or ()),
                   network_isolation, kms_key)  # fmt: skip


def deploy_command(
    endpoint_name: Annotated[
        str, typer.Argument(metavar="ENDPOINT", help="Endpoint name (created, or updated in place)")
    ],
    image: ImageOpt,
    role: RoleOpt,
    model_data: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            help="SME: s3://.../model.tar.gz or an S3 prefix/ with the uncompressed repository; "
            "MME: the S3 prefix/ holding the archives"
        ),
    ] = None,
    multi_model: Annotated[bool, typer.Option("--multi-model", help="Multi-model endpoint (Mode: MultiModel)")] = False,
    instance_type: Annotated[str, typer.Option(help="Instance type (ignored for --serverless)")] = "ml.g5.xlarge",
    instance_count: Annotated[int, typer.Option(help="Initial instance count")] = 1,
    inference_ami_version: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            help="InferenceAmiVersion, GPU types only [default: the one with the newest NVIDIA driver, which runs "
            "the image's CUDA; docs/deployment.md has the table]"
        ),
    ] = None,
    env: EnvOpt = None,
    default_model: DefaultModelOpt = None,
    startup_timeout: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(help="ContainerStartupHealthCheckTimeoutInSeconds, 60-3600 (large models load slowly)"),
    ] = None,
    autoscale_max: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(
            help="Attach auto-scaling up to this many instances (target tracking; with --inference-component: "
            "managed instance scaling)"
        ),
    ] = None,
    autoscale_min: Annotated[
        int,
        typer.Option(
            help="Auto-scaling minimum instances (0 for asynchronous endpoints and inference components: scale in "
            "to none)"
        ),
    ] = 1,
    autoscale_target: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option(
            help="Auto-scaling target per instance: invocations per minute (SageMakerVariantInvocationsPerInstance), "
            "or for asynchronous endpoints queued requests (ApproximateBacklogSizePerInstance) [default: 100 / 5]"
        ),
    ] = None,
    remove_autoscaling: Annotated[
        bool,
        typer.Option(
            "--remove-autoscaling",
            help="Deregister the endpoint's auto-scaling (a redeploy otherwise keeps it, and its instance count)",
        ),
    ] = False,
    serverless: Annotated[bool, typer.Option("--serverless", help="Serverless endpoint (CPU, `cpu` image)")] = False,
    serverless_memory: Annotated[int, typer.Option(help="Serverless memory in MB (1024-6144, steps of 1024)")] = 4096,
    serverless_concurrency: Annotated[int, typer.Option(help="Serverless max concurrency (1-200)")] = 10,
    async_output: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="Asynchronous inference: S3 output path (enables async inference)"),
    ] = None,
    async_failure: Annotated[Optional[str], typer.Option(help="Asynchronous inference: S3 failure path")] = None,  # noqa: UP045
    async_concurrency: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(help="Asynchronous inference: max concurrent invocations per instance"),
    ] = None,
    inference_component: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            metavar="COMPONENT",
            help="Deploy the image and model data as this inference component of the endpoint (the endpoint is "
            "made for components when missing; a component that exists is updated)",
        ),
    ] = None,
    copies: Annotated[int, typer.Option(help="Inference component: copies of the model")] = 1,
    accelerators: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option(help="Inference component: accelerators (GPUs) per copy"),
    ] = None,
    memory_mb: Annotated[int, typer.Option(help="Inference component: memory per copy, MB")] = 1024,
    cpu_cores: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option(help="Inference component: CPU cores per copy (the container's CPU quota)"),
    ] = None,
    data_capture: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            metavar="S3_URI",
            help="Capture requests and responses to this S3 location (DataCaptureConfig; `smtriton capture decode` "
            "reads them)",
        ),
    ] = None,
    capture_percent: Annotated[int, typer.Option(help="Share of invocations captured, 0-100")] = 100,
    model_download_timeout: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(help="ModelDataDownloadTimeoutInSeconds, 60-3600 (large model data)"),
    ] = None,
    volume_size: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(help="VolumeSizeInGB of each instance, 1-512 (instance types with EBS volumes)"),
    ] = None,
    subnet: SubnetOpt = None,
    security_group: SecurityGroupOpt = None,
    network_isolation: NetworkIsolationOpt = False,
    kms_key: KmsKeyOpt = None,
    tag: TagOpt = None,
    keep_failed: Annotated[bool, typer.Option(help="Keep a failed new endpoint for inspection")] = False,
    poll: PollOpt = 30.0,
    timeout: Annotated[float, typer.Option(help="Give up waiting after this many seconds")] = 3600.0,
    region: RegionOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """Deploy the image as a single-model or multi-model endpoint, or update the endpoint in place.

    Waits until the endpoint is InService, printing its status. Everything created is tagged
    smtriton:endpoint=<name> so `smtriton delete-endpoint` removes it all. A redeploy keeps an
    auto-scaled endpoint's instance count and scaling, and changes nothing when nothing changed.

    \b
    Examples:
      smtriton deploy demo --image $IMAGE --role $ROLE --model-data s3://bucket/demo/model.tar.gz
      smtriton deploy shared --inference-component encoder --image $IMAGE --role $ROLE \\
          --model-data s3://bucket/encoder/model.tar.gz --accelerators 1 --memory-mb 8192 --cpu-cores 2 --copies 2
      smtriton deploy demo ... --data-capture s3://bucket/capture/ --capture-percent 20 --kms-key alias/ml
    """
    from smtriton.aws.deploy import (
        AsyncInference,
        AutoScaling,
        Aws,
        Component,
        DataCapture,
        EndpointSpec,
        Serverless,
        deploy,
    )
    from smtriton.aws.docker_image import image_labels

    labels = image_labels(SubprocessRunner(), image) or {}
    spec = EndpointSpec(
        name=endpoint_name,
        image=image,
        role_arn=role,
        model_data=model_data,
        multi_model=multi_model,
        instance_type=None if serverless else instance_type,
        instance_count=instance_count,
        environment=_pairs(env, "--env"),
        default_model=default_model,
        serverless=Serverless(serverless_memory, serverless_concurrency) if serverless else None,
        async_inference=AsyncInference(async_output, async_failure, max_concurrent_invocations=async_concurrency)
        if async_output
        else None,
        autoscaling=AutoScaling(autoscale_min, autoscale_max, autoscale_target) if autoscale_max else None,
        remove_autoscaling=remove_autoscaling,
        startup_timeout_s=startup_timeout,
        tags=_pairs(tag, "--tag"),
        base_image=labels.get(LABEL_BASE),
        hosting=_hosting(subnet, security_group, network_isolation, kms_key, model_download_timeout, volume_size),
        data_capture=DataCapture(data_capture, capture_percent) if data_capture else None,
        inference_component=Component(inference_component, copies, accelerators, memory_mb, cpu_cores)
        if inference_component
        else None,
        ami_version=inference_ami_version,
    )
    session = _session(region, profile)
    result = deploy(
        Aws.from_session(session), spec, progress=_say, poll_s=poll, timeout_s=timeout, keep_failed=keep_failed
    )
    verb = "unchanged" if result.unchanged else "updated" if result.updated else "created"
    what = f"inference component [bold]{escape(result.component)}[/] on " if result.component else ""
    console.print(
        f"[green]✓[/] {what}endpoint [bold]{escape(result.endpoint_name)}[/] {verb}: {escape(result.endpoint_arn)}"
    )
    print(result.endpoint_name)


def delete_endpoint_command(
    endpoint_name: Annotated[str, typer.Argument(metavar="ENDPOINT", help="Endpoint to delete")],
    inference_component: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(metavar="COMPONENT", help="Delete only this inference component (and its model)"),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Also delete resources smtriton did not create (no smtriton tag)")
    ] = False,
    poll: PollOpt = 15.0,
    region: RegionOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """Delete an endpoint and everything smtriton created for it: inference components, auto-scaling,
    configurations, models.

    \b
    Examples:
      smtriton delete-endpoint demo
      smtriton delete-endpoint shared --inference-component encoder    # the endpoint stays
    """
    from smtriton.aws.deploy import Aws, delete_endpoint

    session = _session(region, profile)
    removed = delete_endpoint(
        Aws.from_session(session), endpoint_name, force=force, component=inference_component, progress=_say,
        poll_s=poll,
    )  # fmt: skip
    if not removed:
        console.print(f"nothing to delete for {escape(endpoint_name)}")
    for item in removed:
        print(item)


def invoke_command(
    endpoint_name: Annotated[str, typer.Argument(metavar="ENDPOINT", help="Endpoint name")],
    input: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option(
            "--input",
            "-i",
            metavar="NAME=@FILE|NAME=FILE.npy|NAME=JSON[:DTYPE]",
            help="An input (repeatable): @FILE sends the file's bytes as one BYTES element (shape [1, 1], e.g. "
            "image=@cat.jpg), FILE.npy an array, or a JSON list with its own dtype, e.g. ids=[[1,2]]:INT64",
        ),
    ] = None,
    dtype: Annotated[str, typer.Option(help="dtype of JSON inputs that name none (Triton or numpy name)")] = "float32",
    request: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(
            help="A complete KServe v2 JSON request file, sent as is (instead of --input)", exists=True, dir_okay=False
        ),
    ] = None,
    output: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option("--output", "-o", metavar="NAME", help="Output to return (repeatable) [default: all]"),
    ] = None,
    binary: Annotated[bool, typer.Option("--binary/--json", help="binary+json (default) or JSON tensors")] = True,
    target_model: TargetModelOpt = None,
    inference_component: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(metavar="COMPONENT", help="The inference component to run (InferenceComponentName)"),
    ] = None,
    save: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="Write every output to DIR/<name>.npy"),
    ] = None,
    endpoint_url: EndpointUrlOpt = None,
    region: RegionOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """Invoke an endpoint through boto3's sagemaker-runtime; print (and optionally save) the outputs.

    \b
    Examples:
      smtriton invoke demo --input input_ids='[[1,17,42,2]]':INT64 --input attention_mask=mask.npy
      smtriton invoke demo-mme --target-model resnet.tar.gz --input pixel_values=image.npy --save out/
      smtriton invoke shared --inference-component encoder --input input_ids='[[1,2]]':INT64
    """
    import numpy as np
    from botocore.exceptions import BotoCoreError, ClientError

    from smtriton.aws.invoke import JSON, encode_request, invoke_raw

    if (request is None) == (not input):
        raise typer.BadParameter("give --input tensors or one --request file")
    if request is not None:
        body, content_type = request.read_bytes(), JSON
    else:
        arrays = dict(parse_input(text, dtype) for text in input or ())
        try:
            body, content_type = encode_request(arrays, binary=binary, outputs=output)
        except ValueError as exc:  # a tensor JSON cannot carry
            raise typer.BadParameter(str(exc), param_hint="--json") from None
    session = _session(region, profile, endpoint_url)
    try:
        client = session.client("sagemaker-runtime", endpoint_url=endpoint_url)
    except ValueError as exc:  # botocore's refusal of a URL it cannot use
        raise typer.BadParameter(str(exc), param_hint="--endpoint-url") from None
    try:
        result = invoke_raw(
            client, endpoint_name, body, content_type, target_model=target_model, component=inference_component
        )
    except client.exceptions.ModelError as exc:
        response = exc.response
        raise _fail(
            f"the container answered {response.get('OriginalStatusCode')}: {response.get('OriginalMessage')}"
        ) from None
    except ClientError as exc:  # SageMaker's own refusal: no such endpoint, a bad TargetModel, throttling
        error = exc.response.get("Error", {})
        raise _fail(f"{error.get('Code', 'error')}: {error.get('Message', exc)}") from None
    except BotoCoreError as exc:  # no answer at all: a wrong --endpoint-url, no network
        raise _fail(str(exc)) from None
    table = Table(title=f"{result.model_name} (version {result.model_version})", title_justify="left")
    for column in ("output", "dtype", "shape", "values"):
        table.add_column(column)
    for name, array in result.outputs.items():
        preview = np.array2string(array.reshape(-1)[:8], threshold=8, precision=4)
        table.add_row(name, str(array.dtype), str(list(array.shape)), escape(preview))
        if save is not None:
            save.mkdir(parents=True, exist_ok=True)
            np.save(save / f"{name}.npy", array, allow_pickle=array.dtype == object)
    Console().print(table)


def transform_command(
    job_name: Annotated[str, typer.Argument(metavar="JOB", help="Transform job name (unique in the account)")],
    image: ImageOpt,
    role: RoleOpt,
    input: Annotated[str, typer.Option(help="s3:// prefix (or one object) to transform")],
    output: Annotated[str, typer.Option(help="s3:// prefix the results go to (<input object>.out)")],
    model_data: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="s3://.../model.tar.gz or an S3 prefix/ with the uncompressed repository"),
    ] = None,
    default_model: DefaultModelOpt = None,
    content_type: Annotated[
        str,
        typer.Option(
            help="Content type of every request: application/json, application/jsonlines (a KServe v2 request a "
            "line), text/csv (a row a line, for a model with one [batch, n] numeric input) or binary+json"
        ),
    ] = "application/json",
    split_type: Annotated[
        str, typer.Option(help="None: each object is one request; Line: split by line (JSON Lines, CSV)")
    ] = "None",
    batch_strategy: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            help="SingleRecord (a line a request) or MultiRecord (as many lines as fit MaxPayloadInMB) "
            "[default: MultiRecord for JSON Lines and CSV split by line, else SingleRecord]"
        ),
    ] = None,
    accept: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="Accept of every request: application/jsonlines turns CSV rows' answers into JSON lines"),
    ] = None,
    max_payload_mb: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(help="MaxPayloadInMB, 0-100 [default: the container's answer, 6]"),
    ] = None,
    max_concurrent: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(help="MaxConcurrentTransforms per instance [default: the container's answer]"),
    ] = None,
    instance_type: Annotated[str, typer.Option(help="Instance type")] = "ml.g5.xlarge",
    instance_count: Annotated[int, typer.Option(help="Instances")] = 1,
    ami_version: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="TransformAmiVersion, GPU types only [default: the one with the newest NVIDIA driver]"),
    ] = None,
    env: EnvOpt = None,
    subnet: SubnetOpt = None,
    security_group: SecurityGroupOpt = None,
    network_isolation: NetworkIsolationOpt = False,
    kms_key: KmsKeyOpt = None,
    tag: TagOpt = None,
    wait: Annotated[bool, typer.Option("--wait", help="Follow the job to its end (then delete its model)")] = False,
    poll: PollOpt = 30.0,
    region: RegionOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """Run the image over S3 input as a SageMaker batch transform job.

    Creates a model of the image and model data, and the job (a GPU instance type gets the AMI version
    its driver needs); with --wait prints its status until it ends, and a failure's reason in one line.
    Each line of JSON Lines is one KServe v2 request, each line of CSV one row; the answer has a line
    per line. Try the job on this machine first: smtriton local-transform.

    \b
    Examples:
      smtriton transform nightly-2026-01-01 --image $IMAGE --role $ROLE --model-data s3://bucket/demo/model.tar.gz \\
          --input s3://bucket/requests/ --output s3://bucket/results/ --split-type Line \\
          --content-type application/jsonlines --wait
    """
    from smtriton.aws.transform import TransformSpec, run_transform

    spec = TransformSpec(
        name=job_name, image=image, role_arn=role, model_data=model_data, input=input, output=output,
        content_type=content_type, split_type=split_type, batch_strategy=batch_strategy, accept=accept,
        max_payload_mb=max_payload_mb, max_concurrent=max_concurrent, instance_type=instance_type,
        instance_count=instance_count, ami_version=ami_version, environment=_pairs(env, "--env"),
        default_model=default_model, hosting=_hosting(subnet, security_group, network_isolation, kms_key),
        tags=_pairs(tag, "--tag"),
    )  # fmt: skip
    spec.validate()  # the arguments, before anything asks for credentials
    session = _session(region, profile)
    result = run_transform(session.client("sagemaker"), spec, wait=wait, progress=_say, poll_s=poll)
    if result.status == "Completed":
        console.print(f"[green]✓[/] transform job [bold]{escape(result.name)}[/] completed: {escape(output)}")
    else:
        console.print(
            f"transform job [bold]{escape(result.name)}[/] started; its model {escape(result.model_name)} stays "
            "until you delete it (--wait deletes it when the job ends)"
        )
    print(result.name)


capture_app = typer.Typer(
    help="Read what an endpoint's data capture wrote.", no_args_is_help=True, add_completion=False
)


@capture_app.command("decode")
def capture_decode_command(
    source: Annotated[
        str, typer.Argument(metavar="FILE_OR_S3_PREFIX", help="A capture .jsonl file, a folder of them, or s3://...")
    ],
    output: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("--output", "-o", help="Also write every tensor to DIR/<event>/<input|output>/<name>.npy"),
    ] = None,
    region: RegionOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """Decode captured requests and responses: one JSON object per record on stdout, every tensor decoded.

    Reads SageMaker's capture JSON Lines (JSON, JSON sent as application/octet-stream, and Triton's
    binary+json, whose base64 bodies are otherwise unreadable). A record that cannot be decoded is named
    by its event id and the rest go on; the command then exits 1.

    \b
    Examples:
      smtriton capture decode s3://bucket/capture/demo/AllTraffic/2026/01/01/ > records.jsonl
      smtriton capture decode capture.jsonl --output tensors/
    """
    from smtriton.aws.capture import CaptureError, capture_lines, decode_record, record_json

    s3 = None
    if source.startswith("s3://"):
        from smtriton.aws.session import s3_client

        s3 = s3_client(region, profile)
    elif not Path(source).exists():
        raise typer.BadParameter(f"{source} does not exist (nor is it an s3:// prefix)", param_hint="FILE_OR_S3_PREFIX")
    decoded, failed = 0, 0
    for where, number, line in capture_lines(source, s3):
        if not line.strip():
            continue
        try:
            record = decode_record(line)
        except CaptureError as exc:
            failed += 1
            console.print(f"[yellow]{escape(where)}:{number}:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
            continue
        print(json.dumps(record_json(record, output)))
        decoded += 1
    if failed:
        raise _fail(f"{failed} of {decoded + failed} records could not be decoded (named above)")
    console.print(f"{decoded} records decoded", highlight=False)

"""`smtriton deploy | delete-endpoint | transform`: what makes (and removes) SageMaker's resources of the image."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer
from rich.markup import escape

from smtriton.aws import batch_options as batch
from smtriton.aws.cli import console, open_session, pairs, say
from smtriton.aws.docker_image import LABEL_BASE, SubprocessRunner
from smtriton.cli_options import DefaultModelOpt, ProfileOpt, RegionOpt

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
    instance_count: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(help="Initial instance count [default: 1; an existing endpoint keeps its own]"),
    ] = None,
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
    smtriton:endpoint=<name> so `smtriton delete-endpoint` removes it all. A redeploy keeps the
    endpoint's instance count (unless --instance-count is given; an auto-scaled one's even then) and
    its scaling, and changes nothing when nothing changed.

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
        environment=pairs(env, "--env"),
        default_model=default_model,
        serverless=Serverless(serverless_memory, serverless_concurrency) if serverless else None,
        async_inference=AsyncInference(async_output, async_failure, max_concurrent_invocations=async_concurrency)
        if async_output
        else None,
        autoscaling=AutoScaling(autoscale_min, autoscale_max, autoscale_target) if autoscale_max else None,
        remove_autoscaling=remove_autoscaling,
        startup_timeout_s=startup_timeout,
        tags=pairs(tag, "--tag"),
        base_image=labels.get(LABEL_BASE),
        hosting=_hosting(subnet, security_group, network_isolation, kms_key, model_download_timeout, volume_size),
        data_capture=DataCapture(data_capture, capture_percent) if data_capture else None,
        inference_component=Component(inference_component, copies, accelerators, memory_mb, cpu_cores)
        if inference_component
        else None,
        ami_version=inference_ami_version,
    )
    session = open_session(region, profile)
    result = deploy(
        Aws.from_session(session), spec, progress=say, poll_s=poll, timeout_s=timeout, keep_failed=keep_failed
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

    session = open_session(region, profile)
    removed = delete_endpoint(
        Aws.from_session(session), endpoint_name, force=force, component=inference_component, progress=say,
        poll_s=poll,
    )  # fmt: skip
    if not removed:
        console.print(f"nothing to delete for {escape(endpoint_name)}")
    for item in removed:
        print(item)


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
    content_type: batch.ContentTypeOpt = batch.CONTENT_TYPE,
    split_type: batch.SplitTypeOpt = batch.SPLIT_TYPE,
    batch_strategy: batch.BatchStrategyOpt = None,
    accept: batch.AcceptOpt = None,
    max_payload_mb: batch.MaxPayloadOpt = None,
    max_concurrent: batch.MaxConcurrentOpt = None,
    instance_type: batch.InstanceTypeOpt = batch.INSTANCE_TYPE,
    instance_count: Annotated[int, typer.Option(help="Instances")] = 1,
    ami_version: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="TransformAmiVersion, GPU types only [default: the one with the newest NVIDIA driver]"),
    ] = None,
    env: EnvOpt = None,
    subnet: SubnetOpt = None,
    security_group: SecurityGroupOpt = None,
    network_isolation: NetworkIsolationOpt = False,
    kms_key: batch.KmsKeyOpt = None,
    tag: TagOpt = None,
    wait: Annotated[bool, typer.Option("--wait", help="Follow the job to its end (then delete its model)")] = False,
    poll: PollOpt = 30.0,
    region: RegionOpt = None,
    profile: ProfileOpt = None,
) -> None:
    """Run the image over S3 input as a SageMaker batch transform job.

    Creates a model of the image and model data, and the job (a GPU instance type gets the AMI version
    its driver needs); with --wait prints its status until it ends, and a failure's reason in one line.
    Each object is one request (SageMaker's SplitType None); with --split-type Line each line of JSON
    Lines is one KServe v2 request, each line of CSV one row, and the answer has a line per line. A
    strategy, payload or concurrency not given is the container's /execution-parameters answer. Try the
    job on this machine first with the same flags: smtriton local-transform.

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
        instance_count=instance_count, ami_version=ami_version, environment=pairs(env, "--env"),
        default_model=default_model, hosting=_hosting(subnet, security_group, network_isolation, kms_key),
        tags=pairs(tag, "--tag"),
    )  # fmt: skip
    spec.validate()  # the arguments, before anything asks for credentials
    session = open_session(region, profile)
    result = run_transform(session.client("sagemaker"), spec, wait=wait, progress=say, poll_s=poll)
    if result.status == "Completed":
        console.print(f"[green]✓[/] transform job [bold]{escape(result.name)}[/] completed: {escape(output)}")
    else:
        console.print(
            f"transform job [bold]{escape(result.name)}[/] started; its model {escape(result.model_name)} stays "
            "until you delete it (--wait deletes it when the job ends)"
        )
    print(result.name)

"""`smtriton local-endpoint`: run a local SageMaker endpoint (SME or MME) that boto3 can call."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Annotated, Optional

import typer
import uvicorn

from smtriton.local.endpoint import ArchiveSource, create_app, safe_extract


def local_endpoint(
    models: Annotated[
        Optional[str],  # noqa: UP045 - typer needs Optional at runtime on 3.10
        typer.Option(help="MME: folder or s3://bucket/prefix holding the TargetModel archives"),
    ] = None,
    model_data: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="SME: a model.tar.gz (the repository root) or an extracted model repository"),
    ] = None,
    endpoint_name: Annotated[str, typer.Option(help="EndpointName clients use")] = "local",
    capacity: Annotated[int, typer.Option(help="MME: models kept loaded at once (LRU unloads beyond)")] = 4,
    host: Annotated[str, typer.Option(help="Address to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port of the SageMaker Runtime API")] = 8090,
    work_dir: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="Scratch directory (extracted models, serve's log) [default: a new temp dir]"),
    ] = None,
    default_model: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="SME: SAGEMAKER_TRITON_DEFAULT_MODEL_NAME when the repository has several models"),
    ] = None,
) -> None:
    """Serve the SageMaker Runtime InvokeEndpoint API locally, in front of a real `serve` + Triton.

    Call it with boto3 exactly as a real endpoint:
    boto3.client("sagemaker-runtime", endpoint_url="http://127.0.0.1:8090").invoke_endpoint(
    EndpointName="local", Body=..., ContentType=..., TargetModel="model.tar.gz")
    """
    if (models is None) == (model_data is None):
        raise typer.BadParameter("give exactly one of --models (multi-model) or --model-data (single model)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    work_dir = Path(tempfile.mkdtemp(prefix="smtriton-endpoint-", dir=work_dir))
    if models is not None:
        (work_dir / "models").mkdir()
        serve_args = ["--multi-model", "--model-root", str(work_dir / "models")]
        source: ArchiveSource | None = ArchiveSource(models)
    else:
        assert model_data is not None
        repository = model_data
        if model_data.is_file():
            repository = work_dir / "model"
            safe_extract(model_data, repository)
        serve_args = ["--model-repository", str(repository)]
        if default_model:
            serve_args += ["--default-model", default_model]
        source = None
    # serve's own scratch (Triton's backends, the MME repository) stays inside ours.
    app = create_app(endpoint_name, serve_args, work_dir, source, capacity, {"SMTRITON_WORK_DIR": str(work_dir)})
    uvicorn.run(app, host=host, port=port, log_config=None, server_header=False)

"""`smtriton invoke | capture decode`: call an endpoint as boto3 does, and read what its data capture wrote."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from smtriton.aws.cli import console, fail, open_session
from smtriton.cli_options import EndpointUrlOpt, ProfileOpt, RegionOpt, TargetModelOpt


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
    session = open_session(region, profile, endpoint_url)
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
        raise fail(
            f"the container answered {response.get('OriginalStatusCode')}: {response.get('OriginalMessage')}"
        ) from None
    except ClientError as exc:  # SageMaker's own refusal: no such endpoint, a bad TargetModel, throttling
        error = exc.response.get("Error", {})
        raise fail(f"{error.get('Code', 'error')}: {error.get('Message', exc)}") from None
    except BotoCoreError as exc:  # no answer at all: a wrong --endpoint-url, no network
        raise fail(str(exc)) from None
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
        raise fail(f"{failed} of {decoded + failed} records could not be decoded (named above)")
    console.print(f"{decoded} records decoded", highlight=False)

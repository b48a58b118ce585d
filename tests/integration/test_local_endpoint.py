"""The local endpoint emulator, driven by the real boto3 `sagemaker-runtime` client."""

from __future__ import annotations

import io
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import boto3
import numpy as np
import pytest
import requests
from botocore.config import Config

from smtriton.local.endpoint import model_hash
from tests.integration.conftest import TEST_MODELS
from tests.integration.contract_client import binary_request, json_request
from tests.integration.harness import free_port, no_aws_environment, triton_pids

pytestmark = pytest.mark.integration

A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 3, dtype=np.int32)
SMTRITON = str(Path(sys.executable).parent / "smtriton")


def _offset_model(directory: Path, offset: int) -> None:
    """addsub whose OUTPUT0 is INPUT0 + INPUT1 + offset: each archive answers differently."""
    shutil.copytree(TEST_MODELS / "addsub", directory)
    source = (directory / "1" / "model.py").read_text()
    (directory / "1" / "model.py").write_text(source.replace("a + b)", f"a + b + {offset})"))


def _tar(source: Path, archive: Path) -> None:
    with tarfile.open(archive, "w:gz") as tar:
        for item in sorted(source.iterdir()):
            tar.add(item, arcname=item.name)


class Emulator:
    def __init__(self, tmp: Path, args: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.work = tmp / "work"
        self.work.mkdir()
        self._log = open(tmp / "emulator.log", "wb")  # noqa: SIM115
        self.log_path = tmp / "emulator.log"
        cmd = [SMTRITON, "local-endpoint", "--port", str(self.port), "--work-dir", str(self.work), *args]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SAGEMAKER_", "SMTRITON_"))} | (env or {})
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True, env=env, cwd=cwd
        )
        try:
            self._until_ready(time.monotonic() + 180)
        except BaseException:
            self.stop()  # never left running by a fixture that failed to start
            raise
        self.client = boto3.client(
            "sagemaker-runtime",
            endpoint_url=self.url,
            region_name="us-east-1",
            aws_access_key_id="local",
            aws_secret_access_key="local",
            config=Config(retries={"max_attempts": 1}, read_timeout=120),
        )

    def _until_ready(self, deadline: float) -> None:
        while True:
            assert self.proc.poll() is None, self.log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, self.log_path.read_text()[-3000:]
            try:
                if requests.get(f"{self.url}/ping", timeout=5).status_code == 200:
                    return
            except (requests.ConnectionError, requests.Timeout):  # not listening, or still starting serve
                pass
            time.sleep(0.3)

    def stop(self) -> int:
        """SIGTERM, as a user's Ctrl-C or a supervisor would; the emulator's exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        for pid in triton_pids(str(self.work)):
            os.kill(pid, signal.SIGKILL)
        self._log.close()
        return self.proc.returncode


@pytest.fixture(scope="module")
def mme_endpoint(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("endpoint")
    archives = tmp / "archives"
    (archives / "team").mkdir(parents=True)
    for i in range(5):
        _offset_model(tmp / f"src{i}" / "addsub", i)
        _tar(tmp / f"src{i}", archives / ("team" if i == 4 else "") / f"model{i}.tar.gz")
    emulator = Emulator(tmp, ["--models", str(archives), "--capacity", "2"])
    yield emulator
    emulator.stop()


def _json_invoke(client, target: str) -> dict:
    body = json.dumps(json_request({"INPUT0": A, "INPUT1": B}))
    r = client.invoke_endpoint(EndpointName="local", Body=body, ContentType="application/json", TargetModel=target)
    assert r["ContentType"] == "application/json"
    assert r["InvokedProductionVariant"] == "AllTraffic"
    return json.loads(r["Body"].read())


def test_five_models_in_turn_with_capacity_two_load_and_evict_lru(mme_endpoint):
    targets = ["model0.tar.gz", "model1.tar.gz", "model2.tar.gz", "model3.tar.gz", "team/model4.tar.gz"]
    for round_ in range(2):
        for i, target in enumerate(targets):
            out = _json_invoke(mme_endpoint.client, target)
            assert out["model_name"] == target
            assert out["outputs"][0]["data"] == (A + B + i).flatten().tolist(), (round_, target)
    status = requests.get(f"{mme_endpoint.url}/_local/models", timeout=5).json()
    assert status["loaded"] == targets[-2:]
    assert status["loads"] == 10
    assert status["evictions"] == 8


def test_binary_json_through_boto3_decodes_with_tritonclient(mme_endpoint):
    import tritonclient.http as httpclient

    body, content_type = binary_request({"INPUT0": A, "INPUT1": B})
    r = mme_endpoint.client.invoke_endpoint(
        EndpointName="local", Body=body, ContentType=content_type, TargetModel="model3.tar.gz"
    )
    header_length = int(r["ContentType"].split("json-header-size=")[1])
    result = httpclient.InferenceServerClient.parse_response_body(r["Body"].read(), header_length=header_length)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B + 3)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)


def test_container_errors_reach_boto3_as_model_error(mme_endpoint):
    client = mme_endpoint.client
    with pytest.raises(client.exceptions.ModelError) as err:
        client.invoke_endpoint(
            EndpointName="local", Body=b"{not json", ContentType="application/json", TargetModel="model0.tar.gz"
        )
    response = err.value.response
    assert response["OriginalStatusCode"] == 400
    assert "failed to parse the request JSON buffer" in response["OriginalMessage"]


BROKEN = {  # what each broken archive is, and what the one line about it says
    "truncated": "is truncated",
    "not gzip": "is not gzip-compressed",
    "not a tar": "is not a tar archive",
    "unsafe": "unsafe member path: '../escape.txt'",
}


def test_a_broken_archive_is_a_validation_error_naming_it_and_a_corrected_one_loads_at_once(mme_endpoint):
    """Each broken TargetModel archive: boto3 gets SageMaker's ValidationError (400, not retried) with one
    line naming the archive and what is wrong; the log has that line and no traceback; nothing of it is
    left under the model root; the corrected archive, under the same name, loads on the next request."""
    from tests.unit.test_local_archive import broken

    client = mme_endpoint.client
    archives = mme_endpoint.work.parent / "archives"
    good = (archives / "model2.tar.gz").read_bytes()
    for kind, says in BROKEN.items():
        target = f"broken-{kind.replace(' ', '-')}.tar.gz"
        (archives / target).write_bytes(broken(kind, good))
        with pytest.raises(client.exceptions.ClientError) as refused:
            client.invoke_endpoint(EndpointName="local", Body=b"{}", ContentType="application/json", TargetModel=target)
        error = refused.value.response
        assert error["Error"]["Code"] == "ValidationError"
        assert error["ResponseMetadata"]["HTTPStatusCode"] == 400
        message = error["Error"]["Message"]
        assert message.startswith(f"{target} "), message
        assert says in message, message
        assert "\n" not in message
        assert f"TargetModel {target} refused: {message}" in mme_endpoint.log_path.read_text()
        (models,) = mme_endpoint.work.glob("*/models")
        assert not (models / model_hash(target)).exists()
    assert "Traceback" not in mme_endpoint.log_path.read_text()
    # The truncated archive, corrected in place: no restart, no stale half of the old one.
    shutil.copyfile(archives / "model2.tar.gz", archives / "broken-truncated.tar.gz")
    assert _json_invoke(client, "broken-truncated.tar.gz")["outputs"][0]["data"] == (A + B + 2).flatten().tolist()


def test_an_archive_whose_model_fails_to_load_is_read_again_once_corrected(mme_endpoint, tmp_path):
    """A whole archive whose model serve cannot load: the caller gets the ModelError, and the archive
    corrected under the same TargetModel is extracted again (not the failed copy) and answers."""
    client = mme_endpoint.client
    archives = mme_endpoint.work.parent / "archives"
    source = tmp_path / "failing"
    _offset_model(source / "addsub", 6)
    (source / "addsub" / "1" / "model.py").write_text(
        "class TritonPythonModel:\n    def initialize(self, args):\n        raise RuntimeError('bad weights')\n"
    )
    _tar(source, archives / "fails-first.tar.gz")
    with pytest.raises(client.exceptions.ModelError):
        _json_invoke(client, "fails-first.tar.gz")
    (models,) = mme_endpoint.work.glob("*/models")
    assert not (models / model_hash("fails-first.tar.gz")).exists()
    fixed = tmp_path / "fixed"
    _offset_model(fixed / "addsub", 6)
    _tar(fixed, archives / "fails-first.tar.gz")
    assert _json_invoke(client, "fails-first.tar.gz")["outputs"][0]["data"] == (A + B + 6).flatten().tolist()


def test_missing_archive_and_unknown_endpoint_are_validation_errors(mme_endpoint):
    client = mme_endpoint.client
    with pytest.raises(client.exceptions.ClientError, match="ValidationError"):
        client.invoke_endpoint(
            EndpointName="local", Body=b"{}", ContentType="application/json", TargetModel="nope.tar.gz"
        )
    with pytest.raises(client.exceptions.ClientError, match="ValidationError"):
        client.invoke_endpoint(
            EndpointName="other", Body=b"{}", ContentType="application/json", TargetModel="model0.tar.gz"
        )


WEIGHTS = 1 << 20  # each model below carries this much, so serve's estimate of it is a little more


def _weighted_archive(tmp: Path, archive: Path, offset: int) -> None:
    """An offset addsub with WEIGHTS bytes of files beside it: serve estimates its load at ~1 MiB."""
    source = tmp / f"weighted{offset}"
    _offset_model(source / "addsub", offset)
    (source / "addsub" / "1" / "weights.bin").write_bytes(bytes(WEIGHTS))
    _tar(source, archive)


def test_a_507_from_serve_unloads_the_least_recently_used_model_and_retries(tmp_path):
    """Serve refuses a load for memory (507: its model memory budget holds two of these models); the
    emulator, far below its own capacity, must unload the least recently used model, retry, and answer
    boto3 as if nothing happened, as SageMaker's MME does."""
    archives = tmp_path / "archives"
    archives.mkdir()
    for i in range(3):
        _weighted_archive(tmp_path, archives / f"model{i}.tar.gz", i)
    env = {"SMTRITON_MODEL_MEMORY_BUDGET_BYTES": str(5 * WEIGHTS // 2)}
    emulator = Emulator(tmp_path, ["--models", str(archives), "--capacity", "10"], env)
    try:
        client = emulator.client
        for target, offset in [("model0.tar.gz", 0), ("model1.tar.gz", 1), ("model0.tar.gz", 0), ("model2.tar.gz", 2)]:
            out = _json_invoke(client, target)
            assert (out["model_name"], out["outputs"][0]["data"]) == (target, (A + B + offset).flatten().tolist())
        status = requests.get(f"{emulator.url}/_local/models", timeout=5).json()
        assert status == {"loaded": ["model0.tar.gz", "model2.tar.gz"], "loads": 3, "evictions": 1}
        serve_log = next(emulator.work.glob("*/serve.log")).read_text()
        assert serve_log.count("POST /models answered 507") == 1
        assert "unloaded model1.tar.gz (least recently used) to make room" in emulator.log_path.read_text()
        # The evicted model comes back on demand, pushing out the one now least recently used.
        assert _json_invoke(client, "model1.tar.gz")["outputs"][0]["data"] == (A + B + 1).flatten().tolist()
        status = requests.get(f"{emulator.url}/_local/models", timeout=5).json()
        assert status == {"loaded": ["model2.tar.gz", "model1.tar.gz"], "loads": 4, "evictions": 2}
    finally:
        emulator.stop()


def test_single_model_endpoint_from_a_model_tar_gz(tmp_path):
    repo = tmp_path / "repo"
    _offset_model(repo / "addsub", 7)
    _tar(repo, tmp_path / "model.tar.gz")
    emulator = Emulator(tmp_path, ["--model-data", str(tmp_path / "model.tar.gz")])
    try:
        body = json.dumps(json_request({"INPUT0": A, "INPUT1": B}))
        r = emulator.client.invoke_endpoint(EndpointName="local", Body=body, ContentType="application/json")
        out = json.loads(r["Body"].read())
        assert out["outputs"][0]["data"] == (A + B + 7).flatten().tolist()
        (scratch,) = emulator.work.iterdir()
        assert scratch.name.startswith("smtriton-endpoint-")
    finally:
        code = emulator.stop()
    assert code == 0
    assert list(emulator.work.iterdir()) == []  # the scratch folder (extracted model, log) is gone


def test_a_failed_start_says_why_without_a_traceback_and_keeps_only_the_log(tmp_path):
    """Two models and no --default-model: serve refuses to start; the emulator prints serve's reason and
    the log's path, exits 1, and leaves nothing but that log (in a --work-dir it had to create)."""
    repo = tmp_path / "repo"
    _offset_model(repo / "addsub", 0)
    _offset_model(repo / "addsub2", 1)
    (repo / "addsub2" / "config.pbtxt").write_text(
        (repo / "addsub2" / "config.pbtxt").read_text().replace('"addsub"', '"addsub2"')
    )
    work = tmp_path / "not" / "yet"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAGEMAKER_", "SMTRITON_"))}
    cmd = [SMTRITON, "local-endpoint", "--port", str(free_port()), "--work-dir", str(work), "--model-data", str(repo)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert "More than 1 model directory found" in done.stderr
    assert "--default-model" in done.stderr
    (scratch,) = work.iterdir()
    assert f"serve's whole log: {scratch / 'serve.log'}" in done.stderr
    assert [p.name for p in scratch.iterdir()] == ["serve.log"]
    # Asked to keep it, the scratch folder stays whole (here: the log and serve's own scratch).
    kept = subprocess.run([*cmd, "--keep-work-dir"], capture_output=True, text=True, timeout=120, env=env)
    assert kept.returncode == 1
    (second,) = set(work.iterdir()) - {scratch}
    assert f"scratch folder kept: {second}" in kept.stderr
    assert (second / "serve.log").is_file()


def test_a_model_that_fails_to_load_ends_the_start_at_once_with_its_reason(tmp_path):
    """serve stays up (ping 503) when its model fails to load; the emulator stops waiting at Triton's
    message instead of the start timeout, and prints it."""
    repo = tmp_path / "repo"
    shutil.copytree(TEST_MODELS / "addsub", repo / "addsub")
    (repo / "addsub" / "1" / "model.py").write_text(
        "class TritonPythonModel:\n    def initialize(self, args):\n        raise RuntimeError('broken weights file')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAGEMAKER_", "SMTRITON_"))}
    cmd = [SMTRITON, "local-endpoint", "--port", str(free_port()), "--work-dir", str(tmp_path / "work"),
           "--model-data", str(repo), "--default-model", "addsub"]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=150, env=env)
    assert time.monotonic() - started < 90  # the start timeout alone is 180 s
    assert done.returncode == 1, done.stderr
    assert "Traceback (most recent call last)" not in done.stderr.split("its last lines:")[0]
    assert "broken weights file" in done.stderr


def test_archives_with_links_out_or_traversal_are_refused(tmp_path):
    from smtriton.local.archive import ArchiveError, safe_extract

    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tar:
        info = tarfile.TarInfo("../escape.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    with pytest.raises(ArchiveError, match="leaves the archive"):
        safe_extract(evil, tmp_path / "out1")
    with tarfile.open(evil, "w:gz") as tar:
        link = tarfile.TarInfo("model/weights")
        link.type = tarfile.SYMTYPE
        link.linkname = "/etc/passwd"
        tar.addfile(link)
    with pytest.raises(ArchiveError, match="points outside"):
        safe_extract(evil, tmp_path / "out2")
    with tarfile.open(evil, "w:gz") as tar:
        dev = tarfile.TarInfo("model/dev")
        dev.type = tarfile.CHRTYPE
        tar.addfile(dev)
    with pytest.raises(ArchiveError, match="not a file"):
        safe_extract(evil, tmp_path / "out3")
    assert not (tmp_path / "escape.txt").exists()


def test_sigterm_while_serve_starts_stops_it_and_cleans_up(tmp_path):
    """A model that takes a minute to load: SIGTERM before the endpoint is ready still stops serve (and
    its Triton), removes the scratch folder and exits 0, well before the load would have finished."""
    repo = tmp_path / "repo"
    _offset_model(repo / "addsub", 0)
    model = repo / "addsub" / "1" / "model.py"
    model.write_text(
        "import time\n"
        + model.read_text().replace(
            "class TritonPythonModel:\n",
            "class TritonPythonModel:\n    def initialize(self, args):\n        time.sleep(60)\n\n",
        )
    )
    work = tmp_path / "work"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAGEMAKER_", "SMTRITON_"))}
    cmd = [SMTRITON, "local-endpoint", "--port", str(free_port()), "--work-dir", str(work), "--model-data", str(repo)]
    with open(tmp_path / "emulator.log", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        deadline = time.monotonic() + 60
        while "loading: addsub" not in "".join(p.read_text() for p in work.glob("*/serve.log")):
            assert proc.poll() is None, (tmp_path / "emulator.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "emulator.log").read_text()
            time.sleep(0.2)
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(50) == 0, (tmp_path / "emulator.log").read_text()
        assert time.monotonic() - began < 50
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        for pid in triton_pids(str(work)):
            os.kill(pid, signal.SIGKILL)
    assert triton_pids(str(work)) == []
    assert list(work.iterdir()) == []


def _run_endpoint(tmp_path: Path, *args: str, port: int | None = None) -> subprocess.CompletedProcess[str]:
    """`smtriton local-endpoint` as a user starts it, expected to stop on its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAGEMAKER_", "SMTRITON_"))}
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    cmd = [SMTRITON, "local-endpoint", "--port", str(port or free_port()), "--work-dir", str(work), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)


def test_a_busy_port_is_refused_in_one_line_before_anything_loads(tmp_path):
    repo = tmp_path / "repo"
    _offset_model(repo / "addsub", 0)
    with socket.create_server(("127.0.0.1", 0)) as holder:
        port = holder.getsockname()[1]
        started = time.monotonic()
        done = _run_endpoint(tmp_path, "--model-data", str(repo), port=port)
    assert time.monotonic() - started < 30  # no serve, no Triton, no model load first
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [
        f"error: cannot listen on 127.0.0.1:{port}: Address already in use (pick another --port)"
    ]
    assert list((tmp_path / "work").iterdir()) == []  # nothing extracted or logged


def test_an_archive_with_the_model_at_its_root_names_the_archive_and_the_fix(tmp_path):
    """`tar czf m.tar.gz -C repo/addsub config.pbtxt 1`: SageMaker would extract a repository without a
    model directory; the endpoint says so about the archive itself, not a scratch folder."""
    _offset_model(tmp_path / "repo" / "addsub", 0)
    archive = tmp_path / "m.tar.gz"
    subprocess.run(["tar", "czf", str(archive), "-C", str(tmp_path / "repo" / "addsub"), "config.pbtxt", "1"],
                   check=True, timeout=60)  # fmt: skip
    done = _run_endpoint(tmp_path, "--model-data", str(archive))
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"error: {archive} holds a model directory at its root (config.pbtxt"), line
    assert "`tar czf model.tar.gz -C REPOSITORY MODEL`" in line
    assert "smtriton-endpoint-" not in line
    assert list((tmp_path / "work").iterdir()) == []


def test_a_mistyped_default_model_lists_the_models_there(tmp_path):
    repo = tmp_path / "repo"
    _offset_model(repo / "addsub", 0)
    done = _run_endpoint(tmp_path, "--model-data", str(repo), "--default-model", "addsup")
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [f"error: --default-model addsup: {repo} has no such model (models: addsub)"]
    # serve itself, started the same way, names them too (after NVIDIA's own words).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAGEMAKER_", "SMTRITON_"))}
    serve = [str(Path(sys.executable).parent / "serve"), "--model-repository", str(repo), "--default-model", "addsup",
             "--port", str(free_port())]  # fmt: skip
    done = subprocess.run(serve, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 1
    assert "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME addsup does not exist (models there: addsub)" in done.stderr


def _help_examples() -> tuple[list[str], str]:
    """`smtriton local-endpoint --help`'s example command lines and its boto3 code, as a user copies them."""
    shown = subprocess.run(
        [SMTRITON, "local-endpoint", "--help"], env=os.environ | {"COLUMNS": "200", "NO_COLOR": "1"},
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    lines = [line.rstrip() for line in shown.splitlines()]
    commands = [line.strip() for line in lines if line.strip().startswith("smtriton ")]
    first = next(i for i, line in enumerate(lines) if line.strip() == "import boto3")
    last = next(i for i, line in enumerate(lines) if line.strip().startswith("print("))
    return commands, textwrap.dedent("\n".join(lines[first : last + 1]))


def test_the_help_examples_run_as_written(tmp_path):
    """Every example of `local-endpoint --help` runs as a user types it (on a free port instead of 8090),
    the boto3 code too, on a machine where AWS was never set up."""
    commands, code = _help_examples()
    assert [shlex.split(c, comments=True)[:3] for c in commands] == [
        ["smtriton", "local-endpoint", "--model-data"], ["smtriton", "local-endpoint", "--models"],
        ["smtriton", "invoke", "local"],
    ]  # fmt: skip
    here = tmp_path / "here"
    (here / "archives").mkdir(parents=True)
    _offset_model(tmp_path / "repo" / "addsub", 5)
    _tar(tmp_path / "repo", here / "model.tar.gz")
    shutil.copy(here / "model.tar.gz", here / "archives" / "model.tar.gz")
    (here / "request.json").write_text(json.dumps(json_request({"INPUT0": A, "INPUT1": B})))
    env = no_aws_environment(tmp_path / "home")
    expected = (A + B + 5).flatten().tolist()
    for command in commands[:2]:
        (tmp_path / command.split()[2].strip("-")).mkdir()
        emulator = Emulator(tmp_path / command.split()[2].strip("-"), shlex.split(command, comments=True)[2:], cwd=here)
        try:
            url = f"http://127.0.0.1:{emulator.port}"
            ran = subprocess.run([sys.executable, "-c", code.replace("http://127.0.0.1:8090", url)], cwd=here,
                                 env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
            if "--models" in command:  # as the code's comment says
                assert ran.returncode == 1
                assert "TargetModel" in ran.stderr
                target = 'open("request.json", "rb").read(), TargetModel="model.tar.gz")'
                ran = subprocess.run(
                    [sys.executable, "-c", code.replace("http://127.0.0.1:8090", url).replace(
                        'open("request.json", "rb").read())', target)],
                    cwd=here, env=env, capture_output=True, text=True, timeout=120,
                )  # fmt: skip
            assert ran.returncode == 0, ran.stderr
            assert json.loads(ran.stdout)["outputs"][0]["data"] == expected
            if "--model-data" in command:
                invoke = shlex.split(commands[2].replace("http://127.0.0.1:8090", url), comments=True)
                done = subprocess.run([SMTRITON, *invoke[1:]], cwd=here, env=env, capture_output=True, text=True,
                                      timeout=120)  # fmt: skip
                assert done.returncode == 0, done.stderr
                assert "OUTPUT0" in done.stdout
                assert "[ 8  9 10" in done.stdout  # 0 + 3 + 5, ...
        finally:
            assert emulator.stop() == 0


def test_the_hint_after_packaging_several_models_runs_as_written(tmp_path):
    """`smtriton package sme` of a repository with two models says to start the local endpoint with
    --default-model; the command it prints serves the archive."""
    here = tmp_path / "here"
    repo = here / "repo"
    _offset_model(repo / "addsub", 2)
    shutil.copytree(TEST_MODELS / "ident", repo / "ident")
    packaged = subprocess.run([SMTRITON, "package", "sme", "repo"], cwd=here, capture_output=True, text=True,
                              timeout=120)  # fmt: skip
    assert packaged.returncode == 0, packaged.stderr
    hint = packaged.stderr.splitlines()[-1]
    assert hint.startswith("next: smtriton local-endpoint --model-data model.tar.gz --default-model addsub calls")
    command = shlex.split(hint.removeprefix("next: ").partition(" calls it here")[0])
    (tmp_path / "run").mkdir()
    emulator = Emulator(tmp_path / "run", command[2:], cwd=here)
    try:
        body = json.dumps(json_request({"INPUT0": A, "INPUT1": B}))
        r = emulator.client.invoke_endpoint(EndpointName="local", Body=body, ContentType="application/json")
        assert json.loads(r["Body"].read())["outputs"][0]["data"] == (A + B + 2).flatten().tolist()
    finally:
        assert emulator.stop() == 0

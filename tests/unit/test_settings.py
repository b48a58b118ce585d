"""SageMaker variables keep their meaning (docs/contract.md §1.4) but are parsed, never word-split; one schema
declares every setting, and the docs, the deploy-time check and the start-up object all come from it."""

import logging
import os
import re
from pathlib import Path

import annotated_types
import pytest
from pydantic import ValidationError

from smtriton.serve.owner import cli
from smtriton.serve.setting_types import MIB, SettingsError
from smtriton.serve.settings import (
    WITHOUT_EFFECT,
    Settings,
    known_variables,
    setting_fields,
    variables_of,
    warn_without_effect,
)
from smtriton.serve.settings_reference import markdown

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_match_the_sagemaker_container_contract():
    s = Settings.from_env({})
    assert (s.host, s.port) == ("0.0.0.0", 8080)
    assert s.model_repository == Path("/opt/ml/model")
    assert s.multi_model is False
    assert s.ping_mode == "ready"
    assert s.triton.log_verbose == 0  # docs/contract.md §6 B18: native defaults to verbose
    # what any SageMaker mode may send and wait for: asynchronous inference's 1 GB and one hour
    assert s.max_payload_bytes == 1024 * MIB
    assert s.request_timeout_s == 3600
    assert s.startup_timeout_s == 3600  # ContainerStartupHealthCheckTimeoutInSeconds' maximum


def test_bind_port_and_default_model_come_from_sagemaker_variables():
    s = Settings.from_env({"SAGEMAKER_BIND_TO_PORT": "28080", "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "resnet"})
    assert s.port == 28080
    assert s.default_model == "resnet"


def test_flags_override_the_environment():
    s = Settings.from_env(
        {"SAGEMAKER_BIND_TO_PORT": "28080", "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "a"},
        port=9000,
        default_model="b",
        model_repository="repo",
        host=None,
    )
    assert (s.port, s.default_model, s.model_repository, s.host) == (9000, "b", Path("repo"), "0.0.0.0")


@pytest.mark.parametrize(("value", "expected"), [("true", True), ("True", False), ("1", False), ("", False)])
def test_multi_model_only_for_exactly_true(value, expected):
    assert Settings.from_env({"SAGEMAKER_MULTI_MODEL": value}).multi_model is expected


def test_override_ping_mode_wins():
    env = {"SAGEMAKER_TRITON_PING_MODE": "ready", "SAGEMAKER_TRITON_OVERRIDE_PING_MODE": "live"}
    assert Settings.from_env(env).ping_mode == "live"
    assert Settings.from_env({"SAGEMAKER_TRITON_PING_MODE": "anything"}).ping_mode == "ready"


def test_values_are_not_word_split_into_extra_flags():
    with pytest.raises(SettingsError, match="SAGEMAKER_TRITON_LOG_INFO"):
        Settings.from_env({"SAGEMAKER_TRITON_LOG_INFO": "false --load-model=x"})


def test_additional_args_are_split_shell_style():
    s = Settings.from_env({"SAGEMAKER_TRITON_ADDITIONAL_ARGS": "--load-model=a --log-format 'ISO 8601'"})
    assert s.triton.additional_args == ("--load-model=a", "--log-format", "ISO 8601")


def test_triton_variables_are_parsed():
    s = Settings.from_env(
        {
            "SAGEMAKER_TRITON_LOG_VERBOSE": "true",
            "SAGEMAKER_TRITON_ALLOW_METRICS": "true",
            "SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE": "1024",
            "SAGEMAKER_TRITON_DISABLE_MODEL_NAMESPACING": "false",
            "SAGEMAKER_SAFE_PORT_RANGE": "28081-29000",
        }
    )
    assert s.triton.log_verbose == 1
    assert s.triton.allow_metrics is True
    assert s.triton.shm_default_byte_size == 1024
    assert s.triton.model_namespacing is False
    assert s.safe_port_range == (28081, 29000)


def test_batch_payload_and_timeout_follow_batch_variables():
    s = Settings.from_env({"SAGEMAKER_BATCH": "true", "SAGEMAKER_MAX_PAYLOAD_IN_MB": "50"})
    assert s.batch is True
    assert s.max_payload_bytes == 50 * MIB
    assert s.request_timeout_s == 3600  # batch transform's InvocationsTimeoutInSeconds goes up to 3600


@pytest.mark.parametrize(
    "env",
    [
        {"SAGEMAKER_BIND_TO_PORT": "http"},
        {"SAGEMAKER_BIND_TO_PORT": "70000"},
        {"SAGEMAKER_SAFE_PORT_RANGE": "2000"},
        {"SAGEMAKER_SAFE_PORT_RANGE": "3000-2000"},
        {"SAGEMAKER_TRITON_INFERENCE_TYPE": "predict"},
        {"SMTRITON_REQUEST_TIMEOUT_S": "-1"},
        {"SMTRITON_LOG_LEVEL": "loud"},
        {"SMTRITON_TRANSCODE_JSON_MIN_BYTES": "-5"},
        # Once read leniently (xml became json, a shared-memory size of 0 the default); refused now.
        {"SMTRITON_LOG_FORMAT": "xml"},
        {"SMTRITON_ACCESS_LOG": "maybe"},
        {"SAGEMAKER_TRITON_LOG_VERBOSE": "loud"},
        {"SAGEMAKER_BATCH_STRATEGY": "ALL"},
        {"SAGEMAKER_TRITON_ADDITIONAL_ARGS": "--log-format 'ISO 8601"},
        {"SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE": "0"},
        {"SMTRITON_MODEL_MEMORY_FACTOR": "nan"},
    ],
)
def test_bad_values_are_refused_with_the_variable_named(env):
    ((variable, value),) = env.items()
    with pytest.raises(SettingsError, match=variable) as refused:
        Settings.from_env(env)
    assert value in str(refused.value)


def test_json_transcoding_threshold_defaults_to_64_kib_and_zero_turns_it_off():
    assert Settings.from_env({}).transcode_json_min_bytes == 64 * 1024
    assert Settings.from_env({"SMTRITON_TRANSCODE_JSON_MIN_BYTES": "0"}).transcode_json_min_bytes == 0


def test_an_invalid_inference_type_is_refused_in_nvidia_s_words():
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({"SAGEMAKER_TRITON_INFERENCE_TYPE": "predict"})
    message = str(refused.value)
    assert message.startswith("ERROR: Invalid SAGEMAKER_TRITON_INFERENCE_TYPE 'predict'")
    assert "generate_stream" in message


def test_every_refused_value_gets_its_own_line():
    with pytest.raises(SettingsError) as refused:
        Settings.from_env({"SAGEMAKER_TRITON_GRPC_PORT": "0", "SMTRITON_MAX_CONCURRENT_LOADS": "x"})
    lines = str(refused.value).splitlines()
    assert len(lines) == 2
    assert any(line.startswith("SAGEMAKER_TRITON_GRPC_PORT='0'") for line in lines)
    assert any(line.startswith("SMTRITON_MAX_CONCURRENT_LOADS='x'") for line in lines)


def test_a_bad_flag_is_refused_with_the_flag_named():
    with pytest.raises(SettingsError, match="--port=0"):
        Settings.from_env({}, port=0)
    assert Settings.from_env({}, log_level="DEBUG").log_level == "debug"


# Every bound the schema declares: (variable, the first value refused, the last value accepted).
BOUNDS = [
    ("SAGEMAKER_BIND_TO_PORT", "0", "1"),
    ("SAGEMAKER_BIND_TO_PORT", "65536", "65535"),
    ("SAGEMAKER_MODEL_SERVER_WORKERS", "0", "1"),
    ("SAGEMAKER_MODEL_SERVER_WORKERS", "-2", "3"),
    ("SMTRITON_MEMORY_RESERVE_BYTES", "-1", "0"),
    ("SMTRITON_GPU_MEMORY_RESERVE_BYTES", "-1", "0"),
    ("SMTRITON_MODEL_MEMORY_FACTOR", "0", "0.01"),
    ("SMTRITON_MODEL_MEMORY_BUDGET_BYTES", "0", "1"),
    ("SMTRITON_MAX_CONCURRENT_LOADS", "0", "1"),
    ("SAGEMAKER_MAX_CONCURRENT_TRANSFORMS", "0", "1"),
    ("SAGEMAKER_MAX_PAYLOAD_IN_MB", "-1", "0"),
    ("SMTRITON_MAX_PAYLOAD_BYTES", "0", "1"),
    ("SMTRITON_MAX_HEADER_BYTES", "1023", "1024"),
    ("SMTRITON_RECORDS_IN_FLIGHT", "0", "1"),
    ("SMTRITON_CLIENT_TIMEOUT_S", "0", "0.5"),
    ("SMTRITON_BODY_TIMEOUT_S", "0", "0.5"),
    ("SMTRITON_SESSION_TTL_S", "0", "0.5"),
    ("SMTRITON_TRANSCODE_JSON_MIN_BYTES", "-1", "0"),
    ("SMTRITON_MERGE_IN_FLIGHT", "0", "1"),
    ("SMTRITON_MERGE_MAX_ROW_MS", "-0.5", "0"),
    ("SMTRITON_WORKER_KEEP_FREED_BYTES", "-1", "0"),
    ("SMTRITON_WORKER_SHM_INPUT_BYTES", "-1", "0"),
    ("SMTRITON_METRICS_PORT", "0", "1"),
    ("SMTRITON_METRICS_PORT", "65536", "65535"),
    ("SMTRITON_STARTUP_TIMEOUT_S", "0", "0.5"),
    ("SMTRITON_REQUEST_TIMEOUT_S", "0", "0.5"),
    ("SMTRITON_SHUTDOWN_TIMEOUT_S", "0", "0.5"),
    ("SMTRITON_TRITON_EXIT_TIMEOUT_S", "0", "0.5"),
    ("SMTRITON_WORKER_HEARTBEAT_TIMEOUT_S", "0", "0.5"),
    ("SMTRITON_TRITON_WAIT_QUEUE", "0", "1"),
    ("SMTRITON_PROBATION_LEASE_S", "0", "0.5"),
    ("SAGEMAKER_TRITON_GRPC_PORT", "0", "1"),
    ("SAGEMAKER_TRITON_GRPC_PORT", "65536", "65535"),
    ("SAGEMAKER_TRITON_METRICS_PORT", "0", "1"),
    ("SAGEMAKER_TRITON_METRICS_PORT", "65536", "65535"),
    ("SAGEMAKER_TRITON_BUFFER_MANAGER_THREAD_COUNT", "-1", "0"),
    ("SAGEMAKER_TRITON_THREAD_COUNT", "0", "1"),
    ("SAGEMAKER_TRITON_LOG_VERBOSE", "-1", "0"),
    ("SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE", "0", "1"),
    ("SAGEMAKER_TRITON_SHM_GROWTH_BYTE_SIZE", "0", "1"),
    ("SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT", "0", "0.5"),
    ("SAGEMAKER_SAFE_PORT_RANGE", "0-10", "1-10"),
    ("SAGEMAKER_SAFE_PORT_RANGE", "10-65536", "10-65535"),
]


@pytest.mark.parametrize(("variable", "refused", "accepted"), BOUNDS)
def test_each_bound_is_enforced_with_the_variable_named(variable, refused, accepted):
    with pytest.raises(SettingsError, match=f"^{variable}={refused!r}: must be"):
        Settings.from_env({variable: refused})
    Settings.from_env({variable: accepted})


def test_every_bound_in_the_schema_has_a_test():
    bounded = {
        variables_of(field)[0]
        for _, field in setting_fields(Settings)
        if any(isinstance(m, annotated_types.Ge | annotated_types.Gt | annotated_types.Le) for m in field.metadata)
    }
    assert bounded | {"SAGEMAKER_SAFE_PORT_RANGE"} == {variable for variable, _, _ in BOUNDS}


def test_empty_values_mean_unset():
    env = {name: "" for name in known_variables()}
    assert Settings.from_env(env) == Settings()


def test_batch_transform_payload_limit_wins_only_when_positive():
    both = {"SAGEMAKER_MAX_PAYLOAD_IN_MB": "50", "SMTRITON_MAX_PAYLOAD_BYTES": "1000"}
    assert Settings.from_env({**both, "SAGEMAKER_BATCH": "true"}).max_payload_bytes == 50 * MIB
    assert Settings.from_env(both).max_payload_bytes == 1000
    assert Settings.from_env({"SAGEMAKER_MAX_PAYLOAD_IN_MB": "50"}).max_payload_bytes == 50 * MIB
    unbounded = Settings.from_env({"SAGEMAKER_BATCH": "true", "SAGEMAKER_MAX_PAYLOAD_IN_MB": "0"})
    assert (unbounded.max_payload_bytes, unbounded.max_payload_in_mb) == (1024 * MIB, 0)
    assert Settings.from_env({"SAGEMAKER_BATCH": "true", "SMTRITON_REQUEST_TIMEOUT_S": "5"}).request_timeout_s == 5


def test_under_batch_transform_the_limit_is_what_execution_parameters_answers():
    """A job that sets no MaxPayloadInMB takes the container's answer, 6: a larger body is refused (413)."""
    batch = Settings.from_env({"SAGEMAKER_BATCH": "true"})
    assert (batch.max_payload_in_mb, batch.max_payload_bytes) == (None, 6 * MIB)
    assert (
        Settings.from_env({"SAGEMAKER_BATCH": "true", "SMTRITON_MAX_PAYLOAD_BYTES": "1000"}).max_payload_bytes == 1000
    )
    assert Settings.from_env({}).max_payload_bytes == 1024 * MIB


def test_a_failed_record_fails_the_request_unless_error_lines_are_asked_for():
    assert Settings.from_env({}).failed_record == "fail"
    assert Settings.from_env({"SMTRITON_FAILED_RECORD": " Error-Line"}).failed_record == "error-line"
    with pytest.raises(SettingsError, match=r"^SMTRITON_FAILED_RECORD='skip': must be 'fail' or 'error-line'"):
        Settings.from_env({"SMTRITON_FAILED_RECORD": "skip"})


def test_settings_are_immutable_and_copied_with_changes():
    s = Settings.from_env({})
    with pytest.raises(ValidationError):
        s.port = 1  # type: ignore[misc]
    assert s.model_copy(update={"port": 1}).port == 1
    assert Settings(port=9000, triton={"grpc_port": 9001}).triton.grpc_port == 9001


def test_allow_grpc_is_recognised_but_warned_about_as_without_effect(caplog):
    env = {"SAGEMAKER_TRITON_ALLOW_GRPC": "true"}
    assert not hasattr(Settings.from_env(env).triton, "allow_grpc")
    assert "SAGEMAKER_TRITON_ALLOW_GRPC" in known_variables()
    with caplog.at_level(logging.WARNING, logger="serve.settings"):
        warn_without_effect(env)
        warn_without_effect({"SAGEMAKER_TRITON_ALLOW_GRPC": ""})
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert "SAGEMAKER_TRITON_ALLOW_GRPC" in record.getMessage()
    assert "no effect" in record.getMessage()
    assert "loopback" in record.getMessage()


def test_flags_are_the_settings_serve_takes_as_options():
    options = set(cli.flags(cli.parser().parse_args([])))
    flagged = {name for name, field in Settings.model_fields.items() if (field.json_schema_extra or {}).get("flag")}
    assert options == flagged
    with pytest.raises(TypeError):
        Settings.from_env({}, request_timeout_s=5)


def test_docs_settings_md_is_generated_from_the_schema():
    assert (ROOT / "docs" / "settings.md").read_text() == markdown(), (
        "docs/settings.md is out of date: python -m smtriton.serve.settings_reference > docs/settings.md"
    )


def test_docs_name_every_variable():
    text = (ROOT / "docs" / "settings.md").read_text()
    for name in known_variables() | set(WITHOUT_EFFECT):
        assert f"`{name}`" in text, name


DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NAME = re.compile(r"\b((?:SMTRITON|SAGEMAKER)_[A-Z0-9_]*[A-Z0-9])\b")
# "`NAME` (16", "`NAME` (25 s", "`NAME` (64 KiB", "`NAME` (20 minutes": the default the prose states.
STATED = re.compile(r"`((?:SMTRITON|SAGEMAKER)_[A-Z0-9_]+)`\s*\((\d[\d,.]*)\s*(KiB|MiB|GiB|minutes|s\b)?")
UNITS = {None: 1, "s": 1, "KiB": 1024, "MiB": MIB, "GiB": 1024 * MIB, "minutes": 60}


def test_every_variable_the_docs_name_is_one_the_code_reads():
    """A name in README.md or docs/ is a setting of serve's schema, or read by a tool (its name in the source)."""
    source = "".join(path.read_text() for path in (ROOT / "smtriton").rglob("*.py"))
    known = known_variables() | set(WITHOUT_EFFECT)
    for doc in DOCS:
        for name in set(NAME.findall(doc.read_text())) - known:
            assert f'"{name}"' in source, f"{doc.name} names {name}, which nothing reads"


def test_the_defaults_the_docs_state_are_the_schemas():
    """Every "`VARIABLE` (default" in README.md and docs/ is what serve takes when the variable is unset."""
    defaults = Settings.from_env({})
    by_variable = {name: path for path, field in setting_fields(Settings) for name in variables_of(field)}
    stated = 0
    for doc in DOCS:
        for name, number, unit in STATED.findall(doc.read_text()):
            value = defaults
            for part in by_variable[name]:
                value = getattr(value, part)
            if value is None:  # unset means "not given" (SAGEMAKER_MAX_PAYLOAD_IN_MB): the prose says what then
                continue
            assert float(number.replace(",", "")) * UNITS[unit or None] == value, (doc.name, name, number, unit)
            stated += 1
    assert stated >= 10


def test_settings_md_says_what_the_code_does():
    from smtriton.serve.dataplane.batching.rule import model_batching

    rows = {line.split("|")[1].strip(" `"): line for line in markdown().splitlines() if line.startswith("| `")}
    assert "| 1024 |" in rows["SMTRITON_TRITON_WAIT_QUEUE"]  # a count, not "1 KiB"
    assert "| 64 KiB |" in rows["SMTRITON_MAX_HEADER_BYTES"]  # a size
    assert "`max_batch_size` ≥ 2" in rows["SMTRITON_MERGE_REQUESTS"]
    assert model_batching({"max_batch_size": 1, "dynamic_batching": {}}) is None  # one row merges with nothing
    assert "a CSV row that cannot be read" in rows["SMTRITON_FAILED_RECORD"]  # fails the whole body, error-line or not
    assert "files' blocks" in rows["SMTRITON_MODEL_MEMORY_FACTOR"]  # what multimodel.memory.tree_size counts


def test_serve_takes_sagemakers_serve_argument_and_each_flag_once():
    parsed = vars(cli.parser().parse_args(["serve", "--multi-model", "--port", "9000", "--model-root", "/m"]))
    assert parsed == {
        "mode": "serve",
        "model_repository": None,
        "model_root": Path("/m"),
        "multi_model": True,
        "port": 9000,
        "host": None,
        "workers": None,
        "default_model": None,
        "log_level": None,
    }
    assert vars(cli.parser().parse_args([]))["multi_model"] is None  # unset: $SAGEMAKER_MULTI_MODEL decides
    with pytest.raises(SystemExit) as exited:
        cli.parser().parse_args(["train"])
    assert exited.value.code == 2


def test_the_settings_reach_each_worker_unchanged():
    """The main process sends its settings to every front worker as JSON (their first message)."""
    settings = Settings.from_env(
        {
            "SAGEMAKER_BATCH": "true",
            "SAGEMAKER_MAX_PAYLOAD_IN_MB": "7",
            "SAGEMAKER_SAFE_PORT_RANGE": "20000-21000",
            "SAGEMAKER_TRITON_ADDITIONAL_ARGS": "--log-file 'a b'",
            "SAGEMAKER_TRITON_DISABLE_MODEL_NAMESPACING": "false",
            "SAGEMAKER_MODEL_SERVER_WORKERS": "3",
            "SMTRITON_WORK_DIR": "/tmp/x",
            "SMTRITON_METRICS_PORT": "9100",
        },
        multi_model=True,
    )
    assert Settings.model_validate(settings.model_dump(mode="json")) == settings


def test_the_default_worker_count_is_one_per_two_cpus_and_at_most_eight(monkeypatch):
    from smtriton.serve.host import cgroups

    for cpus, expected in ((1, 1), (2, 1), (3, 1), (4, 2), (16, 8), (17, 8), (96, 8), (192, 8)):
        monkeypatch.setattr(cgroups, "available_cpus", lambda cpus=cpus: cpus)
        assert Settings.from_env({}).workers == expected
    assert Settings.from_env({"SAGEMAKER_MODEL_SERVER_WORKERS": "12"}).workers == 12  # asked for: no cap
    assert Settings.from_env({}, workers=2).workers == 2


def test_the_stop_budget_is_shared_between_the_drain_and_triton():
    budget = Settings.from_env({}).stop_budget()
    assert (budget.drain_s, budget.triton_s) == (20.0, 5.0)  # 25 s in all
    assert (budget.accept_grace_s, budget.graceful_s, budget.close_s) == (2.0, pytest.approx(16.8), 1.0)
    short = Settings.from_env({"SMTRITON_SHUTDOWN_TIMEOUT_S": "6"}).stop_budget()
    assert (short.drain_s, short.triton_s) == (3.0, 3.0)  # Triton keeps at most half
    assert (short.accept_grace_s, short.graceful_s, short.close_s) == (0.3, pytest.approx(2.2), 0.3)


@pytest.mark.parametrize("seconds", ["0.5", "1", "2.5", "6", "10", "25", "30", "120", "3600"])
def test_a_workers_stop_adds_up_to_the_drain_before_the_pool_kills_it(seconds):
    """A worker's stop after SIGTERM, part by part: uvicorn's pauses, the accept grace, uvicorn's
    graceful wait, then the app's shutdown (the upstream pool closed). All of them fit in the drain, so
    the pool never kills a worker that is still inside its own parts."""
    from smtriton.serve.settings import UVICORN_PAUSES_S

    budget = Settings.from_env({"SMTRITON_SHUTDOWN_TIMEOUT_S": seconds}).stop_budget()
    parts = [UVICORN_PAUSES_S, budget.accept_grace_s, budget.graceful_s, budget.close_s]
    assert all(part >= 0 for part in parts)
    assert sum(parts) == pytest.approx(budget.drain_s)
    assert budget.drain_s + budget.triton_s == float(seconds)
    assert budget.close_s > 0
    assert budget.accept_grace_s > 0
    if budget.drain_s >= 1:  # below, uvicorn's own pauses take much of it
        assert budget.graceful_s >= budget.drain_s / 2  # the requests under way get the most of it


def test_available_cpus_are_the_affinity_bounded_by_the_cgroup_quota(monkeypatch):
    from smtriton.serve.host import cgroups

    class Quota:
        def __init__(self, cpus: float | None) -> None:
            self.cpus = cpus

        def quota(self) -> float | None:
            return self.cpus

    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(16)))
    monkeypatch.setattr(cgroups, "cpu_group", lambda: None)
    assert cgroups.available_cpus() == 16  # no CPU cgroup: the affinity
    for quota, expected in ((None, 16), (4.0, 4), (2.5, 2), (0.5, 1), (32.0, 16)):  # never above the affinity
        monkeypatch.setattr(cgroups, "cpu_group", lambda quota=quota: Quota(quota))
        assert cgroups.available_cpus() == expected, quota


def test_each_worker_keeps_a_share_of_the_upstream_connections():
    from smtriton.serve.http.worker import upstream_pool_size

    assert [upstream_pool_size(n) for n in (1, 2, 4, 8, 16, 64)] == [256, 128, 64, 32, 16, 16]

"""SageMaker variables keep their meaning (CONTRACT.md §1.4) but are parsed, never word-split."""

from pathlib import Path

import pytest

from smtriton.serve.settings import MIB, Settings, SettingsError


def test_defaults_match_the_sagemaker_container_contract():
    s = Settings.from_env({})
    assert (s.host, s.port) == ("0.0.0.0", 8080)
    assert s.model_repository == Path("/opt/ml/model")
    assert s.multi_model is False
    assert s.ping_mode == "ready"
    assert s.triton.log_verbose == 0  # B18: native defaults to verbose
    assert s.max_payload_bytes == 100 * MIB
    assert s.request_timeout_s == 60


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
    assert s.request_timeout_s == 600


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
    ],
)
def test_bad_values_are_refused_with_the_variable_named(env):
    with pytest.raises(SettingsError, match=next(iter(env)).replace("SMTRITON_LOG_LEVEL", "log level")):
        Settings.from_env(env)


def test_json_transcoding_threshold_defaults_to_64_kib_and_zero_turns_it_off():
    assert Settings.from_env({}).transcode_json_min_bytes == 64 * 1024
    assert Settings.from_env({"SMTRITON_TRANSCODE_JSON_MIN_BYTES": "0"}).transcode_json_min_bytes == 0

"""smtriton.model_config: the one reader, writer and renamer of config.pbtxt."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format

from smtriton import model_config
from smtriton.model_config import CONFIG_FILE, ConfigParseError

ENSEMBLE = """name: "ens"  # the entry
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN", data_type: TYPE_STRING, dims: [ -1 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 2 ] } ]
ensemble_scheduling { step [
  { model_name: "pre" model_version: -1 input_map { key: "X" value: "IN" } output_map { key: "Y" value: "mid" } },
  { model_name: "clf" model_version: -1 input_map { key: "X" value: "mid" } output_map { key: "Y" value: "OUT" } }
] }
parameters { key: "note" value { string_value: "café" } }
"""

# What MME staging and `smtriton package --rename` wrote for ENSEMBLE renamed to ens-1a2b with its
# step clf renamed to clf-3c4d before both used this module: the bytes must not change.
RENAMED = """name: "ens-1a2b"
platform: "ensemble"
max_batch_size: 8
input {
  name: "IN"
  data_type: TYPE_STRING
  dims: -1
}
output {
  name: "OUT"
  data_type: TYPE_FP32
  dims: 2
}
parameters {
  key: "note"
  value {
    string_value: "café"
  }
}
ensemble_scheduling {
  step {
    model_name: "pre"
    model_version: -1
    input_map {
      key: "X"
      value: "IN"
    }
    output_map {
      key: "Y"
      value: "mid"
    }
  }
  step {
    model_name: "clf-3c4d"
    model_version: -1
    input_map {
      key: "X"
      value: "mid"
    }
    output_map {
      key: "Y"
      value: "OUT"
    }
  }
}
"""


def model_dir(tmp_path: Path, text: str | bytes, name: str = "ens") -> Path:
    directory = tmp_path / name
    directory.mkdir()
    path = directory / CONFIG_FILE
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return directory


def test_parse_reads_the_text_format():
    config = model_config.parse(ENSEMBLE)
    assert (config.name, config.platform, config.max_batch_size) == ("ens", "ensemble", 8)
    assert [s.model_name for s in config.ensemble_scheduling.step] == ["pre", "clf"]
    assert model_config.data_type_name(config.input[0].data_type) == "TYPE_STRING"
    with pytest.raises(text_format.ParseError, match='no field named "nme"'):
        model_config.parse('nme: "x"')


def test_read_takes_a_model_directory_or_its_file(tmp_path):
    directory = model_dir(tmp_path, ENSEMBLE)
    assert model_config.read(directory) == model_config.read(directory / CONFIG_FILE) == model_config.parse(ENSEMBLE)


def test_read_errors_name_the_file_and_keep_protobufs_message(tmp_path):
    directory = model_dir(tmp_path, 'name: "m"\nmax_batch_size: "eight"\n', name="m")
    with pytest.raises(ConfigParseError) as caught:
        model_config.read(directory)
    assert caught.value.path == directory / CONFIG_FILE
    assert caught.value.reason.startswith("2:17 : ")
    assert "max_batch_size" in caught.value.reason
    assert str(caught.value) == f"{directory / CONFIG_FILE}: {caught.value.reason}"

    latin1 = model_dir(tmp_path, 'name: "caf\xe9"'.encode("latin-1"), name="latin1")
    with pytest.raises(ConfigParseError, match="utf-8") as caught:
        model_config.read(latin1)
    assert caught.value.path == latin1 / CONFIG_FILE
    with pytest.raises(FileNotFoundError):
        model_config.read(tmp_path / "absent" / CONFIG_FILE)


def test_rename_keeps_the_bytes_staging_and_packaging_always_wrote(tmp_path):
    config = model_config.read(model_dir(tmp_path, ENSEMBLE))
    assert model_config.rename(config, "ens-1a2b", {"clf": "clf-3c4d", "absent": "other"})
    assert model_config.to_text(config) == RENAMED
    written = model_config.write(config, tmp_path / "ens")
    assert written.read_bytes() == RENAMED.encode()
    assert sorted(p.name for p in written.parent.iterdir()) == [CONFIG_FILE]  # no temporary file left


def test_rename_reports_whether_anything_changed():
    config = model_config.parse(ENSEMBLE)
    assert not model_config.rename(config, None, {})
    assert not model_config.rename(config, "ens", {"absent": "other"})
    assert config == model_config.parse(ENSEMBLE)
    # A step named in the renames counts as changed even when its name stays (packaging re-writes it).
    assert model_config.rename(config, None, {"pre": "pre"})


def test_round_trip_through_text_and_file(tmp_path):
    config = model_config.parse(ENSEMBLE)
    assert model_config.parse(model_config.to_text(config)) == config
    (tmp_path / "m").mkdir()
    path = model_config.write(config, tmp_path / "m")
    assert path == tmp_path / "m" / CONFIG_FILE
    assert model_config.read(path) == config
    assert path.read_text(encoding="utf-8") == model_config.to_text(config)


def test_small_queries(tmp_path):
    assert model_config.is_ensemble(model_config.parse(ENSEMBLE))
    assert not model_config.is_ensemble(model_config.parse('# platform: "ensemble"\nbackend: "python"'))
    assert model_config.served_name(model_config.parse('backend: "python"'), tmp_path / "dir") == "dir"
    assert model_config.served_name(model_config.parse('name: "m"'), tmp_path / "dir") == "m"
    assert model_config.data_type_name(model_config.parse("input { name: 'x' }").input[0].data_type) == "TYPE_INVALID"

import orjson

from smtriton.serve.errors import error_body, strip_repository_paths


def test_error_body_is_compact_single_key_json():
    assert error_body("boom") == b'{"error":"boom"}'
    assert orjson.loads(error_body('quote " and \n newline')) == {"error": 'quote " and \n newline'}


def test_repository_paths_are_stripped_from_model_names():
    message = "load failed for model '/opt/ml/models/hashO::o.tar.gz': version 1 is at UNAVAILABLE state"
    assert strip_repository_paths(message) == "load failed for model 'o.tar.gz': version 1 is at UNAVAILABLE state"
    assert strip_repository_paths("Request for unknown model: 'addsub'") == "Request for unknown model: 'addsub'"

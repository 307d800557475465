"""The hops' token ids: integers only, as JSON over HTTP and as Python ints over the pickled hop."""

import json

import pydantic
import pytest

from serving.protocol import SpmIds, TokenIds


@pytest.mark.parametrize("ids_type", [TokenIds, SpmIds], ids=["model ids", "SentencePiece ids"])
@pytest.mark.parametrize("bad", [True, False, 1023.0, "1023"])
@pytest.mark.parametrize("mode", ["json", "python"], ids=["over HTTP", "pickled hop"])
def test_an_id_is_an_integer_not_a_boolean_float_or_string(
    ids_type: object, bad: object, mode: str
) -> None:
    # Inside the graph the tokenizer pickles its calls, and BentoML validates them in Python mode.
    adapter = pydantic.TypeAdapter(ids_type)
    validate = adapter.validate_json if mode == "json" else adapter.validate_python

    def sent(ids: list[list[object]]) -> object:
        return json.dumps(ids) if mode == "json" else ids

    assert validate(sent([[101, 1023, 102]])) == [[101, 1023, 102]]
    with pytest.raises(pydantic.ValidationError, match="valid integer"):
        validate(sent([[101, bad, 102]]))

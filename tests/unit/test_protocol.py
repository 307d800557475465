"""The hops' token ids: integers only, as JSON over HTTP and as Python ints over the pickled hop."""

import pydantic
import pytest

from serving.protocol import SpmIds, TokenIds


@pytest.mark.parametrize("ids_type", [TokenIds, SpmIds], ids=["MiniLM ids", "SentencePiece ids"])
@pytest.mark.parametrize("bad", ["true", "false", "1023.0", '"1023"'])
def test_an_id_is_a_json_integer_not_a_boolean_float_or_string(ids_type: object, bad: str) -> None:
    adapter = pydantic.TypeAdapter(ids_type)
    assert adapter.validate_json("[[101, 1023, 102]]") == [[101, 1023, 102]]
    with pytest.raises(pydantic.ValidationError, match="valid integer"):
        adapter.validate_json(f"[[101, {bad}, 102]]")


@pytest.mark.parametrize("ids_type", [TokenIds, SpmIds], ids=["MiniLM ids", "SentencePiece ids"])
@pytest.mark.parametrize("bad", [True, False, 1023.0, "1023"])
def test_the_pickled_hop_takes_python_ints_only(ids_type: object, bad: object) -> None:
    # Inside the graph the tokenizer pickles its calls; BentoML validates them in Python mode.
    adapter = pydantic.TypeAdapter(ids_type)
    assert adapter.validate_python([[101, 1023, 102]]) == [[101, 1023, 102]]
    with pytest.raises(pydantic.ValidationError, match="valid integer"):
        adapter.validate_python([[101, bad, 102]])

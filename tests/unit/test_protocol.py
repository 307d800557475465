"""The hop protocol's token ids: JSON integers only, as the tokenizer sends them."""

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

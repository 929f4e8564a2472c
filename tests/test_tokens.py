import pytest
import torch

from p0circuit import BadInputError, ModelSpec, check_tokens, to_tokens


@pytest.fixture(scope="module")
def model():
    return ModelSpec(n_layers=1, d_model=16, n_heads=2, d_head=8, d_mlp=32, d_vocab=20, n_ctx=12).build()


def test_prepend_bos_is_required(model):
    with pytest.raises(TypeError, match="prepend_bos"):
        to_tokens(model, "hello")  # type: ignore[call-arg]
    with pytest.raises(BadInputError, match="prepend_bos must be True or False"):
        to_tokens(model, "hello", prepend_bos=None)  # type: ignore[arg-type]


def test_text_needs_a_tokenizer(model):
    with pytest.raises(BadInputError, match="has no tokenizer"):
        to_tokens(model, "hello", prepend_bos=False)


@pytest.mark.parametrize(
    "tokens,msg",
    [
        ([[1, 2]], "must be a torch LongTensor"),
        (torch.zeros(2, 3), "must hold integer token ids"),
        (torch.zeros(0, 3, dtype=torch.long), "empty batch"),
        (torch.zeros(2, 1, dtype=torch.long), "sequence length 1 but this needs at least 2"),
        (torch.zeros(1, 13, dtype=torch.long), "n_ctx=12"),
        (torch.tensor([[1, 20]]), r"out of the vocabulary: range \[1, 20\] but d_vocab=20"),
        (torch.tensor([[-1, 2]]), "out of the vocabulary"),
        (torch.zeros(1, 2, 2, dtype=torch.long), "must be 2-D"),
    ],
)
def test_bad_tokens(model, tokens, msg):
    with pytest.raises(BadInputError, match=msg):
        check_tokens(model, tokens, min_len=2)


def test_good_tokens_pass_and_1d_is_promoted(model):
    assert check_tokens(model, torch.tensor([1, 2, 3])).shape == (1, 3)

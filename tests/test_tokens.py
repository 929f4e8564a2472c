import pytest
import torch

import p0circuit as p0
from p0circuit.models import tokens as p0_tokens
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
        (torch.tensor([[-1, 2]]), r"holds negative ids \(down to -1\); token ids count from 0"),
        (torch.zeros(1, 2, 2, dtype=torch.long), "must be 2-D"),
    ],
)
def test_bad_tokens(model, tokens, msg):
    with pytest.raises(BadInputError, match=msg):
        check_tokens(model, tokens, min_len=2)


def test_good_tokens_pass_and_1d_is_promoted(model):
    assert check_tokens(model, torch.tensor([1, 2, 3])).shape == (1, 3)


@pytest.fixture(scope="module")
def worded():
    """A spec model with the local word-level tokenizer (BOS id 0, words w3..w63)."""
    from family_configs import make_tokenizer

    m = ModelSpec(n_layers=1, d_model=16, n_heads=2, d_head=8, d_mlp=32, d_vocab=64, n_ctx=12).build()
    m.tokenizer = make_tokenizer()
    return m


def test_text_that_begins_with_the_bos_string_is_caught(worded):
    assert to_tokens(worded, "w3 w4", prepend_bos=True).tolist() == [[0, 3, 4]]
    assert to_tokens(worded, "w3 w4", prepend_bos=False).tolist() == [[3, 4]]
    with pytest.raises(BadInputError, match=r"says no BOS, but 1 of 2 rows start with the BOS id 0 \(rows \[1\]\)"):
        to_tokens(worded, ["w5 w4", "<bos> w4"], prepend_bos=False)
    with pytest.raises(BadInputError, match=r"rows \[0\] start with the BOS id 0 twice"):
        to_tokens(worded, "<bos> w3", prepend_bos=True)


def test_token_tensors_are_checked_against_the_bos_choice(worded):
    with_bos, without = torch.tensor([[0, 5, 6], [0, 7, 8]]), torch.tensor([[5, 6, 7], [0, 7, 8]])
    assert check_tokens(worded, with_bos, bos=True).equal(with_bos)
    assert check_tokens(worded, without, bos=None).equal(without)  # no claim, no check
    with pytest.raises(BadInputError, match="says no BOS, but 2 of 2 rows"):
        check_tokens(worded, with_bos, bos=False)
    with pytest.raises(BadInputError, match=r"says BOS, but 1 of 2 rows do not start with the BOS id 0 \(rows \[0\]\)"):
        check_tokens(worded, without, bos=True)
    with pytest.raises(BadInputError, match="bos must be True, False or None"):
        check_tokens(worded, with_bos, bos="yes")


def test_bos_claims_reach_every_entry_point(worded):
    """sink_report, patching and discover all check the claim (and the BOS-keyed plant knows its BOS id)."""
    import p0circuit as p0

    toks = torch.tensor([[0, 5, 6, 9], [0, 7, 8, 9]])
    with pytest.raises(BadInputError, match="says no BOS"):
        p0.sink_report(worded, toks, bos=False)
    assert p0.sink_report(worded, toks, bos=True).n_prompts == 2
    plant = p0.build_planted(p0.PlantSpec(key="bos", bos_id=0))
    starts = torch.tensor([[0, 5, 6, 7, 8], [0, 9, 10, 11, 12]])
    for call in (lambda: p0.activation_patch(plant.model, starts, bos=False),
                 lambda: p0.path_patch(plant.model, starts, bos=False),
                 lambda: p0.attribution_patch(plant.model, starts, bos=False),
                 lambda: p0.discover(plant.model, starts, bos=False)):
        with pytest.raises(BadInputError, match="says no BOS, but 2 of 2 rows start with the BOS id 0"):
            call()
    assert p0.activation_patch(plant.model, starts, bos=True).signal


def test_meta_tokens_and_split_or_mismatched_models_are_rejected():
    import p0circuit as p0

    tokens = torch.tensor([[1, 2, 3]])
    m = ModelSpec(n_layers=2, d_model=16, n_heads=2, d_head=8, d_mlp=32, d_vocab=20, n_ctx=12).build()
    with pytest.raises(BadInputError, match="on the meta device and hold no data"):
        check_tokens(m, tokens.to("meta"))
    m.blocks[1].to("meta")
    for call in (lambda: p0.sink_report(m, tokens), lambda: p0.activation_patch(m, tokens)):
        with pytest.raises(BadInputError, match=r"weights are on several devices \['cpu', 'meta'\]"):
            call()
    m = ModelSpec(n_layers=2, d_model=16, n_heads=2, d_head=8, d_mlp=32, d_vocab=20, n_ctx=12).build()
    m.cfg.n_devices = 2  # TransformerLens' split over devices: refused, never moved silently
    with pytest.raises(BadInputError, match=r"split over 2 devices \(TransformerLens' n_devices=2\).*n_devices=1"):
        p0.sink_report(m, tokens)
    m = ModelSpec(n_layers=2, d_model=16, n_heads=2, d_head=8, d_mlp=32, d_vocab=20, n_ctx=12).build()
    m.blocks[0].half()
    with pytest.raises(BadInputError, match="weights mix dtypes"):
        p0.sink_report(m, tokens)
    m = ModelSpec(n_layers=2, d_model=16, n_heads=2, d_head=8, d_mlp=32, d_vocab=20, n_ctx=12).build()
    m.cfg.device = "cuda"  # what a half-done move leaves behind
    with pytest.raises(BadInputError, match="model.cfg.device is 'cuda' but the weights are on cpu"):
        p0.activation_patch(m, tokens)


def test_text_windows_give_equal_length_prompts(worded):
    import p0circuit as p0

    text = " ".join(f"w{3 + i % 60}" for i in range(20))  # w3 .. w22
    plain = p0.text_windows(worded, text, 3, 5, prepend_bos=False)
    assert plain.tolist() == [[3, 4, 5, 6, 7], [8, 9, 10, 11, 12], [13, 14, 15, 16, 17]]
    with_bos = p0.text_windows(worded, text, 2, 5, prepend_bos=True)
    assert with_bos.tolist() == [[0, 3, 4, 5, 6], [0, 7, 8, 9, 10]]
    with pytest.raises(BadInputError, match="holds 20 tokens, fewer than 5 windows of 5 need"):
        p0.text_windows(worded, text, 5, 5, prepend_bos=False)
    with pytest.raises(BadInputError, match="prepend_bos must be True or False"):
        p0.text_windows(worded, text, 2, 5, prepend_bos=None)
    with pytest.raises(BadInputError, match="says no BOS, but 1 of 2 rows start with the BOS id"):
        p0.text_windows(worded, "w3 w4 <bos> w5 w6 w7", 2, 2, prepend_bos=False)


def test_english_prompts_refuse_what_they_cannot_give(worded):
    lines = p0_tokens.english_lines()
    assert len(lines) == 201 and len(set(lines)) == 201
    assert all(line[0].isupper() and line.endswith((".", "?")) for line in lines)
    with pytest.raises(BadInputError, match="at most 201"):
        p0.english_prompts(worded, 202, 8, prepend_bos=False)
    with pytest.raises(BadInputError, match="prepend_bos must be True or False"):
        p0.english_prompts(worded, 2, 8, prepend_bos=None)
    spec_model = p0.ModelSpec(n_layers=1, d_vocab=64, n_ctx=16).build()
    with pytest.raises(BadInputError, match="need a tokenizer"):
        p0.english_prompts(spec_model, 2, 8, prepend_bos=False)
    made = p0.make_prompts(spec_model, 3, 8, source="auto", seed=1)
    assert made.source == "regular" and "regular random-id prompts" in made.describe()
    with pytest.raises(BadInputError, match="not one of auto, english, random, regular"):
        p0.make_prompts(spec_model, 3, 8, source="books")


def test_the_bos_prepended_is_said_and_chosen(worded):
    assert p0.bos_label(worded) == "BOS '<bos>' (id 0)"
    assert p0.to_tokens(worded, "w4 w5", prepend_bos=True)[0, 0] == 0
    worded.tokenizer.bos_token = "<unk>"  # a "BOS" that is no start-of-text token
    try:
        with pytest.raises(BadInputError, match=r"bos_token is '<unk>' \(id 2\), which is not a start-of-text"):
            p0.to_tokens(worded, "w4 w5", prepend_bos=True)
        with pytest.raises(BadInputError, match="not a start-of-text"):
            p0.probe_tokens(worded, 2, 4, bos=True)
        assert p0.to_tokens(worded, "w4 w5", prepend_bos=False).shape == (1, 2)  # no BOS: nothing to refuse
        assert p0.set_bos(worded, "<eos>") == 1
        assert p0.bos_label(worded) == "BOS '<eos>' (id 1)"
        assert p0.to_tokens(worded, "w4 w5", prepend_bos=True).tolist() == [[1, 4, 5]]
        with pytest.raises(BadInputError, match="not a token of this tokenizer"):
            p0.set_bos(worded, "<nope>")
        with pytest.raises(BadInputError, match="outside the vocabulary"):
            p0.set_bos(worded, 10_000)
    finally:
        worded.tokenizer.bos_token = "<bos>"
        delattr(worded, p0_tokens.BOS_ATTR)

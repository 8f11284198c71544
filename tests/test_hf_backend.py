"""HF backend on a tiny local model: greedy matches model.generate, batching does not change
results, n samples, stop strings, token counts and timing."""
from __future__ import annotations

import pytest
import torch

from anchored_reasoning.backends import get_backend
from anchored_reasoning.backends.hf import HFBackend, fair_shares, local_fingerprint, row_seed
from anchored_reasoning.errors import ConfigError
from anchored_reasoning.testing import make_tiny_causal_lm
from anchored_reasoning.types import Prompt, SamplingSpec

torch.set_num_threads(1)

PROMPTS = [
    Prompt("Question: Natalia sold clips to 48 of her friends in April"),
    Prompt("def add(a, b):"),
    Prompt("Every wumpus is a tumpus. Alex is a wumpus. True or false:"),
    Prompt("0 1 2"),
    Prompt("The quick brown fox jumps over the lazy dog. Step 1: 16 - 3 - 4 = 9."),
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(make_tiny_causal_lm(tmp_path_factory.mktemp("tiny")))


@pytest.fixture(scope="module")
def backend(tiny):
    return HFBackend(tiny, batch_size=4, device="cpu")


def test_registry_builds_hf_backend(tiny):
    b = get_backend("hf", tiny, batch_size=2)
    assert isinstance(b, HFBackend) and b.batch_size == 2
    d = b.describe()
    assert d["backend"] == "hf" and d["model"] == tiny and d["dtype"] == "float32"
    assert d["revision"] == local_fingerprint(tiny) and d["revision"].startswith("local-sha256:")


def test_greedy_equals_model_generate_per_prompt(backend):
    spec = SamplingSpec(max_new_tokens=12)
    outs = backend.generate(PROMPTS, spec)
    tok, model = backend.tokenizer, backend.model
    for prompt, (comp,) in zip(PROMPTS, outs):
        enc = tok(prompt.text, return_tensors="pt")
        ref = model.generate(**enc, max_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id)
        gen = [t for t in ref[0, enc["input_ids"].shape[1]:].tolist() if t not in backend.strip_ids]
        assert comp.text == tok.decode(gen), prompt.text
        assert comp.n_tokens == ref.shape[1] - enc["input_ids"].shape[1] or comp.finish_reason == "stop"
        assert comp.seconds > 0


def test_batched_equals_single(tiny, backend):
    single = HFBackend(tiny, batch_size=1)
    spec = SamplingSpec(max_new_tokens=16)
    assert [c[0].text for c in backend.generate(PROMPTS, spec)] == [c[0].text for c in single.generate(PROMPTS, spec)]
    # Sampling is seeded per (prompt, sample), so the batch a prompt lands in does not matter either.
    spec = SamplingSpec(max_new_tokens=16, temperature=1.0, n=2, seed=7)
    batched = [[s.text for s in c] for c in backend.generate(PROMPTS, spec)]
    alone = [[s.text for s in c] for c in single.generate(PROMPTS, spec)]
    assert batched == alone
    subset = [[s.text for s in c] for c in backend.generate(PROMPTS[2:4], spec)]
    assert subset == batched[2:4]


def test_n_samples_seeded(backend):
    spec = SamplingSpec(max_new_tokens=10, temperature=1.0, n=3, seed=1)
    outs = backend.generate(PROMPTS[:2], spec)
    assert [len(o) for o in outs] == [3, 3]
    assert len({c.text for c in outs[0]}) > 1  # a random tiny model at temperature 1 does not repeat itself
    again = backend.generate(PROMPTS[:2], spec)
    assert [[c.text for c in o] for o in again] == [[c.text for c in o] for o in outs]
    other = backend.generate(PROMPTS[:2], SamplingSpec(max_new_tokens=10, temperature=1.0, n=3, seed=2))
    assert [[c.text for c in o] for o in other] != [[c.text for c in o] for o in outs]
    # top_p close to 0 keeps only the most likely token: sampling becomes greedy.
    nucleus = backend.generate(PROMPTS[:2], SamplingSpec(max_new_tokens=10, temperature=1.0, top_p=1e-6, n=2))
    greedy = backend.generate(PROMPTS[:2], SamplingSpec(max_new_tokens=10))
    assert [o[0].text for o in nucleus] == [o[0].text for o in greedy] == [o[1].text for o in nucleus]


def test_greedy_n_copies(backend):
    outs = backend.generate(PROMPTS[:1], SamplingSpec(max_new_tokens=8, n=3))
    assert len(outs[0]) == 3 and len({c.text for c in outs[0]}) == 1


def test_stop_string_cuts_text_and_stops_early(backend):
    free = backend.generate(PROMPTS, SamplingSpec(max_new_tokens=24))
    # Pick, for each prompt, a short string from the middle of its unstopped greedy output.
    for prompt, (full,) in zip(PROMPTS, free):
        text = full.text
        if len(text) < 12:
            continue
        stop = text[6:9]
        first = text.find(stop)
        (cut,) = backend.generate([prompt], SamplingSpec(max_new_tokens=24, stop=[stop]))[0:1]
        assert cut[0].text == text[:first]
        assert cut[0].finish_reason == "stop"
        assert cut[0].n_tokens < full.n_tokens
        return
    pytest.fail("no prompt produced a long enough greedy output to test stop strings")


def test_max_new_tokens_and_finish_reason(backend):
    outs = backend.generate(PROMPTS, SamplingSpec(max_new_tokens=5))
    for (c,) in outs:
        assert 1 <= c.n_tokens <= 5
        assert c.finish_reason in ("length", "stop")
        assert (c.finish_reason == "length") == (c.n_tokens == 5)


def test_chat_modes(tiny):
    b = HFBackend(tiny, chat="auto")  # the tiny tokenizer has no chat template: raw text is used
    p = Prompt("hello", messages=[{"role": "user", "content": "hello"}])
    assert not b.uses_chat(p)
    assert b.encode(p) == list(b.tokenizer("hello")["input_ids"])
    with pytest.raises(ConfigError):
        HFBackend(tiny, chat="on")
    with pytest.raises(ConfigError):
        HFBackend(tiny, chat="maybe")
    with pytest.raises(ConfigError):
        HFBackend(tiny, dtype="int3")


def test_chat_template_is_applied(tiny, tmp_path):
    import shutil

    from transformers import AutoTokenizer

    path = tmp_path / "chat"
    shutil.copytree(tiny, path)
    tok = AutoTokenizer.from_pretrained(path)
    tok.chat_template = "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
    tok.save_pretrained(path)
    b = HFBackend(str(path))
    p = Prompt("raw text", messages=[{"role": "user", "content": "1 + 1"}])
    assert b.uses_chat(p)
    assert b.tokenizer.decode(b.encode(p)) == "<s>user: 1 + 1\nassistant:"
    assert HFBackend(str(path), chat="off").encode(p) == list(b.tokenizer("raw text")["input_ids"])


def test_fair_shares_and_row_seed():
    # step 0 shared by both rows; steps 1 and 2 only row 1 runs: weights 0.5 and 2.5
    assert fair_shares([1, 3], 6.0) == pytest.approx([1.0, 5.0])
    assert fair_shares([4, 4, 4, 4], 2.0) == pytest.approx([0.5] * 4)
    assert fair_shares([], 1.0) == []
    assert row_seed(0, [1, 2], 0) == row_seed(0, [1, 2], 0)
    assert len({row_seed(0, [1, 2], 0), row_seed(0, [1, 2], 1), row_seed(1, [1, 2], 0), row_seed(0, [2, 1], 0)}) == 4


def test_empty_prompt_starts_from_bos(backend):
    (c,) = backend.generate([Prompt("")], SamplingSpec(max_new_tokens=4))[0:1]
    assert 1 <= c[0].n_tokens <= 4


def test_bad_spec(backend):
    with pytest.raises(ConfigError):
        backend.generate(PROMPTS[:1], SamplingSpec(n=0))
    with pytest.raises(ConfigError):
        backend.generate(PROMPTS[:1], SamplingSpec(temperature=1.0, top_p=0.0))


def test_generation_stops_at_a_learned_position_table(tmp_path, backend, caplog):
    """A GPT-2 model has n_positions positions: a prompt plus max_new_tokens past them used to raise
    IndexError in the position embedding (and crash a run's validation); now the budget is cut to the room
    left, and a prompt that fills the table gets an empty completion, both ending with 'length'."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from anchored_reasoning.testing import train_tiny_tokenizer

    tok = train_tiny_tokenizer(tmp_path, vocab_size=300)
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=32, n_embd=32, n_layer=1, n_head=2,
                               bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)).save_pretrained(tmp_path)
    gpt2 = HFBackend(str(tmp_path), batch_size=4, device="cpu")
    assert gpt2.max_positions() == 32 and backend.max_positions() is None  # the Llama model: rotary, no table
    long, mid, short = Prompt("wumpus " * 40), Prompt("wumpus " * 4), Prompt("Tom")
    n_mid = len(gpt2.encode(mid))
    assert len(gpt2.encode(long)) >= 32 > n_mid
    with caplog.at_level("WARNING"):
        (a,), (b,), (c,) = gpt2.generate([long, mid, short], SamplingSpec(max_new_tokens=100))
    assert (a.text, a.n_tokens, a.finish_reason) == ("", 0, "length")
    assert 1 <= b.n_tokens <= 32 - n_mid and 1 <= c.n_tokens <= 32 - n_mid  # one batch: the longest prompt's room
    assert "fill the model's 32 positions" in caplog.text and "is cut to the room" in caplog.text

"""Exact-length text: filler lines, fitting from piece streams, and tokenizers without line splits."""

import numpy as np
import pytest

from kvbench.engine.hf_tokenizer import HFTokenizer
from kvbench.workloads import text
from kvbench.workloads.dists import IntDist
from kvbench.workloads.text_fit import PieceCounter, filler_line, fit_text


def test_filler_lines_have_exactly_the_asked_count(tokenizer):
    counter, rng = PieceCounter(tokenizer), np.random.default_rng(0)
    for num_tokens in range(1, 120):
        line = filler_line(counter, num_tokens, rng)
        assert len(tokenizer.encode(line)) == num_tokens
        assert line.endswith("\n") and not line[0].isspace()


def iter_with_opener(opener, stream):
    yield opener
    yield from stream


@pytest.mark.parametrize("stream", ["question", "reply", "task", "document", "observation"])
def test_fitted_texts_are_exact_and_deterministic(tokenizer, stream):
    def pieces(rng):
        return {
            "question": text.question_lines,
            "reply": text.reply_pieces,
            "task": text.task_lines,
            "document": lambda r: iter_with_opener("Document:\n", text.document_pieces(r)),
            "observation": lambda r: text.observation_pieces(r, text.AGENT_TOOLS[3], 1),
        }[stream](rng)

    counter = PieceCounter(tokenizer)
    for num_tokens in (16, 17, 50, 333, 1000):
        rng = np.random.default_rng(num_tokens)
        fitted = fit_text(counter, pieces(rng), num_tokens, rng)
        assert len(tokenizer.encode(fitted)) == num_tokens
        again = np.random.default_rng(num_tokens)
        assert fit_text(counter, pieces(again), num_tokens, again) == fitted


def test_every_piece_starts_with_non_whitespace_and_ends_with_a_newline():
    rng = np.random.default_rng(3)
    streams = [
        text.question_lines(rng),
        text.followup_lines(rng),
        text.reply_pieces(rng),
        text.task_lines(rng),
        text.document_pieces(rng),
        text.system_prompt_pieces(rng, "Role.\n", text.AGENT_TOOLS),
    ]
    streams += [text.observation_pieces(rng, tool, 2) for tool in text.AGENT_TOOLS]
    for stream in streams:
        for _ in range(40):
            piece = next(stream)
            assert piece.endswith("\n") and not piece[0].isspace(), piece


def test_an_opening_line_longer_than_the_target_is_an_error(tokenizer):
    with pytest.raises(ValueError, match="too short"):
        fit_text(
            PieceCounter(tokenizer),
            text.question_lines(np.random.default_rng(0)),
            3,
            np.random.default_rng(0),
        )


def test_fitting_under_a_tokenizer_without_line_splits_checks_real_counts(hf_checkpoint):
    hf = HFTokenizer(hf_checkpoint)
    assert not hf.splits_at_lines
    counter = PieceCounter(hf)
    for num_tokens in (40, 97, 256):
        rng = np.random.default_rng(num_tokens)
        fitted = fit_text(counter, text.reply_pieces(rng), num_tokens, rng)
        assert len(hf.encode(fitted)) == num_tokens


def test_int_distributions_parse_sample_and_round_trip():
    rng = np.random.default_rng(0)
    assert IntDist.parse(6).sample(rng, 3).tolist() == [6, 6, 6]
    uniform = IntDist.parse("uniform:2,4")
    assert set(uniform.sample(rng, 200).tolist()) == {2, 3, 4}
    assert uniform.spec == "uniform:2,4" and IntDist.parse(uniform.spec) == uniform
    assert IntDist.parse("geometric:5").sample(rng, 2000).mean() == pytest.approx(5, rel=0.1)
    lognormal = IntDist.parse("lognormal:300,0.6")
    assert np.median(lognormal.sample(rng, 4000)) == pytest.approx(300, rel=0.05)
    assert IntDist.parse("lognormal:2,3").sample(rng, 500, minimum=16).min() == 16
    for bad in ("poisson:3", "uniform:5,2", "uniform:1", "lognormal:a,b", "const:0", 2.5, True):
        with pytest.raises(ValueError):
            IntDist.parse(bad)

"""The record's derived numbers: TPOT is computed once, from the record's own times."""

import pytest

from kvbench.request import RequestRecord, Status


def test_tpot_is_vllms_e2e_minus_ttft_over_the_tokens_after_the_first():
    record = RequestRecord(Status.OK, 100, output_tokens=5, ttft_ms=120.0, e2e_ms=280.0)
    assert record.tpot_ms == pytest.approx(40.0)
    assert record.tpot_ms == (280.0 - 120.0) / 4  # the same expression, the same bits


@pytest.mark.parametrize(
    ("output_tokens", "ttft_ms", "e2e_ms"),
    [(1, 50.0, 50.0), (0, None, None), (5, None, 80.0), (5, 50.0, None)],
)
def test_tpot_is_none_without_two_tokens_or_without_times(output_tokens, ttft_ms, e2e_ms):
    record = RequestRecord(Status.OK, 10, output_tokens=output_tokens, ttft_ms=ttft_ms, e2e_ms=e2e_ms)
    assert record.tpot_ms is None


def test_tpot_cannot_be_set_apart_from_the_times():
    with pytest.raises(TypeError):
        RequestRecord(Status.OK, 10, output_tokens=3, ttft_ms=1.0, e2e_ms=3.0, tpot_ms=7.0)

"""A hybrid member's measured rates: its device's decode seconds per sample and its training step."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from unstall.prep.rates import MemberRates  # noqa: E402


def test_rates_are_reported_once_decode_and_step_were_both_measured() -> None:
    r = MemberRates()
    assert r.timed(torch.device("cpu"), 4, lambda: torch.ones(256, 256).sum()) == 256 * 256
    assert r.report() is None, "no step measured yet"
    r.stepped(0.1)
    first = r.report()
    assert first is not None and first.decode_s_per_sample > 0 and first.step_s == pytest.approx(0.1)
    r.stepped(0.2)  # a moving average: the newest step weighs a fifth
    assert r.report() == type(first)(first.decode_s_per_sample, pytest.approx(0.12))


def test_a_batch_the_sidecar_prepared_whole_is_not_timed() -> None:
    r = MemberRates()
    r.stepped(0.1)
    assert r.timed(torch.device("cpu"), 0, lambda: "prepared") == "prepared"
    assert r.report() is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (events on the decoding stream)")
def test_on_cuda_the_decode_is_timed_by_events_read_once_they_completed() -> None:
    r = MemberRates()
    r.stepped(0.1)
    device = torch.device("cuda")
    x = torch.ones(2048, 2048, device=device)
    r.timed(device, 8, lambda: x @ x)
    torch.cuda.synchronize()
    r.timed(device, 8, lambda: x @ x)  # reads the first batch's events, which completed
    report = r.report()
    assert report is not None and report.decode_s_per_sample > 0

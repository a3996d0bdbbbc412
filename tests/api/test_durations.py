import pytest

from kubeinfer_operator.api import format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("500ms", 0.5), ("2m", 120), ("1h30m", 5400), ("1.5s", 1.5), ("0s", 0), ("1m30s500ms", 90.5)],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["5 minutes", "5", "", "-1s", "1d", "ms", "1.s", "2m "])
def test_parse_duration_refuses_with_an_example(text: str) -> None:
    with pytest.raises(ValueError, match=r"e\.g\. 500ms, 2m, 1h30m"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.2123, "212ms"), (0.9996, "1s"), (3.5, "3.5s"), (59.999, "1m"), (125, "2m5s"), (5400, "1h30m")],
)
def test_format_duration_is_short_and_parses_back(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == pytest.approx(seconds, rel=0.01)

"""The device guard's one kernel (runtime/guard.py ``ingest``), several fields per launch: each field narrowed
into its buffer, a bad value replaced (a length clamped, a row by 0), padding written as the fill, the first
bad value of the first bad field recorded (field, row, value), and a gated launch skipped when the word says
so. Run in Triton's interpreter by the suite (TRITON_INTERPRET=1), its torch twin otherwise; checked by hand."""

import pytest
import torch

from attnmeta.runtime.guard import SENTINEL, Feed, ingest


def feeds(bad_field: int | None):
    """Five fields (two launches: four, then one); field k's row 1 is bad when k == bad_field."""
    out = []
    for k in range(5):
        src = torch.tensor([3, 4, 5], dtype=torch.int64 if k % 2 else torch.int32)
        if k == bad_field:
            src[1] = 99
        out.append(Feed(src, torch.full((3,), -7, dtype=torch.int32), 3, 1, 10, clamp=k % 2 == 0, field=k))
    return out


@pytest.mark.parametrize("bad", [None, 0, 2, 4])
def test_every_field_is_narrowed_and_the_first_bad_one_recorded(bad):
    flag = torch.zeros(4, dtype=torch.int64)
    fs = feeds(bad)
    ingest(fs, flag)
    for k, f in enumerate(fs):
        want = [3, 4, 5] if k != bad else [3, 10 if f.clamp else 0, 5]  # a length clamped, a row replaced by 0
        assert f.dst.tolist() == want, k
    assert flag.tolist() == ([0, 0, 0, 0] if bad is None else [1, bad, 1, 99])


def test_a_recorded_value_is_not_overwritten_by_a_later_field():
    flag = torch.zeros(4, dtype=torch.int64)
    fs = feeds(1)
    fs[3].src[2] = -5
    ingest(fs, flag)
    assert flag.tolist() == [1, 1, 1, 99]  # field 1 row 1, not field 3 row 2
    assert fs[3].dst.tolist() == [3, 4, 0]


def test_padding_rows_take_the_fill_and_a_gated_feed_follows_the_word():
    flag, word = torch.zeros(4, dtype=torch.int64), torch.zeros(1, dtype=torch.int32)
    src = torch.tensor([2, SENTINEL, SENTINEL], dtype=torch.int64)
    f = Feed(src, torch.zeros(3, dtype=torch.int32), 3, 1, 10, clamp=False, field=0, fill=1, padded=True, when=1)
    ingest([f], flag, word=word)  # the word says 0: skipped
    assert f.dst.tolist() == [0, 0, 0]
    word.fill_(1)
    ingest([f], flag, word=word)
    assert f.dst.tolist() == [2, 1, 1] and flag.tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize("w", [0, 1])
def test_one_launch_serves_both_sides_of_the_word(w):
    """A graph bound to an engine's buffers: the staged copy (when 0) and the engine's buffer (when 1) of the
    same slot in one launch, beside an ungated field; only the side the word names writes the slot, and only
    its bad value is recorded."""
    flag, word = torch.zeros(4, dtype=torch.int64), torch.full((1,), w, dtype=torch.int32)
    dst, other = torch.full((2,), -7, dtype=torch.int32), torch.full((2,), -7, dtype=torch.int32)
    staged = Feed(torch.tensor([5, 50]), dst, 2, 1, 10, clamp=True, field=0, when=0)
    engine = Feed(torch.tensor([6, 7], dtype=torch.int32), dst, 2, 1, 10, clamp=True, field=1, when=1)
    always = Feed(torch.tensor([8, -1]), other, 2, 0, 10, clamp=False, field=2)
    ingest([staged, engine, always], flag, word=word)
    assert dst.tolist() == ([5, 10] if w == 0 else [6, 7])
    assert other.tolist() == [8, 0]
    assert flag.tolist() == ([1, 0, 1, 50] if w == 0 else [1, 2, 1, -1])


def test_a_gated_feed_without_the_word_is_refused():
    f = Feed(torch.tensor([1]), torch.zeros(1, dtype=torch.int32), 1, 0, 10, clamp=False, field=0, when=1)
    with pytest.raises(ValueError, match="needs the word"):
        ingest([f], torch.zeros(4, dtype=torch.int64))

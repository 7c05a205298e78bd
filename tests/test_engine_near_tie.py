"""The engine test's one allowance (``tests/gpu/test_sglang_engine.py``'s ``near_tie``): EAGLE on the FlashInfer
window model may part from plain decoding only where both tokens taken are among plain decoding's recorded likeliest,
each within one bf16 logit step of the likeliest. Hand cases: a tie either way, a gap past the step, a three-way
tie, a token outside the record, a difference where no step record exists."""

from tests.gpu.test_sglang_engine import NEAR_TIE, near_tie

PLAIN = [5, 7, 9, 11]


def test_an_exact_tie_broken_either_way_is_allowed():
    top2 = [[[5, -0.1], [6, -3.0]], [[7, -0.2], [8, -2.5]], [[9, -1.0], [4, -1.0]], [[11, -0.3], [2, -2.0]]]
    assert near_tie(PLAIN, [5, 7, 4, 3], top2)  # plain took the first listed, EAGLE the second
    top2[2] = [[4, -1.0], [9, -1.0]]
    assert near_tie(PLAIN, [5, 7, 4, 3], top2)  # the top-k's order broke the tie the other way


def test_a_gap_past_one_bf16_step_is_a_real_difference():
    top2 = [[[5, -0.1], [6, -3.0]], [[7, -0.5], [8, -0.5 - NEAR_TIE - 0.01]], [[9, -1.0], [4, -1.2]]]
    assert not near_tie(PLAIN, [5, 8, 1], top2)
    top2[1][1][1] = -0.5 - NEAR_TIE
    assert near_tie(PLAIN, [5, 8, 1], top2)


def test_a_token_outside_plain_decodings_record_is_a_real_difference():
    top2 = [[[5, -0.1], [6, -0.1]], [[7, -0.2], [8, -2.5]]]
    assert not near_tie(PLAIN, [3, 7], top2)


def test_a_third_token_within_one_step_of_the_likeliest_is_a_tie_and_past_it_is_not():
    top = [[[5, -2.10], [6, -2.20], [3, -2.22], [4, -2.40]]]
    assert near_tie(PLAIN, [3], top)  # three tokens within one rounding step: any of them may be taken
    assert not near_tie(PLAIN, [4], top)  # recorded, but 0.3 below the likeliest
    top[0] = [[6, -2.10], [5, -2.20], [3, -2.22]]
    assert near_tie(PLAIN, [3], top)  # plain itself took the second listed (a tie the other way)
    top[0] = [[6, -2.00], [5, -2.20], [3, -2.22]]
    assert not near_tie(PLAIN, [3], top)  # plain's own token is past one step from the likeliest: not a tie


def test_equal_tokens_or_no_record_of_the_step_are_not_a_near_tie():
    assert not near_tie(PLAIN, list(PLAIN), [])  # nothing parted: the caller compares equality first
    assert not near_tie(PLAIN, [5, 8], [[[5, -0.1], [6, -3.0]]])  # the step that parted has no record
    assert not near_tie(PLAIN, [5, 8], [[[5, -0.1], [6, -3.0]], [[7, -0.1]]])  # one token recorded, not two

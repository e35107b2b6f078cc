"""Exercise ccq-ex-allgather: the largest degree at which a quantised all-gather pays."""

from icml26 import cocoquant as cq

OK_FORMAT = False
name = "ccq-ex-allgather"
points = 2


def test_against_the_byte_counts(largest_useful_degree):
    def cheaper(p, bits, width, tokens=8):
        gather = (p - 1) * cq.payload_bytes(tokens, width, f"c{bits}")
        ring = 2 * (p - 1) / p * cq.payload_bytes(tokens, width, "c16")
        return gather < ring

    for bits in (8, 4):
        for width in (64, 4096):
            p = largest_useful_degree(bits, width)
            assert cheaper(p, bits, width), (bits, width, p)
            assert not cheaper(p + 1, bits, width), (bits, width, p)


def test_known_values(largest_useful_degree):
    assert largest_useful_degree(8, 4096) == 3
    assert largest_useful_degree(4, 4096) == 7

"""Exercise umem-ex-threshold: when the source-only reward starts to prefer shortcuts."""

import icml26.umem as um

OK_FORMAT = False
name = "umem-ex-threshold"
points = 3


def test_threshold_separates_the_two_regimes(source_prefers_shortcut, shortcut_threshold):
    world = um.make_world(seed=5)
    query = int(world.train[3])
    b_star = shortcut_threshold(world, query)
    assert 0.0 < b_star < 6.0
    assert source_prefers_shortcut(b_star + 0.3, world, query)
    assert not source_prefers_shortcut(max(0.0, b_star - 0.3), world, query)
    assert not source_prefers_shortcut(0.0, world, query), "a worthless shortcut never wins"

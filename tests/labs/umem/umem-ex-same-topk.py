"""Exercise umem-ex-same-topk: the neighbourhood lemma guarantees identical retrieval."""

import numpy as np

OK_FORMAT = False
name = "umem-ex-same-topk"
points = 3


def test_guarantee_is_sound_and_not_vacuous(same_topk_guaranteed):
    rng = np.random.default_rng(17)
    fired = 0
    for _ in range(2000):
        keys = rng.normal(size=(8, 5))
        keys /= np.linalg.norm(keys, axis=1, keepdims=True)
        e1 = rng.normal(size=5)
        e1 /= np.linalg.norm(e1)
        e2 = e1 + 0.03 * rng.normal(size=5)
        e2 /= np.linalg.norm(e2)
        k = int(rng.integers(1, 4))
        if same_topk_guaranteed(e1, e2, keys, k):
            fired += 1
            assert set(np.argsort(-(keys @ e1))[:k]) == set(np.argsort(-(keys @ e2))[:k])
    assert fired > 200, "the guarantee should apply often for close queries"
    e = np.array([1.0, 0.0])
    far = np.array([0.0, 1.0])
    keys = np.array([[1.0, 0.0], [0.0, 1.0]])
    assert not same_topk_guaranteed(e, far, keys, 1), "far-apart queries get no guarantee"

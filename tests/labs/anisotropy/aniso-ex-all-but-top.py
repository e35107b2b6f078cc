"""Exercise aniso-ex-all-but-top: centre and project out the top principal directions."""

import numpy as np

OK_FORMAT = False
name = "aniso-ex-all-but-top"
points = 2


def test_result_is_centred_and_orthogonal_to_the_top_directions(remove_top_directions, rng):
    H = rng.standard_normal((300, 9)) * np.linspace(0.2, 3.0, 9) + 4.0
    centred = H - H.mean(axis=0)
    assert np.allclose(remove_top_directions(H, 0), centred)
    top = np.linalg.svd(centred, full_matrices=False)[2][:3]
    cleaned = np.asarray(remove_top_directions(H, 3))
    assert cleaned.shape == H.shape
    assert np.allclose(cleaned.mean(axis=0), 0, atol=1e-10)
    assert np.allclose(cleaned @ top.T, 0, atol=1e-9)
    remaining = np.linalg.svd(cleaned, compute_uv=False)[:6]
    assert np.allclose(remaining, np.linalg.svd(centred, compute_uv=False)[3:9])

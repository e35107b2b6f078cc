"""Exercise rita-ex-eot: an adaptive attack on the OT reading of the views."""

import torch

from icml26 import rita

OK_FORMAT = False
name = "rita-ex-eot"
points = 3
forbid = ("icml26.rita.ot_pgd",)  # the exercise asks for one's own attack


def test_ot_pgd_stays_in_ball_and_raises_the_ot_margin(ot_pgd):
    x_train, y_train, x, y = rita.load_digit_split(300, 32, 3)
    model = rita.train_mini_clip(x_train, y_train, epochs=2, seed=3)
    eps = 0.1
    adv = ot_pgd(model, x, y, eps, n_views=4, steps=3, seed=1)
    assert adv.shape == x.shape
    assert float((adv - x).abs().max()) <= eps + 1e-6
    assert float(adv.min()) >= 0 and float(adv.max()) <= 1
    assert float((adv - x).abs().max()) > 0.5 * eps  # it moved

    def ot_margin(images):
        views = rita.make_views(images, 16, generator=torch.Generator().manual_seed(9))
        d = rita.ot_distances(rita.encode_views(model, views).features, model.text_features())
        true = d.gather(1, y[:, None])[:, 0]
        other = d.scatter(1, y[:, None], float("inf")).min(1).values
        return float((true - other).mean())

    assert ot_margin(adv) > ot_margin(x)

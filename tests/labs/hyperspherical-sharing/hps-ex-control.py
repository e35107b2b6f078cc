"""Exercise hps-ex-control: HPS's advantage over FuPS+ID shrinks without a scale conflict."""

import numpy as np

from icml26 import hyperspherical_sharing as hs

OK_FORMAT = False
name = "hps-ex-control"
points = 2


def test_advantage_larger_with_conflict(hps_advantage):
    conflict = np.asarray(hps_advantage(hs.CONFLICT_GAINS, 1))
    control = np.asarray(hps_advantage((1.0,) * 4, 1))
    assert conflict.shape == (4,) and control.shape == (4,)
    assert conflict.mean() > control.mean()
    assert conflict.mean() > 0

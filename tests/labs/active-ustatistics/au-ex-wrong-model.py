"""Exercise au-ex-wrong-model: a badly wrong uncertainty model, and the uniform guard."""

from icml26 import active_ustatistics as au

OK_FORMAT = False
name = "au-ex-wrong-model"
points = 2


def test_reversed_model_costs_efficiency_and_tau_limits_the_damage(reversed_model_study,
                                                                   submission):
    design = au.SyntheticDesign(heteroscedastic=True)
    world = au.synthetic_worlds(design, [au.GINI], n_train=800, n_pilot=400, n_pool=10_000,
                                seed=4)[au.GINI.name]
    table = submission.evaluate(
        "table = reversed_model_study(world, (0.05, 0.5), replicates=150, seed=5)\n"
        "{column: table[column].to_dict() for column in ('mse_ratio', 'coverage')}",
        world=world)
    ratios, coverage = table["mse_ratio"], table["coverage"]
    assert ratios[0.05] > ratios[0.5] > 1.2, f"MSE ratios by tau: {ratios}"
    assert coverage[0.5] >= 0.8, "the guarded rule should still cover"
    assert coverage[0.05] < coverage[0.5] + 0.02

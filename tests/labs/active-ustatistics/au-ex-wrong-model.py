"""Exercise au-ex-wrong-model: a badly wrong uncertainty model, and the uniform guard."""

OK_FORMAT = False
name = "au-ex-wrong-model"
points = 2


def test_reversed_model_costs_efficiency_and_tau_limits_the_damage(reversed_model_study):
    from icml26 import active_ustatistics as au

    design = au.SyntheticDesign(heteroscedastic=True)
    world = au.synthetic_worlds(design, [au.GINI], n_train=800, n_pilot=400, n_pool=10_000,
                                seed=4)[au.GINI.name]
    table = reversed_model_study(world, (0.05, 0.5), replicates=150, seed=5)
    ratios = table["mse_ratio"]
    assert ratios.loc[0.05] > ratios.loc[0.5] > 1.2, f"MSE ratios by tau: {ratios.to_dict()}"
    assert table.loc[0.5, "coverage"] >= 0.8, "the guarded rule should still cover"
    assert table.loc[0.05, "coverage"] < table.loc[0.5, "coverage"] + 0.02

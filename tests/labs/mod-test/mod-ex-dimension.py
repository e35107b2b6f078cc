"""Exercise mod-ex-dimension: power of MMD and MOD against the dimension."""

OK_FORMAT = False
name = "mod-ex-dimension"
points = 2


def test_mod_power_grows_with_dimension(power_by_dimension):
    rates = power_by_dimension((2, 200), 1.1, trials=30, seed=1)
    assert set(rates) == {2, 200}, "return one entry per dimension"
    assert rates[200]["mod"] > rates[2]["mod"] + 0.3, f"MOD power should rise with d: {rates}"
    assert rates[200]["mod"] > rates[200]["mmd"], f"MOD should beat MMD at d = 200: {rates}"

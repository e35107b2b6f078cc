"""Exercise dt2-ex-wrong-labels: DT² follows its labels, right or wrong."""

OK_FORMAT = False
name = "dt2-ex-wrong-labels"
points = 3


def test_reversed_labels_rank_worse(label_accuracy_gap):
    acc_true, acc_reversed = label_accuracy_gap(1)
    assert 0.0 <= acc_reversed < acc_true <= 1.0

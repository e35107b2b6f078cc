import random

import numpy as np
import pytest
import torch

from icml26.core import (
    Timer,
    check_count,
    check_positive,
    check_tier,
    configure_threads,
    get_device,
    glue_number,
    glue_text,
    glue_value,
    one_thread,
    set_seed,
    show_source,
    tier_settings,
)


def _draws():
    return random.random(), np.random.rand(), torch.rand(1).item()


def test_set_seed_repeats_every_generator():
    rng_a = set_seed(7)
    first = (*_draws(), rng_a.normal())
    rng_b = set_seed(7)
    assert (*_draws(), rng_b.normal()) == first
    set_seed(8)
    assert _draws() != first[:3]


@pytest.mark.parametrize("bad", [-1, 1.5, "3", True])
def test_set_seed_rejects_bad_seeds(bad):
    with pytest.raises((TypeError, ValueError)):
        set_seed(bad)


def test_get_device():
    assert get_device("cpu").type == "cpu"
    assert get_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="device"):
        get_device("tpu")


def test_tier_settings_picks_and_falls_back():
    settings = {"smoke": {"n": 10}, "book": {"n": 100}}
    assert tier_settings("smoke", **settings) == {"n": 10}
    assert tier_settings("full", **settings) == {"n": 100}
    assert tier_settings("full", **settings, full={"n": 1000}) == {"n": 1000}
    with pytest.raises(ValueError, match="unknown tier"):
        tier_settings("huge", **settings)
    with pytest.raises(ValueError, match="required"):
        tier_settings("book", book={"n": 1})
    with pytest.raises(ValueError, match="unknown tiers"):
        tier_settings("book", **settings, fast={"n": 1})
    assert check_tier("book") == "book"


def test_timer_measures_elapsed_time():
    with Timer() as timer:
        sum(range(10**5))
    assert 0 < timer.seconds < 5


def test_configure_threads_sets_torch_and_blas_pools(monkeypatch):
    from threadpoolctl import threadpool_info

    monkeypatch.setenv("ICML26_THREADS", "2")
    monkeypatch.setenv("ICML26_BLAS_THREADS", "1")
    assert configure_threads() == 2 and torch.get_num_threads() == 2
    blas = [pool for pool in threadpool_info() if pool["user_api"] == "blas"]
    assert blas and all(pool["num_threads"] == 1 for pool in blas)
    monkeypatch.setenv("ICML26_THREADS", "0")
    with pytest.raises(ValueError, match="positive"):
        configure_threads()


def test_glue_number_rejects_non_numbers():
    with pytest.raises(TypeError, match="real number"):
        glue_number("name", "0.5")
    assert glue_number("name", np.float32(0.25)) == 0.25
    with pytest.raises(TypeError, match="string"):
        glue_text("name", [1, 2])
    assert glue_text("name", "1, 2") == "1, 2"


@pytest.mark.parametrize("value", [0.123456, 3.0, "1, 2"])
@pytest.mark.parametrize("display", [False, True])
def test_glue_writes_the_output_myst_nb_glue_writes(monkeypatch, value, display):
    """The book glues without importing myst-nb's glue module (seconds per kernel); the output
    must stay what myst-nb's own ``glue`` writes, since its glue role reads it."""
    import IPython.display
    from myst_nb.ext import glue as myst_glue

    shown = []

    def record(*objects, **kwargs):
        shown.append((objects, kwargs))

    monkeypatch.setattr(IPython.display, "display", record)
    monkeypatch.setattr(myst_glue, "ipy_display", record)
    glue = glue_number if isinstance(value, float) else glue_text
    glue("core_test_oracle", value, display=display)
    myst_glue.glue("core_test_oracle", float(value) if isinstance(value, float) else value,
                   display=display)
    ours, theirs = shown
    assert ours == theirs
    assert ours[1]["metadata"]["scrapbook"]["name"] == "core_test_oracle"


def test_glue_value_formats_what_was_glued_as_the_glue_role_would():
    glue_number("core_test_ratio", 0.123456)
    assert glue_value("core_test_ratio", ".3f") == "0.123"
    assert glue_value("core_test_ratio", ".1%") == "12.3%"
    assert glue_value("core_test_ratio") == "0.123456"
    glue_text("core_test_list", "1, 2")
    assert glue_value("core_test_list") == "1, 2"
    assert "run the cells above" in glue_value("core_test_never_glued", ".2f")
    with pytest.raises(TypeError, match="strings"):
        glue_value("core_test_ratio", 3)


def test_show_source_renders_a_python_block():
    block = show_source(set_seed).data
    assert block.startswith("```python\ndef set_seed(") and block.endswith("```")
    with pytest.raises(TypeError, match="cannot show"):
        show_source(3)


def test_shared_validators():
    assert check_count(3, "n", 1) == 3 and check_count(np.int64(0), "seed") == 0
    with pytest.raises(ValueError, match="n must be at least 2, got 1"):
        check_count(1, "n", 2)
    for bad in (True, 2.0, "2"):
        with pytest.raises(TypeError, match="n must be an integer"):
            check_count(bad, "n")
    assert check_positive(0.5, "h") == 0.5
    for bad in (0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="h must be positive and finite"):
            check_positive(bad, "h")
    with pytest.raises(TypeError, match="h must be a real number"):
        check_positive(True, "h")


def test_one_thread_restores_the_thread_count():
    before = torch.get_num_threads()
    with one_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), one_thread():
        raise RuntimeError("restored even on error")
    assert torch.get_num_threads() == before

import numpy as np
import pytest
from sklearn.linear_model import LinearRegression

from ppprof.fit.crossval import cross_validate, cv_splits
from ppprof.fit.forms import Unfittable, ineligible
from ppprof.fit.least_squares import fit_model, fit_trimmed
from ppprof.fit.regress import condition_number, fit_candidates
from ppprof.fit.synthetic import SyntheticProbes, make_samples
from ppprof.policy.rule import LatencyModel

PREFIX_TRUE = LatencyModel("prefix", a=2e-7, b=0.01, c=5.0, g=4e-4)
QUAD_TRUE = LatencyModel("quadratic", a=3e-7, b=0.01, c=5.0)


def arrays(frame):
    return (frame.prefix_len.to_numpy(), frame.chunk_size.to_numpy(), frame.stage0_latency_ms.to_numpy())


def prefix_frame(model=PREFIX_TRUE, noise=0.01, **kw):
    return make_samples(
        model,
        SyntheticProbes(
            base_chunk_size=4096,
            prefixes=[0, 8192, 32768, 65536],
            chunk_sizes=[512, 1024, 2048, 4096],
            noise=noise,
            **kw,
        ),
    )


def test_prefix_fit_recovers_coefficients():
    got = fit_model("prefix", *arrays(prefix_frame()))
    for key in ("a", "b", "c", "g"):
        want = getattr(PREFIX_TRUE, key)
        assert abs(getattr(got, key) - want) <= 0.1 * want, f"{key=} {got=}"


def test_quadratic_fit_recovers_coefficients():
    L, x, y = arrays(make_samples(QUAD_TRUE, SyntheticProbes(base_chunk_size=8192, noise=0.005)))
    got = fit_model("quadratic", L[1:], x[1:], y[1:])
    assert abs(got.a - QUAD_TRUE.a) <= 0.05 * QUAD_TRUE.a, f"{got=}"
    assert abs(got.b - QUAD_TRUE.b) <= 0.05 * QUAD_TRUE.b, f"{got=}"
    assert got.g == 0.0


def test_quadratic_clamps_negative_b_and_rejects_non_positive_a():
    l = np.arange(1, 20, dtype=float) * 100
    zeros = np.zeros_like(l, dtype=np.int64)
    got = fit_model("quadratic", zeros, l.astype(np.int64), 1e-4 * l**2 - 0.01 * l + 50)
    assert got.b == 0.0 and got.a == pytest.approx(1e-4), f"{got=}"
    with pytest.raises(Unfittable, match="a = .* <= 0"):
        fit_model("quadratic", zeros, l.astype(np.int64), 0.5 * l + 3 - 1e-5 * l**2)


def test_prefix_negative_term_is_dropped_and_refitted_not_clamped():
    truth = LatencyModel("prefix", a=2e-7, b=0.012, c=5.0, g=0.0)
    frame = prefix_frame(truth, noise=0.0)
    L, x, y = arrays(frame)
    y = y - 3e-5 * L  # a negative prefix slope: g must go, the rest absorbs it
    got = fit_model("prefix", L, x, y)
    assert got.g == 0.0
    assert min(got.a, got.b, got.c) >= 0.0
    ref = LinearRegression().fit(np.column_stack([x, 2.0 * L * x + x * x]), y)
    assert got.b == pytest.approx(ref.coef_[0]) and got.a == pytest.approx(ref.coef_[1]), f"{got=}"
    assert got.c == pytest.approx(ref.intercept_)


def test_quadratic_fits_only_prefix_free_rows():
    frame = make_samples(
        QUAD_TRUE,
        SyntheticProbes(base_chunk_size=8192, prefixes=[4096, 16384, 65536], chunk_sizes=[1024, 8192], noise=0.005),
    )
    L, x, y = arrays(frame)
    got = fit_model("quadratic", L[1:], x[1:], y[1:])
    for key in ("a", "b", "c"):
        want = getattr(QUAD_TRUE, key)
        assert abs(getattr(got, key) - want) <= 0.05 * want, f"{key=} {got=}"
    garbage = np.where(L > 0, 1e6 * np.random.default_rng(1).random(len(y)), y)
    assert fit_model("quadratic", L[1:], x[1:], garbage[1:]) == got  # prefixed rows are not fitted
    pred = got.chunk_latency_ms(L, x)  # ... but scored, with the planner's c + f(L+x) - f(L)
    assert np.max(np.abs(pred - y) / y) < 0.03, f"{np.max(np.abs(pred - y) / y)=}"


def test_quadratic_needs_8_prefix_free_rows():
    L = np.array([0] * 7 + [512, 1024, 2048, 4096] * 10)
    x = np.array([64, 128, 192, 256, 320, 384, 448] + [64] * 20 + [512] * 20)
    y = QUAD_TRUE.chunk_latency_ms(L, x)
    with pytest.raises(Unfittable, match=r"quadratic needs >= 8 prefix-free samples \(prefix_len == 0\), has 7"):
        fit_model("quadratic", L, x, y)
    fitted, failed = fit_candidates(L, x, y, "auto")
    assert set(fitted) == {"prefix", "pairs"} and "8 prefix-free" in failed["quadratic"]


def test_outliers_are_dropped_and_fit_survives():
    L, x, y = arrays(prefix_frame(num_outliers=6, seed=3))
    fitted, failed = fit_candidates(L[1:], x[1:], y[1:], "prefix")
    fit = fitted["prefix"]
    assert (~fit.fit_rows).sum() >= 6, f"{(~fit.fit_rows).sum()=}"
    assert abs(fit.model.a - PREFIX_TRUE.a) <= 0.1 * PREFIX_TRUE.a, f"{fit.model=}"
    assert fit.cv_mape < 0.04, f"{fit.cv_mape=}"  # every row held out, the 6 tripled ones included


def test_eligibility_messages():
    assert "3 distinct prefixes" in ineligible("prefix", np.array([0, 0, 10, 10]), np.array([1, 2, 1, 2]))
    assert "2 distinct chunk sizes" in ineligible("prefix", np.array([0, 5, 10]), np.array([1, 1, 1]))
    assert "has 7 of 8" in ineligible("quadratic", np.array([0] * 7 + [5]), np.arange(1, 9))
    assert ineligible("quadratic", np.zeros(8, dtype=int), np.arange(1, 9)) is None


def test_auto_prefers_the_prefix_model_when_prefix_work_is_real():
    L, x, y = arrays(prefix_frame())
    fitted, _ = fit_candidates(L[1:], x[1:], y[1:], "auto")
    quad, prefix = fitted["quadratic"], fitted["prefix"]
    # The quadratic fits its prefix-free rows well, but is scored on every held-out row, prefixed ones too.
    free = quad.fit_rows
    assert np.all(L[1:][free] == 0)
    fit_err = np.abs(quad.model.chunk_latency_ms(L[1:][free], x[1:][free]) - y[1:][free]) / y[1:][free]
    assert fit_err.mean() < 0.02, f"{fit_err.mean()=}"
    assert quad.cv_mape > 0.05 and quad.cv_mape > 5 * prefix.cv_mape, f"{quad.cv_mape=} {prefix.cv_mape=}"


def test_auto_on_quadratic_samples():
    frame = make_samples(
        QUAD_TRUE,
        SyntheticProbes(base_chunk_size=8192, prefixes=[4096, 16384, 65536], chunk_sizes=[1024, 8192], noise=0.01),
    )
    L, x, y = arrays(frame)
    fitted, failed = fit_candidates(L[1:], x[1:], y[1:], "auto")
    # c + f(L+x) - f(L) is the prefix form with g = 0: both models describe these samples, on the same rows.
    assert fitted["quadratic"].cv_mape < 0.015 and fitted["prefix"].cv_mape < 0.015, f"{fitted=}"
    L, x, y = arrays(make_samples(QUAD_TRUE, SyntheticProbes(base_chunk_size=8192)))
    fitted, failed = fit_candidates(L[1:], x[1:], y[1:], "auto")
    assert set(fitted) == {"quadratic"} and "prefix" in failed


def test_cv_scores_every_held_out_row_with_chunk_latency():
    L, x, y = arrays(prefix_frame(noise=0.02))
    L, x, y = L[1:], x[1:], y[1:]
    got = cross_validate(("quadratic", "prefix"), L, x, y)
    for name in ("quadratic", "prefix"):
        errors = np.full(len(y), np.nan)
        for train, test in cv_splits(L, 5):
            model, _ = fit_trimmed(name, L[train], x[train], y[train])
            errors[test] = np.abs(model.chunk_latency_ms(L[test], x[test]) - y[test]) / y[test]
        assert not np.isnan(errors).any()
        assert got[name] == pytest.approx(errors.mean(), rel=1e-12), name
        assert cross_validate((name,), L, x, y)[name] == got[name]
    free = [np.mean(L[test] == 0) for _, test in cv_splits(L, 5)]
    assert max(free) - min(free) < 0.05, f"{free=}"  # stratified: each fold has its share of prefix-free rows


def test_cross_validation_and_condition_number():
    L, x, y = arrays(prefix_frame(noise=0.0))
    assert cross_validate(("prefix",), L, x, y)["prefix"] < 1e-6
    assert cross_validate(("prefix",), L, x, y * (1 + 0.2 * np.sin(np.arange(len(y)))))["prefix"] > 0.05
    assert condition_number("prefix", L, x) < 100
    assert condition_number("prefix", np.zeros_like(L), x) == float("inf")  # an all-zero column
    assert condition_number("quadratic", L, x) < 100  # on its prefix-free rows


def test_the_band_splitter_never_trains_on_a_held_out_band():
    from ppprof.fit.crossval import band_splits

    prefix = np.array([0] * 10 + [512] * 6 + [2048] * 6 + [8192] * 6)
    splits = band_splits(prefix)
    assert len(splits) == 3
    for train, test in splits:
        held = set(prefix[test])
        assert len(held) == 1 and 0 not in held, f"{held=}"
        assert not held & set(prefix[train]), f"{held=}"
        assert sorted(np.concatenate([train, test]).tolist()) == list(range(len(prefix)))
    assert band_splits(np.array([0] * 5 + [512] * 5)) == []


def test_a_chunk_dependent_per_pair_cost_is_recovered_by_the_pairs_form_and_not_by_the_prefix_form():
    """Synthetic surface whose cost per query-key pair across the prefix grows with the chunk (h L x^2): the pairs
    form recovers its coefficients and predicts held-out prefix bands; the four-coefficient form cannot."""
    from ppprof.fit.crossval import band_splits, cross_validate
    from ppprof.fit.least_squares import fit_model

    truth = LatencyModel("pairs", a=1e-6, b=0.01, c=1.0, g=5e-5, h=4e-9)
    rng = np.random.default_rng(0)
    L = np.repeat([0, 512, 1172, 2681, 6135, 14040, 32128], 64)
    x = np.tile(np.linspace(64, 640, 8).astype(int), len(L) // 8)
    y = truth.chunk_latency_ms(L, x) * (1 + 0.01 * rng.standard_normal(len(L)))
    pairs = fit_model("pairs", L, x, y)
    for k in ("a", "b", "c", "g", "h"):
        assert abs(getattr(pairs, k) - getattr(truth, k)) <= 0.1 * getattr(truth, k), f"{k}: {pairs=}"
    held_out = cross_validate(("prefix", "pairs"), L, x, y, splits=band_splits(L))
    assert held_out["pairs"] < 0.02 < 0.05 < held_out["prefix"], f"{held_out=}"


def test_a_pair_cost_that_falls_with_the_chunk_is_recovered_while_the_latency_still_grows_with_the_chunk():
    """CPU attention's shape (measured on every committed CPU profile): a query-key pair across the prefix costs less
    in a larger chunk, h < 0. The pairs form recovers a negative h where a + h x stays >= 0 up to twice the largest
    chunk fitted; a surface that would need a steeper fall is fitted with h >= 0, never with a latency that falls
    with the chunk where a plan may go."""
    from ppprof.fit.least_squares import PAIR_HEADROOM, fit_model, pairs_hold

    rng = np.random.default_rng(1)
    L = np.repeat([0, 512, 1161, 2633, 5973, 13545, 30720], 64)
    x = np.tile(np.linspace(64, 2048, 16).astype(int), len(L) // 16)
    truth = LatencyModel("pairs", a=2.1e-6, b=0.011, c=1.8, g=1.3e-4, h=-2.9e-10)
    y = truth.chunk_latency_ms(L, x) * (1 + 0.01 * rng.standard_normal(len(L)))
    pairs = fit_model("pairs", L, x, y)
    assert pairs.h < 0 and abs(pairs.h - truth.h) <= 0.1 * abs(truth.h), f"{pairs=}"
    assert pairs_hold(pairs.a, pairs.h, x)
    top = PAIR_HEADROOM * x.max()
    grid = np.linspace(1, top, 200)
    for prefix in (0, 30720, 131072):  # increasing in x at every prefix, up to the headroom
        assert np.all(np.diff(pairs.chunk_latency_ms(prefix, grid)) > 0), prefix
    steep = LatencyModel("pairs", a=2.1e-6, b=0.011, c=1.8, g=1.3e-4, h=-1.5e-9)  # a + h x < 0 from x = 1400
    y = steep.chunk_latency_ms(L, x) * (1 + 0.01 * rng.standard_normal(len(L)))
    fitted = fit_model("pairs", L, x, y)
    assert fitted.h >= 0 and min(fitted.a, fitted.b, fitted.c, fitted.g) >= 0, f"{fitted=}"


def test_a_bounded_rule_on_a_concave_model_gives_the_largest_chunk_within_the_bound():
    """At a long prefix a pairs model with h < 0 is concave in the chunk (a + h L < 0): the bounded rule's chunk is
    still the largest multiple of the unit whose latency is within the bound, as a search over every multiple finds."""
    from ppprof.policy.bounded import bounded_sizes

    model = LatencyModel("pairs", a=2.1e-6, b=0.011, c=1.8, g=1.3e-4, h=-2.9e-10)
    unit, cap = 64, 4096
    prefix = np.array([0, 4096, 30720, 60000] * 3)
    bounds = np.array([5.0] * 4 + [40.0] * 4 + [400.0] * 4)
    got = bounded_sizes(model, bounds, np.full(len(prefix), cap), prefix, unit)
    for L, M, x in zip(prefix, bounds, got):
        sizes = np.arange(unit, cap + 1, unit)
        within = sizes[model.chunk_latency_ms(L, sizes) <= M]
        assert x == (within.max() if len(within) else unit), (L, M, x)


def test_the_chunk_range_splits_hold_out_the_smallest_and_largest_prefixed_chunks():
    from ppprof.fit.crossval import chunk_range_splits, held_out_splits

    prefix = np.array([0] * 6 + [512] * 6 + [2048] * 6)
    chunk = np.array([10, 20, 30, 40, 50, 60] * 3)
    (train_small, test_small), (train_large, test_large) = chunk_range_splits(prefix, chunk)
    assert sorted(set(chunk[test_small])) == [10, 20] and sorted(set(chunk[test_large])) == [50, 60]
    for train, test in ((train_small, test_small), (train_large, test_large)):
        assert (prefix[test] > 0).all() and not set(test) & set(train)
        assert not (np.isin(chunk[train], chunk[test]) & (prefix[train] > 0)).any()
    assert len(held_out_splits(prefix, chunk)) == 2, "two prefix bands: too few to hold one out"
    three = np.array([0] * 6 + [512] * 6 + [2048] * 6 + [8192] * 6)
    assert len(held_out_splits(three, np.array([10, 20, 30, 40, 50, 60] * 4))) == 3 + 2
